"""Attention over quantized keys/values, tiled over the keys with an online softmax.

optiq's fused quantized SDPA (runtime/fused_quant_sdpa.py, 0.7.7) never builds the whole
(queries x keys) score matrix: it walks the keys in tiles of `n_chunk`, and per tile takes
scores with `quantized_matmul`, masks them, and folds them into a running row maximum, row
sum and output (rescaling what came before by exp(old max - new max)). The output is divided
by the row sum at the end. It is not softmax-then-matmul: results match optiq bit for bit,
not mlx-lm.

Only half-precision queries (float16/bfloat16), 4 or 8 bits, group sizes 32/64/128, and no
mask or the "causal" string take this path; anything else (an fp32 model, a rotating
window's boolean mask) runs the stock quantized attention, as optiq falls back to it.
"""

from __future__ import annotations

import mlx.core as mx

from models.universal.model import quantized_scaled_dot_product_attention
from models.universal.quantized_cache import QuantizedArrays

FUSED_DTYPES = (mx.float16, mx.bfloat16)
FUSED_BITS = (4, 8)
FUSED_GROUP_SIZES = (32, 64, 128)


def takes_fused_path(queries: mx.array, mask: mx.array | str | None, group_size: int, bits: int) -> bool:
    return (
        bits in FUSED_BITS
        and group_size in FUSED_GROUP_SIZES
        and queries.dtype in FUSED_DTYPES
        and (mask is None or (isinstance(mask, str) and mask == "causal"))
    )


def fused_quantized_attention(
    queries: mx.array,
    q_keys: QuantizedArrays,
    q_values: QuantizedArrays,
    *,
    mask: mx.array | str | None,
    scale: float,
    bits: int,
    group_size: int,
    n_chunk: int = 512,
) -> mx.array:
    """The stock attention's arguments, all but the three tensors by keyword (no swap)."""
    if not takes_fused_path(queries, mask, group_size, bits):
        return quantized_scaled_dot_product_attention(
            queries, q_keys, q_values, scale=scale, mask=mask, group_size=group_size, bits=bits
        )

    batch, n_q_heads, length, head_dim = queries.shape
    n_kv_heads = q_keys[0].shape[-3]
    n_repeats = n_q_heads // n_kv_heads
    n_keys = q_keys[0].shape[-2]
    queries = queries * scale
    if n_repeats > 1:
        # Grouped query heads against keys with a broadcast repeat axis: no key copies.
        queries = mx.reshape(queries, (batch, n_kv_heads, n_repeats, length, head_dim))
        q_keys = [mx.expand_dims(x, axis=-3) for x in q_keys]
        q_values = [mx.expand_dims(x, axis=-3) for x in q_values]
    # "causal" aligned to the end of the keys: query i sits at position n_keys - length + i.
    visible = None
    if mask is not None:
        visible = mx.arange(n_keys - length, n_keys)[:, None] >= mx.arange(n_keys)[None]

    out = row_max = row_sum = None
    for start in range(0, n_keys, n_chunk):
        end = min(start + n_chunk, n_keys)
        tile_keys = [x[..., start:end, :] for x in q_keys]
        tile_values = [x[..., start:end, :] for x in q_values]
        scores = mx.quantized_matmul(queries, *tile_keys, transpose=True, group_size=group_size, bits=bits)
        if visible is not None:
            scores = mx.where(visible[:, start:end], scores, mx.finfo(scores.dtype).min)
        tile_max = mx.max(scores, axis=-1, keepdims=True)
        if out is None:
            row_max = tile_max
            weights = mx.exp(scores - row_max)
            row_sum = mx.sum(weights, axis=-1, keepdims=True)
            out = mx.quantized_matmul(weights, *tile_values, transpose=False, group_size=group_size, bits=bits)
        else:
            new_max = mx.maximum(row_max, tile_max)
            rescale = mx.exp(row_max - new_max)
            weights = mx.exp(scores - new_max)
            row_sum = rescale * row_sum + mx.sum(weights, axis=-1, keepdims=True)
            tile_out = mx.quantized_matmul(weights, *tile_values, transpose=False, group_size=group_size, bits=bits)
            out = out * rescale + tile_out
            row_max = new_max
    out = out / row_sum
    if n_repeats > 1:
        out = mx.reshape(out, (batch, n_q_heads, length, head_dim))
    return out
