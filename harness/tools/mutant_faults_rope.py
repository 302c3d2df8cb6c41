"""Rope faults of `make mutants` (issue 53): one plausible slip per rope type of the universal
Llama (models/universal/rope.py), each killed on the rope twin built for that type
(profiles/llama-rope-<type>-mini.yaml, harness/artifacts/twins/llama_rope.py). Before those
twins every profile used the default rope, so each of these passed every gate: branch coverage
named the rope types no scenario walked."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from harness.tools.mutant_faults import Mutant, _setattr


def linear_scale_ignored() -> contextlib.AbstractContextManager[None]:
    """Linear rope scaling read but not applied: positions are not divided by the factor."""
    import mlx.nn as nn

    import models.universal.model as model  # imports make_rope by name

    make = model.make_rope

    def make_rope(config: Any) -> Any:
        if config.rope_type == "linear":  # the fault: scale 1 / factor in-tree
            return nn.RoPE(config.attention_head_dim, traditional=config.rope_traditional, base=config.rope_theta)
        return make(config)

    return _setattr(model, "make_rope", make_rope)


def dynamic_length_off_by_one() -> contextlib.AbstractContextManager[None]:
    """Dynamic NTK's sequence length counted one short (the new tokens' positions end at
    offset + n - 1): the base grows one position late."""
    import mlx.core as mx

    from models.universal.rope import DynamicNTKRoPE

    def call(self: Any, x: Any, offset: int = 0) -> Any:
        seq_len = max(x.shape[-2] + offset - 1, self.max_positions)  # the fault: no - 1 in-tree
        growth = (self.factor * seq_len / self.max_positions) - (self.factor - 1)
        base = self.base * growth ** (self.dims / (self.dims - 2))
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=base, scale=1.0, offset=offset)

    return _setattr(DynamicNTKRoPE, "__call__", call)


def llama3_blend_inverted() -> contextlib.AbstractContextManager[None]:
    """Llama 3's middle band blended the wrong way round: the stretched share multiplied by
    the factor instead of divided."""
    import mlx.core as mx

    import models.universal.rope as rope

    def llama3_freqs(dims: int, base: float, scaling: dict[str, Any]) -> Any:
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling.get("original_max_position_embeddings", 8192)
        freqs = base ** (mx.arange(0, dims, 2) / dims)
        wavelens = 2 * mx.pi * freqs
        freqs = mx.where(wavelens > old / low, freqs * factor, freqs)
        band = (wavelens > old / high) & (wavelens < old / low)
        smooth = (old / wavelens - low) / (high - low)
        return mx.where(band, freqs / ((1 - smooth) * factor + smooth), freqs)  # the fault: / factor

    return _setattr(rope, "llama3_freqs", llama3_freqs)


def yarn_mscale_ratio_inverted() -> contextlib.AbstractContextManager[None]:
    """YaRN's input scale the inverse ratio (mscale_all_dim's attention factor over mscale's)."""
    import models.universal.rope as rope

    freqs_and_mscale = rope.yarn_freqs_and_mscale

    def inverted(dims: int, base: float, scaling: dict[str, Any]) -> Any:
        freqs, mscale = freqs_and_mscale(dims, base, scaling)
        return freqs, 1.0 / mscale  # the fault

    return _setattr(rope, "yarn_freqs_and_mscale", inverted)


def longrope_mscale_log_of_max() -> contextlib.AbstractContextManager[None]:
    """LongRoPE's mscale with the log of the extended context where the original belongs."""
    import mlx.core as mx

    import models.universal.rope as rope

    def freqs_and_mscale(dims: int, base: float, max_positions: int, scaling: dict[str, Any]) -> Any:
        original = scaling["original_max_position_embeddings"]
        freqs = mx.array(scaling["long_factor"], dtype=mx.float32) * base ** (
            mx.arange(0, dims, 2, dtype=mx.float32) / dims
        )
        factor = max_positions / original
        return freqs, 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(max_positions))

    return _setattr(rope, "longrope_freqs_and_mscale", freqs_and_mscale)


ROPE_MUTANTS = [
    Mutant("rope-linear-unscaled", "linear rope scaling read but not applied", "llama-rope-linear-mini",
           "long-chat", patch=linear_scale_ignored),
    Mutant("rope-dynamic-late", "dynamic NTK's length counted one short: its base grows a position late",
           "llama-rope-dynamic-mini", "long-chat", patch=dynamic_length_off_by_one),
    Mutant("rope-llama3-blend", "Llama 3's middle band blended the wrong way round", "llama-rope-llama3-mini",
           "long-chat", patch=llama3_blend_inverted),
    Mutant("rope-yarn-mscale", "YaRN's input scale the inverse mscale ratio", "llama-rope-yarn-mini",
           "long-chat", patch=yarn_mscale_ratio_inverted),
    Mutant("rope-longrope-mscale", "LongRoPE's mscale from the log of the extended context",
           "llama-rope-longrope-mini", "long-chat", patch=longrope_mscale_log_of_max),
]  # fmt: skip
