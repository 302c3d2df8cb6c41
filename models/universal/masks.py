"""Attention masks for a prompt of queries over cached keys, with mlx-lm's rules (mlx-lm 0.32.2,
models/base.py).

What every cache's `make_mask(n_queries, window_size=None, return_array=False)` hands mlx-lm's
Llama (its first layer's cache is asked): `None` (one query, no window), the string "causal"
(SDPA aligns it to the end of the keys) or a boolean (n_queries, n_keys) array.
"""

from __future__ import annotations

import mlx.core as mx


def create_causal_mask(n_queries: int, offset: int = 0, window_size: int | None = None) -> mx.array:
    """Boolean (n_queries, offset + n_queries) mask: query i (at offset + i) sees keys <= it."""
    rinds = mx.arange(offset + n_queries)
    linds = mx.arange(offset, offset + n_queries) if offset else rinds
    linds = linds[:, None]
    rinds = rinds[None]
    mask = linds >= rinds
    if window_size is not None:
        mask = mask & (linds < rinds + window_size)
    return mask


def create_attention_mask(
    n_queries: int, offset: int, return_array: bool, window_size: int | None
) -> mx.array | str | None:
    """mlx-lm's rule for an unbounded cache holding `offset` positions."""
    if window_size is not None:
        return create_causal_mask(n_queries, offset, window_size=window_size)
    if n_queries == 1:
        return None
    if return_array:
        return create_causal_mask(n_queries, offset, window_size=window_size)
    return "causal"
