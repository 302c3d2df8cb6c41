"""Rotary position embeddings for every rope_scaling a Llama config may ask for.

Each variant reduces to one `mx.fast.rope` call, differing only in the frequencies (or
base) and an optional input scale. The frequency tables are computed with the same MLX
ops, in the same order and dtypes, as mlx-lm's rope_utils: a different but "equal"
formula would round differently and break bit-exactness.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from models.universal.config import LlamaConfig


class FrequencyRoPE(nn.Module):
    """Rope with an explicit per-pair frequency table (llama3, yarn, longrope).

    `input_scale` multiplies the rotated features first (yarn's and longrope's mscale);
    `always_scale` keeps that multiply even when the scale is 1.0, as longrope does.
    """

    def __init__(
        self,
        dims: int,
        freqs: mx.array,
        traditional: bool,
        input_scale: float = 1.0,
        always_scale: bool = False,
    ):
        super().__init__()
        self.dims = dims
        self.traditional = traditional
        self.input_scale = input_scale
        self.always_scale = always_scale
        self._freqs = freqs

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        if self.always_scale or self.input_scale != 1.0:
            x = x.at[..., : self.dims].multiply(self.input_scale)
        return mx.fast.rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=None,
            scale=1.0,
            offset=offset,
            freqs=self._freqs,
        )


class DynamicNTKRoPE(nn.Module):
    """Rope whose base grows once the sequence passes max_position_embeddings."""

    def __init__(self, dims: int, max_positions: int, traditional: bool, base: float, factor: float):
        super().__init__()
        self.dims = dims
        self.max_positions = max_positions
        self.traditional = traditional
        self.base = base
        self.factor = factor

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        seq_len = max(x.shape[-2] + offset, self.max_positions)
        growth = (self.factor * seq_len / self.max_positions) - (self.factor - 1)
        base = self.base * growth ** (self.dims / (self.dims - 2))
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=base, scale=1.0, offset=offset)


def llama3_freqs(dims: int, base: float, scaling: dict[str, Any]) -> mx.array:
    """Llama 3.1's frequency table: stretch low frequencies, blend the middle band."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]  # required (config.py: as transformers 5 requires them)
    high_freq_factor = scaling["high_freq_factor"]
    old_context = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor

    freqs = base ** (mx.arange(0, dims, 2) / dims)
    wavelens = 2 * mx.pi * freqs
    freqs = mx.where(wavelens > low_freq_wavelen, freqs * factor, freqs)
    in_middle_band = (wavelens > high_freq_wavelen) & (wavelens < low_freq_wavelen)
    smooth = (old_context / wavelens - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = freqs / ((1 - smooth) / factor + smooth)
    return mx.where(in_middle_band, smoothed, freqs)


def yarn_freqs_and_mscale(dims: int, base: float, scaling: dict[str, Any]) -> tuple[mx.array, float]:
    """YaRN: interpolate between extrapolated and interpolated frequencies by a ramp."""
    factor = scaling["factor"]
    original_max = scaling.get("original_max_position_embeddings", 4096)
    beta_fast = scaling.get("beta_fast", 32)
    beta_slow = scaling.get("beta_slow", 1)
    mscale = scaling.get("mscale", 1)
    mscale_all_dim = scaling.get("mscale_all_dim", 0)

    def correction_dim(rotations: float) -> float:
        return (dims * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(base))

    def attention_factor(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dims - 1)
    if low == high:
        high += 0.001  # the ramp below would divide by zero
    ramp = mx.clip((mx.arange(dims // 2, dtype=mx.float32) - low) / (high - low), 0, 1)
    extrapolation_mask = 1.0 - ramp

    freq_extra = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    freq_inter = factor * freq_extra
    freqs = (freq_inter * freq_extra) / (freq_inter * extrapolation_mask + freq_extra * (1 - extrapolation_mask))
    return freqs, attention_factor(mscale) / attention_factor(mscale_all_dim)


def longrope_freqs_and_mscale(
    dims: int, base: float, max_positions: int, scaling: dict[str, Any]
) -> tuple[mx.array, float]:
    """LongRoPE as mlx-lm applies it: always the long factors, one fixed mscale."""
    original_max = scaling["original_max_position_embeddings"]
    freqs = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    freqs = mx.array(scaling["long_factor"], dtype=mx.float32) * freqs
    factor = max_positions / original_max
    mscale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_max))
    return freqs, mscale


def make_rope(config: LlamaConfig) -> nn.Module:
    """The rope module for one attention layer, chosen by config.rope_scaling."""
    dims = config.attention_head_dim
    base = config.rope_theta
    traditional = config.rope_traditional
    scaling = config.rope_scaling or {}
    rope_type = config.rope_type

    if rope_type in ("default", "linear"):
        scale = 1 / scaling["factor"] if rope_type == "linear" else 1.0
        return nn.RoPE(dims, traditional=traditional, base=base, scale=scale)
    if rope_type == "dynamic":
        return DynamicNTKRoPE(dims, config.max_position_embeddings, traditional, base, scaling["factor"])
    if rope_type == "llama3":
        return FrequencyRoPE(dims, llama3_freqs(dims, base, scaling), traditional)
    if rope_type == "yarn":
        freqs, mscale = yarn_freqs_and_mscale(dims, base, scaling)
        return FrequencyRoPE(dims, freqs, traditional, input_scale=mscale)
    if rope_type == "longrope":
        # mlx-lm's SuScaledRoPE ignores rope_traditional.
        freqs, mscale = longrope_freqs_and_mscale(dims, base, config.max_position_embeddings, scaling)
        return FrequencyRoPE(dims, freqs, False, input_scale=mscale, always_scale=True)
    raise ValueError(f"unsupported rope_type {rope_type!r}")  # config validation prevents this
