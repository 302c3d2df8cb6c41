"""Whisper quantization quality: a candidate (MLX's own 8- or 4-bit quantization of the control's
weights) against its control, per speech fixture, reported apart from parity.

The figures are computed by the oracle library in its venv (oracles/mlx-whisper/quality.py with
oracles/common/whisper_quality.py): every decode step's KL(control || candidate) of the
pre-filter logits with the candidate teacher-forced on the control's greedy tokens, whether
the two argmaxes agree, and each side's own greedy transcript. All runs are greedy at
temperature 0 (a one-entry ladder: no temperature fallback); every other transcribe option is
the profile's `defaults.options` (fp16 false on the CPU) or mlx-whisper's default. The word
errors are counted here from the two transcripts (harness/quality/whisper_metrics.py), the
control's as the reference.

The in-tree cross-check runs the same with the in-tree Whisper and compares the bits
(harness/quality/whisper_intree.py): `cross_check` is "equal", "differs: <fixture>: <what> at
<step>" (a parity failure) or "not run: <why>".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import HarnessError, RecordError
from harness.oracle.process import OracleProcess
from harness.paths import REPO_ROOT
from harness.quality.whisper_candidate import build_whisper_candidate
from harness.quality.whisper_intree import InTreePair, ModelHook, compare
from harness.quality.whisper_metrics import word_errors
from harness.timing import clock

__all__ = ["WhisperFixtureQuality", "build_whisper_candidate", "measure_whisper_pair"]

ORACLE = "mlx-whisper"
QUALITY_SCRIPT = "quality.py"
QUALITY_SEED = 0  # greedy decoding draws nothing; the oracle's spec still names a seed


@dataclass(frozen=True)
class WhisperFixtureQuality:
    """One fixture's figures for a (control, candidate) pair, as the oracle computed them."""

    fixture: str  # repo-relative path
    kl: np.ndarray  # float64 per decode step: KL(control || candidate), candidate teacher-forced
    top1_agree: np.ndarray  # bool per step: the two pre-filter argmaxes are equal
    control_text: str  # each side's own greedy transcript (free runs)
    candidate_text: str
    word_errors: int  # word-level edit distance of the candidate's transcript from the control's
    reference_words: int  # the control's word count
    cross_check: str  # "equal" | "differs: <where>" | "not run: <why>"

    @property
    def steps(self) -> int:
        return len(self.kl)

    @property
    def wer(self) -> float:
        return self.word_errors / self.reference_words if self.reference_words else float("nan")


def _fixture_ids(fixtures: list[Path]) -> dict[str, Path]:
    ids: dict[str, Path] = {}
    for path in fixtures:
        fid = re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).stem) or "fixture"
        if fid in ids:
            raise HarnessError(f"whisper quality: fixtures {ids[fid]} and {path} have the same name {fid!r}")
        ids[fid] = Path(path)
    return ids


def _repo_relative(path: Path) -> str:
    resolved = path.resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else str(path)


def _check_same_model(name: str, control_dir: Path, candidate_dir: Path) -> None:
    """A pair is one model twice: the same dimensions (vocabulary included) and tokenizer files."""
    from models.whisper.load import read_dimensions

    try:
        dims = {d: read_dimensions(d) for d in (control_dir, candidate_dir)}
    except (OSError, ValueError) as e:
        raise HarnessError(f"{name}: whisper quality pair: {e}") from None
    if dims[control_dir] != dims[candidate_dir]:
        raise HarnessError(
            f"{name}: control {control_dir} ({dims[control_dir]}) and candidate {candidate_dir} "
            f"({dims[candidate_dir]}) are not the same model"
        )

    def vocabulary(model_dir: Path) -> dict[str, bytes]:  # what models/whisper/tokenizer.py reads
        files = [*model_dir.glob("*.tiktoken"), model_dir / "vocabulary.txt", model_dir / "tokenizer.json"]
        return {p.name: p.read_bytes() for p in files if p.is_file()}

    ours, theirs = vocabulary(control_dir), vocabulary(candidate_dir)
    if ours != theirs:
        differ = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
        raise HarnessError(f"{name}: control {control_dir} and candidate {candidate_dir} differ in {differ}")


def quality_options(profile: Any) -> dict[str, Any]:
    """The transcribe options of a quality run: the profile's defaults, greedy at temperature 0."""
    options = dict(profile.defaults.options) | {"temperature": 0.0}
    for key in ("beam_size", "best_of", "patience"):
        if options.get(key) is not None:
            raise HarnessError(f"{profile.name}: defaults.options.{key}: quality runs are greedy, without {key}")
    if options.get("fp16"):
        raise HarnessError(f"{profile.name}: defaults.options.fp16: quality runs compute in float32 (fp16 false)")
    return options


def run_oracle(
    control_dir: Path, candidate_dir: Path, fixtures: dict[str, Path], options: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Launch the quality entry script in the mlx-whisper venv; its record per fixture id."""
    process = OracleProcess(ORACLE)
    with clock.phase("venv"):
        process.check_versions()
    job = {
        "control_dir": str(control_dir),
        "candidate_dir": str(candidate_dir),
        "scenarios": [
            {"id": fid, "kind": "transcribe", "audio": str(path.resolve()), "options": options, "seed": QUALITY_SEED}
            for fid, path in fixtures.items()
        ],
    }
    with clock.phase("oracle quality"), process.run(QUALITY_SCRIPT, job) as out:
        try:
            data = json.loads((out / "result.json").read_text())
            process.check_environment(data.get("environment", {}))
            records = data["fixtures"]
            for fid in fixtures:
                for name in ("kl", "control_top1", "candidate_top1"):
                    records[fid][name] = np.load(out / f"{fid}.{name}.npy", allow_pickle=False)
        except (OSError, ValueError, KeyError) as e:
            raise RecordError(f"oracle {ORACLE} quality output in {out} is unreadable: {e}") from None
    return records


def measure_whisper_pair(
    *,
    profile: Any,
    control_dir: Path,
    candidate_dir: Path,
    fixtures: list[Path],
    progress: Callable[[str], None] | None = None,
    cross_check: bool = True,
    candidate_hook: ModelHook | None = None,
) -> list[WhisperFixtureQuality]:
    """The pair's figures per fixture, computed by the oracle; with `cross_check` the in-tree
    Whisper computes them too and must agree bit for bit. `progress` gets one line per stage;
    `candidate_hook` changes the in-tree candidate after loading (a test's perturbation)."""
    say = progress or (lambda message: None)
    control_dir, candidate_dir = Path(control_dir), Path(candidate_dir)
    if control_dir.resolve() == candidate_dir.resolve():
        raise HarnessError(f"{profile.name}: the candidate {candidate_dir} is the control itself")
    _check_same_model(profile.name, control_dir, candidate_dir)
    ids = _fixture_ids(fixtures)
    options = quality_options(profile)
    say(f"{profile.name}: oracle {ORACLE}: {candidate_dir.name} against {control_dir.name}, {len(ids)} fixture(s)")
    records = run_oracle(control_dir, candidate_dir, ids, options)

    pair, not_run = None, ""
    if cross_check:
        try:
            pair = InTreePair(control_dir, candidate_dir, candidate_hook)
        except HarnessError as e:
            not_run = f"not run: {e}"
    else:
        not_run = "not run: the caller asked for no in-tree cross-check"

    out = []
    for fid, path in ids.items():
        record = records[fid]
        verdict = not_run
        if pair is not None:
            say(f"{profile.name}: in-tree cross-check on {path.name}")
            with clock.phase("in-tree quality"):
                figures = pair.figures(path, options | {"seed": QUALITY_SEED})
            verdict = compare(fid, figures, record)
        errors, words = word_errors(record["control"]["text"], record["candidate"]["text"])
        out.append(
            WhisperFixtureQuality(
                fixture=_repo_relative(path),
                kl=np.asarray(record["kl"], np.float32).astype(np.float64),
                top1_agree=np.asarray(record["control_top1"]) == np.asarray(record["candidate_top1"]),
                control_text=record["control"]["text"],
                candidate_text=record["candidate"]["text"],
                word_errors=errors,
                reference_words=words,
                cross_check=verdict,
            )
        )
    return out
