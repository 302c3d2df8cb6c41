"""A profile's `quality:` section: pairs of a control and a candidate of the same model, measured
apart from parity (docs/quality.md). Validated here into typed objects; what needs the
artifacts (tokenizers, the corpus in tokens, head dims) is checked when a pair runs
(harness/quality/pairs.py), still before anything is written.

    quality:
      corpus: {path: fixtures/corpus/kjv-genesis.txt, context: 512, stride: 512, chunk: 128}
      pairs:
        - id: kv8-g64
          control: {artifact: profile}
          candidate: {artifact: profile, kv: {bits: 8, group_size: 64, quantized_kv_start: 0}}
          thresholds: {max_mean_kl: 0.01, min_top1_agreement: 0.95}
    # speech profiles: `fixtures: [...]` (default: the profile's audio) instead of `corpus`;
    # candidate {artifact: profile, requantize: {bits: 8, group_size: 64}}; thresholds may add max_wer

A side is the profile's own artifact (`artifact: profile`), a pinned artifact mapping (the
profile `artifact:` keys, resolved by the same resolver), or `twin: <id>`, a registered twin
standing in for a control no pin names yet: honest only against a twin candidate, so a pair
whose candidate resolved to real weights refuses it when it runs.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harness.errors import ProfileError
from harness.implementations import LLM, SPEECH
from harness.oracle.descriptor import COMPOSED_ORACLE, quality_oracle
from harness.profile.draft import validate_requantize

KV_BITS = (2, 3, 4, 5, 6, 8)  # mx.quantize's affine bits: what mlx-lm's QuantizedKVCache takes
KV_GROUP_SIZES = (32, 64, 128)
# Compositions mlx-lm alone cannot run (its RotatingKVCache.to_quantized raises "NYI"; mixed
# precision is optiq's hook): measured in the mlx-optiq venv, mlx-lm with optiq's runtime.
OPTIQ_KINDS = ("rotating_quantized_kv", "mixed_kv")


@dataclass(frozen=True)
class KVSetting:
    """How the side's KV cache is kept while a window is fed chunk by chunk.

    - `bits` (+ `group_size`, `quantized_kv_start`): mlx-lm's QuantizedKVCache, converted after
      every model call once a layer holds `quantized_kv_start` positions (maybe_quantize_kv_cache);
    - `max_kv_size` alone: mlx-lm's RotatingKVCache(max_kv_size, keep);
    - `bits` + `max_kv_size`: optiq's RotatingQuantizedKVCache(max_kv_size, keep, group_size, bits);
    - `kv_config` (+ `quantized_kv_start`): optiq's mixed-precision KV (per-layer bits).
    """

    bits: int | None = None
    group_size: int = 64
    quantized_kv_start: int = 0
    max_kv_size: int | None = None
    keep: int = 4
    kv_config: list[dict[str, int]] | None = None

    def validate(self, where: str) -> None:
        if self.bits is not None and self.bits not in KV_BITS:
            raise ProfileError(
                f"{where}.bits: expected one of {list(KV_BITS)} (mlx-lm's QuantizedKVCache), got {self.bits}"
            )
        if self.group_size not in KV_GROUP_SIZES:
            raise ProfileError(f"{where}.group_size: expected one of {list(KV_GROUP_SIZES)}, got {self.group_size}")
        if self.quantized_kv_start < 0:
            raise ProfileError(f"{where}.quantized_kv_start: expected >= 0, got {self.quantized_kv_start}")
        if self.keep < 0:
            raise ProfileError(f"{where}.keep: expected >= 0 (positions never evicted), got {self.keep}")
        if self.max_kv_size is not None and self.max_kv_size <= self.keep:
            raise ProfileError(f"{where}.max_kv_size: expected more than keep={self.keep}, got {self.max_kv_size}")
        if self.kv_config is not None:
            if self.bits is not None or self.max_kv_size is not None:
                raise ProfileError(f"{where}.kv_config: per-layer bits stand alone (no bits, no max_kv_size)")
            from models.universal.composed import CompositionError, parse_composition

            try:
                parse_composition(self.composition())
            except CompositionError as e:
                raise ProfileError(f"{where}: {e}") from None
        elif self.bits is None and self.max_kv_size is None:
            raise ProfileError(
                f"{where}: expected bits, max_kv_size or kv_config (an empty KV setting is the plain cache)"
            )
        if self.max_kv_size is not None and self.bits is not None and self.quantized_kv_start:
            raise ProfileError(
                f"{where}.quantized_kv_start: a rotating quantized cache here is quantized from the first token; "
                "drop quantized_kv_start or max_kv_size"
            )

    @property
    def kind(self) -> str:
        if self.kv_config is not None:
            return "mixed_kv"
        if self.max_kv_size is not None:
            return "rotating_quantized_kv" if self.bits is not None else "rotating"
        return "quantized"

    @property
    def oracle(self) -> str:
        return COMPOSED_ORACLE if self.kind in OPTIQ_KINDS else quality_oracle(LLM)

    def composition(self) -> dict[str, Any] | None:
        """The L2 composition dict (models/universal/composed) of an optiq setting, else None."""
        if self.kv_config is not None:
            return {"kind": "mixed_kv", "kv_config": self.kv_config, "quantized_kv_start": self.quantized_kv_start}
        if self.kind == "rotating_quantized_kv":
            return {
                "kind": "rotating_quantized_kv",
                "max_kv_size": self.max_kv_size,
                "keep": self.keep,
                "kv_bits": self.bits,
                "kv_group_size": self.group_size,
            }
        return None

    def spec(self) -> dict[str, Any]:
        """What the oracle and the in-tree side are told (and what is hashed)."""
        return {"kind": self.kind} | {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        if self.kind == "mixed_kv":
            bits = sorted({c["bits"] for c in self.kv_config or []})
            return f"mixed KV {'/'.join(map(str, bits))}-bit, {len(self.kv_config or [])} layers"
        if self.kind == "rotating":
            return f"rotating KV {self.max_kv_size}"
        text = f"KV{self.bits} g{self.group_size}"
        return (
            f"rotating {text} window {self.max_kv_size}"
            if self.max_kv_size
            else f"{text} start {self.quantized_kv_start}"
        )


@dataclass(frozen=True)
class QualitySide:
    # "profile", or a pinned artifact mapping (made an ArtifactSpec by validate, so its own
    # errors name their key: a union of both types would say only "expected one of them").
    artifact: Any = None
    twin: str | None = None
    kv: KVSetting | None = None
    requantize: dict[str, int] | None = None  # speech: MLX's own nn.quantize of the side's weights

    def validate(self, where: str) -> None:
        from harness.profile import ArtifactSpec  # (this module is imported while that one loads)

        if isinstance(self.artifact, dict):
            names = {f.name for f in fields(ArtifactSpec)}
            unknown = sorted(set(self.artifact) - names)
            if unknown or "source" not in self.artifact:
                raise ProfileError(
                    f"{where}.artifact: unknown key(s) {unknown} or no 'source'; allowed: {sorted(names)}"
                )
            spec = ArtifactSpec(**self.artifact)
            spec.validate(f"{where}.artifact")
            object.__setattr__(self, "artifact", spec)
        elif self.artifact not in (None, "profile") and not isinstance(self.artifact, ArtifactSpec):
            raise ProfileError(
                f"{where}.artifact: expected 'profile' or a pinned artifact mapping, got {self.artifact!r}"
            )
        if (self.artifact is None) == (self.twin is None):
            raise ProfileError(f"{where}: give exactly one of 'artifact' (profile or a pinned mapping) and 'twin'")
        if self.requantize is not None:
            validate_requantize(self.requantize, where)
        if self.requantize is not None and self.kv is not None:
            raise ProfileError(f"{where}: requantize (speech weights) and kv (a language model's cache) do not mix")

    def identity(self) -> dict[str, Any]:
        """The side as asked for (a control equal to its candidate is refused on this)."""
        artifact = self.artifact if isinstance(self.artifact, str | None) else asdict(self.artifact)
        return {
            "artifact": artifact,
            "twin": self.twin,
            "kv": self.kv.spec() if self.kv else None,
            "requantize": self.requantize,
        }

    def describe(self, profile_artifact: Any = None) -> str:
        """What the side is, in a few words (`profile_artifact`: what `artifact: profile` names)."""
        artifact = profile_artifact if self.artifact == "profile" and profile_artifact is not None else self.artifact
        if self.twin:
            what = f"twin {self.twin}"
        elif isinstance(artifact, str | None):
            what = "profile artifact"
        elif artifact.source == "hub":
            what = f"{artifact.repo}@{(artifact.revision or '')[:7]}"
        else:
            what = f"{artifact.package}=={artifact.version}"
        if self.kv:
            what += f", {self.kv.describe()}"
        if self.requantize:
            what += f", requantized {self.requantize['bits']}-bit g{self.requantize['group_size']}"
        return what


@dataclass(frozen=True)
class Thresholds:
    """Explicit bounds: only a pair that states them gets a quality line that passes or fails."""

    max_mean_kl: float | None = None
    min_top1_agreement: float | None = None
    max_wer: float | None = None

    def validate(self, where: str) -> None:
        if all(v is None for v in asdict(self).values()):
            raise ProfileError(f"{where}: expected at least one of max_mean_kl, min_top1_agreement, max_wer")
        for name, value in asdict(self).items():
            if value is not None and value < 0:
                raise ProfileError(f"{where}.{name}: expected >= 0, got {value}")
        if self.min_top1_agreement is not None and self.min_top1_agreement > 1:
            raise ProfileError(
                f"{where}.min_top1_agreement: expected a fraction in [0, 1], got {self.min_top1_agreement}"
            )


@dataclass(frozen=True)
class QualityPair:
    id: str
    control: QualitySide
    candidate: QualitySide
    thresholds: Thresholds | None = None

    def validate(self, where: str) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.id):
            raise ProfileError(f"{where}.id: expected lowercase [a-z0-9_-], got {self.id!r}")
        if self.control.identity() == self.candidate.identity():
            raise ProfileError(
                f"{where}: the control is the candidate itself ({self.candidate.describe()}): nothing to compare"
            )
        if self.control.kv is not None:
            raise ProfileError(f"{where}.control.kv: the control keeps the plain cache; a KV setting is a candidate's")

    @property
    def oracle_of_llm(self) -> str:
        """The venv that measures a language-model pair: mlx-optiq for its compositions, else mlx-lm."""
        return self.candidate.kv.oracle if self.candidate.kv else quality_oracle(LLM)


@dataclass(frozen=True)
class CorpusSpec:
    """Teacher-forced windows of `context` tokens every `stride` tokens (default: `context`, as
    mlx-lm's eval_ppl cuts its data); a KV candidate's windows are fed `chunk` tokens at a time."""

    path: str
    context: int = 512
    stride: int | None = None
    chunk: int | None = None
    max_windows: int | None = None  # at most this many windows (a quick pass), else every one

    def validate(self, where: str) -> None:
        if not self.path.endswith(".txt") or self.path.startswith("/"):
            raise ProfileError(f"{where}.path: expected a .txt file relative to the repository, got {self.path!r}")
        if self.context < 2:
            raise ProfileError(f"{where}.context: expected >= 2 tokens (one input, one target), got {self.context}")
        if self.stride is not None and self.stride < 1:
            raise ProfileError(f"{where}.stride: expected >= 1, got {self.stride}")
        if self.chunk is not None and not 1 <= self.chunk < self.context - 1:
            raise ProfileError(
                f"{where}.chunk: expected 1 <= chunk < context - 1 = {self.context - 1} (the first chunk fills "
                f"the cache, the later ones attend to it), got {self.chunk}"
            )
        if self.max_windows is not None and self.max_windows < 1:
            raise ProfileError(f"{where}.max_windows: expected >= 1, got {self.max_windows}")

    def settings(self) -> dict[str, int | None]:
        return {
            "context": self.context,
            "stride": self.stride or self.context,
            "chunk": self.chunk,
            "max_windows": self.max_windows,
        }


@dataclass(frozen=True)
class QualitySpec:
    pairs: list[QualityPair]
    corpus: CorpusSpec | None = None
    fixtures: list[str] | None = None
    notes: list[str] = field(default_factory=list)

    def validate(self, where: str) -> None:
        if not self.pairs:
            raise ProfileError(f"{where}.pairs: expected at least one pair")
        seen = set()
        for i, pair in enumerate(self.pairs):
            if pair.id in seen:
                raise ProfileError(f"{where}.pairs[{i}].id: duplicate pair id {pair.id!r}")
            seen.add(pair.id)

    def pair(self, pair_id: str) -> QualityPair:
        for p in self.pairs:
            if p.id == pair_id:
                return p
        raise ProfileError(f"quality.pairs: no pair {pair_id!r}; known: {[p.id for p in self.pairs]}")


def check_quality(profile: Any) -> None:
    """What only the whole profile can tell: corpus vs fixtures by implementation, KV settings on
    a language model, requantize on speech, the corpus file on disk."""
    q: QualitySpec | None = profile.quality
    if q is None:
        return
    from harness.paths import REPO_ROOT

    speech = profile.under_test.produces == SPEECH
    if speech and q.corpus is not None:
        raise ProfileError(
            "quality.corpus: a speech profile is measured on audio fixtures ('fixtures'), not a text corpus"
        )
    if not speech and q.corpus is None:
        raise ProfileError("quality.corpus: a language-model profile needs a corpus {path, context, stride, chunk}")
    if not speech and q.fixtures is not None:
        raise ProfileError("quality.fixtures: audio fixtures are for speech profiles; a language model reads 'corpus'")
    if q.corpus is not None:
        corpus = (REPO_ROOT / q.corpus.path).resolve()
        if not corpus.is_file() or not corpus.is_relative_to(REPO_ROOT.resolve()):
            raise ProfileError(f"quality.corpus.path: {q.corpus.path!r} is not a file in the repository ({corpus})")
    for i, path in enumerate(q.fixtures or []):
        if not (REPO_ROOT / path).is_file():
            raise ProfileError(f"quality.fixtures[{i}]: {path!r} is not a file in the repository")
        from harness.profile.inputs import check_wav

        check_wav(REPO_ROOT / path, f"quality.fixtures[{i}]", path)
    for i, pair in enumerate(q.pairs):
        where = f"quality.pairs[{i}]"
        for side_name in ("control", "candidate"):
            side = getattr(pair, side_name)
            if speech and side.kv is not None:
                raise ProfileError(
                    f"{where}.{side_name}.kv: a KV setting is a language model's; Whisper sides requantize"
                )
            if not speech and side.requantize is not None:
                raise ProfileError(
                    f"{where}.{side_name}.requantize: language-model pairs compare pinned artifacts or KV settings"
                )
            allowed = ("hub", "pypi-ct2") if speech else ("hub", "pypi-gguf")
            if not isinstance(side.artifact, str | None) and side.artifact.source not in allowed:
                raise ProfileError(
                    f"{where}.{side_name}.artifact.source: {side.artifact.source!r} is not a "
                    f"{profile.under_test.name} artifact; expected one of {list(allowed)}"
                )
            if side.twin is not None:
                from harness.artifacts.twins import TWINS

                if side.twin not in TWINS:
                    raise ProfileError(f"{where}.{side_name}.twin: unknown twin {side.twin!r}; known: {sorted(TWINS)}")
        if not speech and pair.thresholds is not None and pair.thresholds.max_wer is not None:
            raise ProfileError(f"{where}.thresholds.max_wer: a word error rate is a speech pair's (transcripts)")
        kv = pair.candidate.kv
        if kv is not None and q.corpus is not None and q.corpus.chunk is None:
            raise ProfileError(
                f"{where}.candidate.kv: a KV candidate is fed in chunks (the first fills the cache, the later ones "
                "attend to it): set quality.corpus.chunk"
            )
        if (
            kv is not None
            and kv.max_kv_size is not None
            and q.corpus is not None
            and kv.max_kv_size >= q.corpus.context
        ):
            raise ProfileError(
                f"{where}.candidate.kv.max_kv_size: {kv.max_kv_size} >= the window ({q.corpus.context} tokens): "
                "the window never rotates, so this measures nothing a plain cache would not"
            )
