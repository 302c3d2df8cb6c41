"""One pair measured: sides resolved and checked, the corpus cut into windows (refused when
shorter than one), the oracle's per-token arrays from the cache or a fresh oracle run, the
in-tree cross-check, the summaries and, where the profile states thresholds, a quality line.
Speech pairs go to the Whisper measurement layer (harness/quality/whisper.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import HARNESS_VERSION
from harness.artifacts.files import sha256_file
from harness.errors import HarnessError, ProfileError
from harness.implementations import SPEECH, sources_of
from harness.oracle.descriptor import descriptor, quality_oracle
from harness.paths import REPO_ROOT
from harness.profile import Profile
from harness.profile.quality import QualityPair, Thresholds
from harness.progress import progress
from harness.quality import store
from harness.quality.intree import CrossCheck, compare, encode_corpus, measure_intree
from harness.quality.metrics import LLMSummary, WhisperSummary, summarize_llm, summarize_whisper
from harness.quality.oracle import oracle_facts, run_oracle
from harness.quality.records import Measurement
from harness.quality.sides import ResolvedSide, check_pair_sides, resolve_side

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class QualityLine:
    """A pair's thresholds judged: only a pair that states thresholds has one."""

    status: str  # PASS | FAIL
    reasons: list[str]


@dataclass
class PairResult:
    pair: QualityPair
    oracle: str
    control: ResolvedSide
    candidate: ResolvedSide
    summary: LLMSummary | WhisperSummary
    cross_check: CrossCheck
    source: str  # "computed" | "cached" | "recomputed: <why>"
    settings: dict[str, Any]
    measurement: Measurement | None = None  # language models: the oracle's per-token arrays
    fixtures: list[Any] = field(default_factory=list)  # speech: WhisperFixtureQuality per fixture
    quality: QualityLine | None = None

    @property
    def ran(self) -> str:
        """What ran: "real", "twin", or "twin control / real candidate" style when they differ."""
        a, b = self.control.ran, self.candidate.ran
        return a if a == b else f"{a} control, {b} candidate"

    @property
    def parity_failed(self) -> bool:
        return self.cross_check.status == "differs"


def corpus_windows(n_tokens: int, context: int, stride: int, max_windows: int | None) -> list[int]:
    starts = list(range(0, n_tokens - context + 1, stride))
    return starts[:max_windows] if max_windows else starts


def judge(thresholds: Thresholds | None, summary: LLMSummary | WhisperSummary) -> QualityLine | None:
    if thresholds is None:
        return None
    reasons = []
    if thresholds.max_mean_kl is not None and not summary.kl.mean.value <= thresholds.max_mean_kl:
        reasons.append(f"mean KL {summary.kl.mean.value:.4g} > max_mean_kl {thresholds.max_mean_kl:g}")
    agree = summary.top1_agreement.value
    if thresholds.min_top1_agreement is not None and not agree >= thresholds.min_top1_agreement:
        reasons.append(f"top-1 agreement {agree:.4f} < min_top1_agreement {thresholds.min_top1_agreement:g}")
    if thresholds.max_wer is not None:
        if not isinstance(summary, WhisperSummary):
            reasons.append("max_wer applies to speech pairs only")
        elif not summary.wer <= thresholds.max_wer:
            reasons.append(f"WER {summary.wer:.4f} > max_wer {thresholds.max_wer:g}")
    return QualityLine("FAIL" if reasons else "PASS", reasons)


def measure_pair(
    profile: Profile,
    pair: QualityPair,
    *,
    on_progress: Progress | None = None,
    model_hook: Callable[[Any], None] | None = None,
) -> PairResult:
    """Measure one pair (from the cache where it can). `model_hook` perturbs the in-tree candidate
    (tests: the cross-check must fail); such a run never reads or writes a cached cross-check."""
    assert profile.quality is not None
    index = [p.id for p in profile.quality.pairs].index(pair.id)
    where = f"quality.pairs[{index}]"
    control = resolve_side(profile, pair.control, f"{where}.control")
    if profile.under_test.produces == SPEECH:
        return _measure_whisper(profile, pair, where, control, on_progress)
    candidate = resolve_side(profile, pair.candidate, f"{where}.candidate")
    check_pair_sides(where, control, candidate)
    corpus = profile.quality.corpus
    assert corpus is not None
    settings = corpus.settings() | {"chunk": corpus.chunk if pair.candidate.kv else None}
    kv = pair.candidate.kv.spec() if pair.candidate.kv else None
    _check_kv_against_model(candidate.model_dir, pair, where)
    text_path = REPO_ROOT / corpus.path
    ids = encode_corpus(control.model_dir, text_path.read_text(encoding="utf-8"))
    starts = corpus_windows(len(ids), corpus.context, settings["stride"], corpus.max_windows)
    if not starts:
        raise ProfileError(
            f"quality.corpus: {corpus.path} is {len(ids)} tokens of this tokenizer, shorter than one window of "
            f"context {corpus.context}: a longer corpus or a smaller context"
        )
    oracle = pair.oracle_of_llm
    key = {
        "format": store.QUALITY_FORMAT,
        "harness_version": HARNESS_VERSION,
        "pair": {"control": pair.control.identity(), "candidate": pair.candidate.identity()},
        "sides": {"control": control.provenance, "candidate": candidate.provenance},
        "corpus": {"path": corpus.path, "sha256": sha256_file(text_path), **settings},
        "oracle": oracle_facts(oracle),
    }

    def compute(entry: Path) -> Measurement:
        job = {
            "control_dir": str(control.model_dir),
            "candidate_dir": str(candidate.model_dir),
            "candidate_kv": kv,
            "corpus_path": str(text_path),
            **settings,
        }
        measurement = run_oracle(oracle, job, _phase(on_progress, f"oracle {oracle}"))
        store.save(entry, key, measurement)
        return measurement

    entry, measurement, source = _cached_or_computed(profile, pair, key, store.load, compute)
    if measurement.window_starts != starts:
        raise HarnessError(f"quality {pair.id}: the oracle cut other windows than the harness ({len(starts)} here)")
    check = _cross_check(entry, measurement, control, candidate, kv, ids, settings, model_hook, on_progress)
    summary = summarize_llm(measurement.arrays)
    return PairResult(
        pair=pair,
        oracle=oracle,
        control=control,
        candidate=candidate,
        summary=summary,
        cross_check=check,
        source=source,
        settings=settings | {"windows": len(starts), "corpus": corpus.path, "corpus_tokens": len(ids)},
        measurement=measurement,
        quality=judge(pair.thresholds, summary),
    )


def _cached_or_computed(
    profile: Profile,
    pair: QualityPair,
    key: dict[str, Any],
    load: Callable[[Path, dict[str, Any]], tuple[Any, str]],
    compute: Callable[[Path], Any],
) -> tuple[Path, Any, str]:
    """The pair's entry under `key`, what `load(entry, key)` finds there or else `compute(entry)` (which
    stores it), and where it came from: cached, computed or recomputed (with why the cache did not serve)."""
    entry = store.entry_dir(profile.name, pair.id, key)
    value, why = load(entry, key)
    if value is not None:
        return entry, value, "cached"
    if why != "not cached":
        progress.say(f"quality {profile.name}/{pair.id}: {why}: computing it again")
    return entry, compute(entry), "computed" if why == "not cached" else f"recomputed: {why}"


def _phase(on_progress: Progress | None, phase: str) -> Callable[[int, int], None] | None:
    if on_progress is None:
        return None
    return lambda done, total: on_progress(phase, done, total)


def _cross_check(entry, measurement, control, candidate, kv, ids, settings, model_hook, on_progress) -> CrossCheck:
    source_hash = store.intree_source_hash()
    if model_hook is None:
        cached = store.load_cross_check(entry, source_hash)
        if cached is not None:
            return cached
    intree = measure_intree(
        control.model_dir,
        candidate.model_dir,
        kv,
        ids,
        measurement.window_starts,
        settings["context"],
        settings["chunk"],
        model_hook=model_hook,
        on_window=_phase(on_progress, "in-tree"),
    )
    from harness.provenance import device_facts

    facts = device_facts()
    # On Metal mlx-lm's kl_div_loss is its own kernel, which the in-tree side does not copy.
    skip = ("kl",) if facts.backend == "gpu" and facts.os == "darwin" else ()
    check = compare(measurement, intree, skip)
    if model_hook is None:
        store.save_cross_check(entry, source_hash, check)
    return check


def _check_kv_against_model(model_dir: Path, pair: QualityPair, where: str) -> None:
    """A KV setting the oracle cannot run on this model: a group size not dividing the head dim,
    a kv_config layer the model does not have."""
    kv = pair.candidate.kv
    if kv is None:
        return
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if kv.bits is not None and head_dim % kv.group_size:
        raise ProfileError(f"{where}.candidate.kv.group_size: {kv.group_size} does not divide the head dim {head_dim}")
    composition = kv.composition()
    if composition is not None:
        from models.universal.composed import CompositionError, parse_composition
        from models.universal.composed.spec import check_against_model

        try:
            check_against_model(parse_composition(composition), config["num_hidden_layers"], head_dim)
        except CompositionError as e:
            raise ProfileError(f"{where}.candidate.kv: {e}") from None


def whisper_layer() -> Any:
    """harness/quality/whisper.py (the Whisper measurement layer), or a clear error naming it."""
    try:
        return importlib.import_module("harness.quality.whisper")
    except ModuleNotFoundError as e:
        if e.name != "harness.quality.whisper":
            raise
        raise HarnessError(
            "the Whisper measurement layer (harness/quality/whisper.py: build_whisper_candidate, "
            "measure_whisper_pair) is not in this tree yet: Whisper quality pairs cannot run"
        ) from None


def _measure_whisper(profile, pair, where, control, on_progress) -> PairResult:
    layer = whisper_layer()
    assert profile.quality is not None
    recipe = pair.candidate.requantize
    base = resolve_side(profile, dataclasses.replace(pair.candidate, requantize=None), f"{where}.candidate")
    check_pair_sides(where, control, base)
    candidate = base
    if recipe is not None:  # MLX's own quantization of the side's weights, built once by the layer
        candidate_dir = layer.build_whisper_candidate(
            base.model_dir, bits=recipe["bits"], group_size=recipe["group_size"]
        )
        identity = {"source": "requantized", "of": base.provenance, **recipe}
        candidate = ResolvedSide(
            Path(candidate_dir), {"identity": identity}, base.ran, pair.candidate.describe(profile.artifact)
        )
    fixtures = profile.quality.fixtures or sorted({s.audio for s in profile.scenarios if s.audio})
    key = {
        "format": store.QUALITY_FORMAT,
        "harness_version": HARNESS_VERSION,
        "pair": {"control": pair.control.identity(), "candidate": pair.candidate.identity()},
        "sides": {"control": control.provenance, "candidate": candidate.provenance},
        "fixtures": {f: sha256_file(REPO_ROOT / f) for f in fixtures},
        "oracle": speech_oracle_facts(layer),
    }

    def compute(entry: Path) -> list[Any]:
        results = layer.measure_whisper_pair(
            profile=profile,
            control_dir=control.model_dir,
            candidate_dir=Path(candidate.model_dir),
            fixtures=[REPO_ROOT / f for f in fixtures],
            progress=lambda message: progress.say(f"quality {profile.name}/{pair.id}: {message}"),
        )
        if not any(str(r.cross_check).startswith("differs") for r in results):  # a failure is never served again
            store.save_fixtures(entry, key, results)
        return results

    _entry, results, source = _cached_or_computed(profile, pair, key, store.load_fixtures, compute)
    summary = summarize_whisper(results)
    return PairResult(
        pair=pair,
        oracle=quality_oracle(SPEECH),
        control=control,
        candidate=candidate,
        summary=summary,
        cross_check=whisper_cross_check(results),
        source=source,
        settings={"fixtures": list(fixtures)},
        fixtures=results,
        quality=judge(pair.thresholds, summary),
    )


def speech_oracle_facts(layer: Any) -> dict[str, Any]:
    """What a speech pair's numbers depend on beyond its sides and fixtures: mlx-whisper's pins and
    quality script (with the common modules it loads), the device, and the measurement layer and
    in-tree Whisper sources (the cross-check is cached with the pair)."""
    from harness.oracle.sources import common_sources, script_sources
    from harness.oracle.venvs import oracle_pins_hash
    from harness.provenance import golden_key

    oracle = quality_oracle(SPEECH)
    script = descriptor(oracle).folder / "quality.py"
    layer_file = getattr(layer, "__file__", None)
    layer_sources = sorted(Path(layer_file).parent.glob("whisper*.py")) if layer_file else []
    record = REPO_ROOT / "harness" / "runners" / "whisper_record.py"  # the transcriptions' recorder
    sources = [*layer_sources, record, *sources_of(SPEECH)]
    return {
        "name": oracle,
        "pins_hash": oracle_pins_hash(oracle),
        "script_sha256": sha256_file(script) if script.is_file() else None,
        "common_sha256": {n: sha256_file(p) for n, p in common_sources(oracle, "quality.py").items()}
        if script.is_file()
        else {},
        "runs_sha256": {n: sha256_file(p) for n, p in script_sources(oracle, "quality.py").items()}
        if script.is_file()
        else {},
        "device": golden_key(oracle).as_dict(),
        "sources_sha256": {p.name: sha256_file(p) for p in sources if p.is_file()},
    }


def whisper_cross_check(results: list[Any]) -> CrossCheck:
    """One line for the pair from each fixture's: any difference is the pair's parity failure."""
    differs = [f"{r.fixture}: {r.cross_check}" for r in results if str(r.cross_check).startswith("differs")]
    if differs:
        return CrossCheck("differs", "; ".join(differs), {})
    not_run = [f"{r.fixture}: {r.cross_check}" for r in results if r.cross_check != "equal"]
    if not_run:
        return CrossCheck("not run", "; ".join(not_run), {})
    return CrossCheck("equal", f"{len(results)} fixtures", {})
