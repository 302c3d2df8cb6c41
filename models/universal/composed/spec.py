"""Compositions: the JSON-able description of one L2 runtime path, validated into dataclasses.

A composition is a dict with "kind" plus that kind's parameters (the names optiq and mlx-lm
use). Parsing is strict: an unknown key, a missing required key or a value of the wrong type
or range raises `CompositionError` naming the key and what was expected.

- "mixed_kv": per-layer KV quantization from optiq's kv_config.json list
  (`[{"layer_idx": 0, "bits": 8, "group_size": 64}, ...]`, group_size defaulting to 64, layers
  not listed stay unquantized) and `quantized_kv_start`.
- "streaming_kv": uniform `kv_bits` / `kv_group_size` / `quantized_kv_start`, converted one
  layer at a time (optiq.runtime.streaming_kv_quant).
- "fused_sdpa": the same uniform conversion, attention over the quantized cache tiled over
  the keys in tiles of `n_chunk` with an online softmax (optiq.runtime.fused_quant_sdpa).
- "rotating_quantized_kv": a sliding window of `max_kv_size` positions (`keep` never evicted)
  stored quantized (optiq.runtime.kv.RotatingQuantizedKVCache); with `quantized_kv_start`
  None the cache is quantized from the first token, otherwise a float RotatingKVCache is
  converted once it holds that many positions.
- "ngram_draft": prompt-lookup drafting (optiq.runtime.ngram_spec.ngram_generate_step with
  adaptive=False): `num_draft_tokens`, `ngram_min`, `ngram_max`, optional `kv_bits` with
  `kv_group_size` and `quantized_kv_start` (optiq's default 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.universal.quantized_cache import KV_BITS, KV_GROUP_SIZES

# mlx-lm's generate_step default; optiq's ngram_generate_step defaults to 0 instead.
MLX_LM_QUANTIZED_KV_START = 5000


class CompositionError(ValueError):
    """A composition dict that names an unknown kind or key, or holds a bad value."""


@dataclass(frozen=True)
class LayerKV:
    """One kv_config.json entry: layer `layer_idx` is quantized to `bits` in groups of `group_size`."""

    layer_idx: int
    bits: int
    group_size: int = 64


@dataclass(frozen=True)
class MixedKV:
    layers: tuple[LayerKV, ...]
    quantized_kv_start: int = MLX_LM_QUANTIZED_KV_START
    kind: str = "mixed_kv"

    def bit_map(self) -> dict[int, tuple[int, int]]:
        """layer index -> (bits, group_size); a layer listed twice keeps its last entry, as optiq's dict does."""
        return {entry.layer_idx: (entry.bits, entry.group_size) for entry in self.layers}


@dataclass(frozen=True)
class StreamingKV:
    kv_bits: int
    kv_group_size: int = 64
    quantized_kv_start: int = MLX_LM_QUANTIZED_KV_START
    kind: str = "streaming_kv"


@dataclass(frozen=True)
class FusedSDPA:
    kv_bits: int
    kv_group_size: int = 64
    quantized_kv_start: int = MLX_LM_QUANTIZED_KV_START
    n_chunk: int = 512
    kind: str = "fused_sdpa"


@dataclass(frozen=True)
class RotatingQuantizedKV:
    max_kv_size: int
    kv_bits: int
    keep: int  # required: RotatingKVCache defaults to 0, make_prompt_cache uses 4
    kv_group_size: int = 64
    quantized_kv_start: int | None = None  # None: quantized from the first token
    kind: str = "rotating_quantized_kv"


@dataclass(frozen=True)
class NgramDraft:
    num_draft_tokens: int = 8
    ngram_min: int = 3
    ngram_max: int = 3
    kv_bits: int | None = None
    kv_group_size: int = 64
    quantized_kv_start: int = 0
    kind: str = "ngram_draft"


Composition = MixedKV | StreamingKV | FusedSDPA | RotatingQuantizedKV | NgramDraft

KINDS: dict[str, type] = {
    "mixed_kv": MixedKV,
    "streaming_kv": StreamingKV,
    "fused_sdpa": FusedSDPA,
    "rotating_quantized_kv": RotatingQuantizedKV,
    "ngram_draft": NgramDraft,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(where: str, value: object, *, minimum: int = 0, choices: tuple[int, ...] | None = None) -> int:
    if not _is_int(value):
        raise CompositionError(f"{where}: expected an int, got {value!r} ({type(value).__name__})")
    if choices is not None and value not in choices:
        raise CompositionError(f"{where}: expected one of {choices}, got {value}")
    if value < minimum:
        raise CompositionError(f"{where}: expected an int >= {minimum}, got {value}")
    return value


def _keys(kind: str, raw: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    allowed = ("kind", *required, *optional)
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise CompositionError(
            f"composition {kind!r}: unknown key(s) {unknown}; expected {list(required)} and optionally {list(optional)}"
        )
    missing = [k for k in required if k not in raw]
    if missing:
        raise CompositionError(f"composition {kind!r}: missing required key(s) {missing}")


def _layers(raw: object) -> tuple[LayerKV, ...]:
    if not isinstance(raw, list) or not raw:
        raise CompositionError(
            "kv_config: expected a non-empty list of {layer_idx, bits, group_size} objects "
            f"(optiq's kv_config.json), got {raw!r}"
        )
    layers = []
    for i, entry in enumerate(raw):
        where = f"kv_config[{i}]"
        if not isinstance(entry, dict):
            raise CompositionError(f"{where}: expected an object with layer_idx, bits, group_size, got {entry!r}")
        unknown = sorted(set(entry) - {"layer_idx", "bits", "group_size"})
        if unknown:
            raise CompositionError(f"{where}: unknown key(s) {unknown}; expected layer_idx, bits, group_size")
        for key in ("layer_idx", "bits"):
            if key not in entry:
                raise CompositionError(f"{where}: missing required key {key!r}")
        layers.append(
            LayerKV(
                layer_idx=_int(f"{where}.layer_idx", entry["layer_idx"]),
                bits=_int(f"{where}.bits", entry["bits"], choices=KV_BITS),
                group_size=_int(f"{where}.group_size", entry.get("group_size", 64), choices=KV_GROUP_SIZES),
            )
        )
    return tuple(layers)


def parse_composition(raw: object) -> Composition:
    """Validate a composition dict into its dataclass; errors name the bad key and what was expected."""
    if isinstance(raw, tuple(KINDS.values())):
        return raw  # already parsed
    if not isinstance(raw, dict):
        raise CompositionError(f"composition: expected a dict with 'kind', got {type(raw).__name__}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise CompositionError(f"composition.kind: expected one of {sorted(KINDS)}, got {kind!r}")
    start_key = "quantized_kv_start"
    if kind == "mixed_kv":
        _keys(kind, raw, ("kv_config",), (start_key,))
        return MixedKV(
            layers=_layers(raw["kv_config"]),
            quantized_kv_start=_int(start_key, raw.get(start_key, MLX_LM_QUANTIZED_KV_START)),
        )
    if kind in ("streaming_kv", "fused_sdpa"):
        optional = ("kv_group_size", start_key) + (("n_chunk",) if kind == "fused_sdpa" else ())
        _keys(kind, raw, ("kv_bits",), optional)
        common = {
            "kv_bits": _int("kv_bits", raw["kv_bits"], choices=KV_BITS),
            "kv_group_size": _int("kv_group_size", raw.get("kv_group_size", 64), choices=KV_GROUP_SIZES),
            start_key: _int(start_key, raw.get(start_key, MLX_LM_QUANTIZED_KV_START)),
        }
        if kind == "streaming_kv":
            return StreamingKV(**common)
        return FusedSDPA(**common, n_chunk=_int("n_chunk", raw.get("n_chunk", 512), minimum=1))
    if kind == "rotating_quantized_kv":
        _keys(kind, raw, ("max_kv_size", "kv_bits", "keep"), ("kv_group_size", start_key))
        keep = _int("keep", raw["keep"])
        max_kv_size = _int("max_kv_size", raw["max_kv_size"], minimum=keep + 1)
        start = raw.get(start_key)
        return RotatingQuantizedKV(
            max_kv_size=max_kv_size,
            kv_bits=_int("kv_bits", raw["kv_bits"], choices=KV_BITS),
            keep=keep,
            kv_group_size=_int("kv_group_size", raw.get("kv_group_size", 64), choices=KV_GROUP_SIZES),
            quantized_kv_start=None if start is None else _int(start_key, start),
        )
    _keys(kind, raw, (), ("num_draft_tokens", "ngram_min", "ngram_max", "kv_bits", "kv_group_size", start_key))
    ngram_min = _int("ngram_min", raw.get("ngram_min", 3), minimum=1)
    ngram_max = _int("ngram_max", raw.get("ngram_max", 3), minimum=ngram_min)
    bits = raw.get("kv_bits")
    return NgramDraft(
        num_draft_tokens=_int("num_draft_tokens", raw.get("num_draft_tokens", 8), minimum=1),
        ngram_min=ngram_min,
        ngram_max=ngram_max,
        kv_bits=None if bits is None else _int("kv_bits", bits, choices=KV_BITS),
        kv_group_size=_int("kv_group_size", raw.get("kv_group_size", 64), choices=KV_GROUP_SIZES),
        quantized_kv_start=_int(start_key, raw.get(start_key, 0)),
    )


def check_against_model(composition: Composition, n_layers: int, head_dim: int) -> None:
    """What only the model can tell: layer indices in range, group sizes dividing the head dim."""
    if isinstance(composition, MixedKV):
        for i, entry in enumerate(composition.layers):
            if entry.layer_idx >= n_layers:
                raise CompositionError(
                    f"kv_config[{i}].layer_idx: expected a layer index below {n_layers}, got {entry.layer_idx}"
                )
            if head_dim % entry.group_size:
                raise CompositionError(
                    f"kv_config[{i}].group_size: {entry.group_size} does not divide the head dim {head_dim}"
                )
        return
    group_size = composition.kv_group_size
    if getattr(composition, "kv_bits", None) is not None and head_dim % group_size:
        raise CompositionError(f"kv_group_size: {group_size} does not divide the head dim {head_dim}")
