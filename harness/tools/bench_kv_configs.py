"""The KV cache configurations `bench-kv` measures, and the bytes per token each should take.

A configuration is what one benchmark process runs: the L1 options of greedy_steps /
mlx-lm's generate_step (kv_bits, kv_group_size, quantized_kv_start, max_kv_size) or an L2
composition (models.universal.composed, judged by mlx-optiq), plus which oracle can run the
same thing. `job` resolves it for one context length: the streaming conversion starts half
way through the decode, wherever the context ends.

The theoretical KV bytes per token are what the stored elements alone take: per layer
2 (K and V) x kv_heads x head_dim elements, each `dtype_bytes` when float, or bits/8 plus a
scale and a bias (in the cache dtype) per `group_size` elements when quantized (mx.quantize's
affine layout). Whatever a cache holds beyond that (blocks preallocated 256 positions at a
time, the zero tail a conversion quantizes along) is what the measured figure adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.errors import HarnessError

GROUP_SIZE = 64
ROTATING_WINDOW = 1024  # max_kv_size of the rotating configurations
ROTATING_KEEP = 4  # mlx-lm's make_prompt_cache keeps 4 (models.universal.rotating_cache.ROTATING_KEEP)
# The mixed-precision layout: first and last layer 8-bit, the ones between 4-bit (layers are
# named by index from the end too, so the same config fits any depth of at least 2).
MIXED_BITS_ENDS, MIXED_BITS_MIDDLE = 8, 4


@dataclass(frozen=True)
class LayerFormat:
    """How one layer stores K and V: float (`bits` None) or quantized in groups of `group_size`."""

    bits: int | None = None
    group_size: int = GROUP_SIZE


@dataclass(frozen=True)
class KVConfig:
    name: str
    tier: str  # "L1" (mlx-lm's own options) or "L2" (a composition mlx-optiq judges)
    oracle: str  # the oracle whose bench_kv.py runs the same configuration
    what: str  # one line for the table
    options: dict[str, Any] = field(default_factory=dict)  # L1: greedy_steps / generate_step keywords
    composition: dict[str, Any] | None = None  # L2: models.universal.composed's dict
    window: int | None = None  # rotating: at most this many positions held

    def job(self, context: int, steps: int) -> dict[str, Any]:
        """What a worker runs for `context` prompt tokens and `steps` decode steps (JSON-able)."""
        composition = dict(self.composition) if self.composition is not None else None
        if self.name == "streaming":
            assert composition is not None
            composition["quantized_kv_start"] = context + steps // 2  # converted mid-decode
        return {"name": self.name, "options": dict(self.options), "composition": composition}

    def layer_formats(self, n_layers: int) -> list[LayerFormat]:
        """Each layer's storage once the run has ended (streaming: converted by then)."""
        if self.name == "mixed":
            return [mixed_layer(i, n_layers) for i in range(n_layers)]
        bits = self.options.get("kv_bits")
        if self.composition is not None:
            bits = self.composition.get("kv_bits")
        group_size = (self.composition or self.options).get("kv_group_size", GROUP_SIZE)
        return [LayerFormat(bits, group_size)] * n_layers


def mixed_layer(index: int, n_layers: int) -> LayerFormat:
    ends = index in (0, n_layers - 1)
    return LayerFormat(MIXED_BITS_ENDS if ends else MIXED_BITS_MIDDLE, GROUP_SIZE)


def mixed_kv_config(n_layers: int) -> list[dict[str, int]]:
    """optiq's kv_config.json list for the mixed layout over `n_layers` layers."""
    formats = [mixed_layer(i, n_layers) for i in range(n_layers)]
    return [{"layer_idx": i, "bits": f.bits, "group_size": f.group_size} for i, f in enumerate(formats)]


def configs(n_layers: int) -> dict[str, KVConfig]:
    """Every configuration by name (the mixed one's kv_config needs the model's depth)."""
    g = {"kv_group_size": GROUP_SIZE}
    rotating_q4 = {"max_kv_size": ROTATING_WINDOW, "keep": ROTATING_KEEP, "kv_bits": 4, **g}
    return {
        c.name: c
        for c in (
            KVConfig("plain", "L1", "mlx-lm", "KVCache (float, 256-position blocks)"),
            KVConfig(
                "kv8",
                "L1",
                "mlx-lm",
                "kv_bits 8, g64, quantized_kv_start 0",
                {"kv_bits": 8, "quantized_kv_start": 0, **g},
            ),
            KVConfig(
                "kv4",
                "L1",
                "mlx-lm",
                "kv_bits 4, g64, quantized_kv_start 0",
                {"kv_bits": 4, "quantized_kv_start": 0, **g},
            ),
            KVConfig(
                "mixed",
                "L2",
                "mlx-optiq",
                f"mixed_kv: layers 0 and {n_layers - 1} 8-bit, the rest 4-bit, g64, quantized_kv_start 0",
                composition={"kind": "mixed_kv", "kv_config": mixed_kv_config(n_layers), "quantized_kv_start": 0},
            ),
            KVConfig(
                "streaming",
                "L2",
                "mlx-optiq",
                "streaming_kv: float, converted to 4-bit g64 at quantized_kv_start = context + steps/2",
                composition={"kind": "streaming_kv", "kv_bits": 4, **g},
            ),
            KVConfig(
                "rotating-q4",
                "L2",
                "mlx-optiq",
                f"rotating_quantized_kv: max_kv_size {ROTATING_WINDOW}, keep {ROTATING_KEEP}, 4-bit g64 from the start",
                composition={"kind": "rotating_quantized_kv", **rotating_q4},
                window=ROTATING_WINDOW,
            ),
            KVConfig(
                "rotating",
                "L1",
                "mlx-lm",
                f"RotatingKVCache (float), max_kv_size {ROTATING_WINDOW}, keep {ROTATING_KEEP}",
                {"max_kv_size": ROTATING_WINDOW},
                window=ROTATING_WINDOW,
            ),
        )
    }


# What `bench-kv` runs unless --configs says otherwise (the float rotating window is extra).
DEFAULT_CONFIGS = ("plain", "kv8", "kv4", "mixed", "streaming", "rotating-q4")


def parse_configs(text: str, n_layers: int) -> list[KVConfig]:
    """A comma-separated list of configuration names; an unknown name is an error naming the known ones."""
    known = configs(n_layers)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise HarnessError(f"--configs: expected a comma-separated list of {sorted(known)}, got {text!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise HarnessError(f"--configs: unknown configuration(s) {unknown}; expected some of {sorted(known)}")
    if len(set(names)) != len(names):
        raise HarnessError(f"--configs: a configuration is named twice in {text!r}")
    return [known[n] for n in names]


def theoretical_kv_bytes_per_token(formats: list[LayerFormat], kv_heads: int, head_dim: int, dtype_bytes: int) -> float:
    """Bytes one token's K and V take over all layers, by the storage formats alone (no padding)."""
    if kv_heads < 1 or head_dim < 1 or dtype_bytes < 1 or not formats:
        raise HarnessError(
            f"theoretical KV bytes: need layers, kv_heads, head_dim and dtype_bytes >= 1, got "
            f"{len(formats)} layers, {kv_heads}, {head_dim}, {dtype_bytes}"
        )
    total = 0.0
    for f in formats:
        if f.bits is None:
            per_element = float(dtype_bytes)
        else:
            if head_dim % f.group_size:
                raise HarnessError(
                    f"theoretical KV bytes: group size {f.group_size} does not divide head_dim {head_dim}"
                )
            per_element = f.bits / 8 + 2 * dtype_bytes / f.group_size  # packed bits + scale and bias per group
        total += 2 * kv_heads * head_dim * per_element
    return total


def theoretical_kv_bytes(
    config: KVConfig, tokens: int, n_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int
) -> dict[str, float]:
    """Theoretical bytes held after `tokens` tokens: per held token, per context token, in all."""
    per_token = theoretical_kv_bytes_per_token(config.layer_formats(n_layers), kv_heads, head_dim, dtype_bytes)
    held = min(tokens, config.window) if config.window else tokens
    total = per_token * held
    return {"bytes": total, "per_held_token": per_token, "per_context_token": total / tokens, "tokens_held": held}
