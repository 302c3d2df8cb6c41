"""Cache state in and out of the compiled step's explicit arrays (compiled_step.py): a prefilled
cache's KVCaches as exact-length per-layer keys and values, and back into a kept cache as
exactly the buffers the eager loop would leave (256-position blocks, zero tail); and the
"masked" variant's buffers, grown as KVCache grows.
"""

from __future__ import annotations

import mlx.core as mx

from models.universal.cache import KVCache
from models.universal.model import UniversalLlama

KVArrays = list[mx.array]  # keys_0, values_0, keys_1, values_1, ... one pair per layer


def grow_to_fit(buffers: KVArrays, needed: int) -> KVArrays:
    """The "masked" variant's buffers, grown like KVCache's (a 256 block of zeros) when full."""
    if buffers[0].shape[2] >= needed:
        return buffers
    return [mx.concatenate([b, mx.zeros((*b.shape[:2], KVCache.step, b.shape[3]), b.dtype)], axis=2) for b in buffers]


def exact_arrays(model: UniversalLlama, cache: list[KVCache], prefill_dtype: mx.Dtype) -> KVArrays:
    """Each layer's cached keys and values, exactly `offset` positions long."""
    arrays: KVArrays = []
    config = model.config
    for c in cache:
        if c.keys is None:  # a one-token prompt: nothing prefilled
            shape = (1, config.n_kv_heads, 0, config.attention_head_dim)
            arrays += [mx.zeros(shape, prefill_dtype), mx.zeros(shape, prefill_dtype)]
        else:
            arrays += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
    return arrays


def block_buffers(arrays: KVArrays, used_capacity: int, offset: int) -> KVArrays:
    """Exact-length arrays as KVCache buffers of `used_capacity` positions, zero tail."""
    tail = used_capacity - offset
    if tail == 0:
        return list(arrays)
    return [mx.concatenate([a, mx.zeros((*a.shape[:2], tail, a.shape[3]), a.dtype)], axis=2) for a in arrays]


def capacity_after(capacity: int, offset: int, n_new: int) -> int:
    """KVCache's buffer size after `n_new` single-position updates from (capacity, offset):
    whenever full it keeps the used positions and appends one 256-position block of zeros."""
    for _ in range(n_new):
        if offset + 1 > capacity:
            capacity = offset + KVCache.step
        offset += 1
    return capacity


def store_back(cache: list[KVCache], kv: KVArrays, offset: int) -> None:
    """Leave the kept cache as the eager loop would: same offset, same buffer sizes and zeros."""
    for i, c in enumerate(cache):
        capacity = capacity_after(0 if c.keys is None else c.keys.shape[2], c.offset, offset - c.offset)
        c.keys, c.values = block_buffers(kv[2 * i : 2 * i + 2], capacity, offset)
        c.offset = offset
