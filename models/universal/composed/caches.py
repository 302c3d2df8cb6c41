"""The L2 caches and the per-layer conversion into them (optiq 0.7.7's runtime/kv semantics).

- `RotatingQuantizedKVCache`: a RotatingKVCache whose buffers are mx.quantize triples
  (packed, scales, biases). Same ring mechanics (keep, trim to max_size - 1 on a multi-token
  update, in-place write wrapping to `keep`), quantizing each update before it is stored; the
  attention reads the quantized triples (it has `bits`), over the active window.
- `FusedQuantizedKVCache`: a QuantizedKVCache that carries its own attention kernel (the tiled
  online-softmax one of fused_sdpa.py); the model uses a cache's `quantized_attention` when
  it has one.
- `quantize_layer`: one layer's conversion, the class chosen by the cache's shape (a rotating
  window stays rotating). The whole preallocated buffers are quantized (zero tail included),
  and the offset and write index carried across, as optiq does.
- `trim`: drop the last n positions (mlx-lm's `trim` for the unbounded caches).
- `cache_digest`: what "the final cache state" means when two runs are compared.
"""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx
import numpy as np

from models.universal.cache import KVCache
from models.universal.composed.fused_sdpa import fused_quantized_attention
from models.universal.quantized_cache import QuantizedArrays, QuantizedKVCache
from models.universal.rotating_cache import RotatingKVCache


class FusedQuantizedKVCache(QuantizedKVCache):
    """A QuantizedKVCache whose attention is the tiled, online-softmax kernel (tiles of `n_chunk` keys)."""

    def __init__(self, group_size: int = 64, bits: int = 8, n_chunk: int = 512) -> None:
        super().__init__(group_size=group_size, bits=bits)
        self.n_chunk = n_chunk

    def quantized_attention(self, *args: Any, **kwargs: Any) -> mx.array:
        """fused_quantized_attention (the stock attention's arguments) in tiles of `n_chunk` keys."""
        return fused_quantized_attention(*args, **kwargs, n_chunk=self.n_chunk)


def _quantize(x: mx.array, group_size: int, bits: int) -> QuantizedArrays:
    return list(mx.quantize(x, group_size=group_size, bits=bits))


class RotatingQuantizedKVCache(RotatingKVCache):
    """A sliding window over quantized keys and values (optiq's RotatingQuantizedKVCache)."""

    def __init__(self, max_size: int, keep: int = 0, group_size: int = 64, bits: int = 4) -> None:
        super().__init__(max_size=max_size, keep=keep)
        self.group_size = group_size
        self.bits = bits

    def _length(self) -> int:
        return 0 if self.keys is None else self.keys[0].shape[2]

    def _trim(self, trim_size: int, v: QuantizedArrays, append: QuantizedArrays | None = None) -> QuantizedArrays:
        if trim_size > 0:
            parts = [[x[..., : self.keep, :] for x in v], [x[..., trim_size + self.keep :, :] for x in v]]
        else:
            parts = [v]
        if append is not None:
            parts.append(append)
        if len(parts) == 1:
            return parts[0]
        return [mx.concatenate(arrays, axis=2) for arrays in zip(*parts, strict=True)]

    def _temporal_order(self, v: QuantizedArrays) -> QuantizedArrays:
        if self._idx == v[0].shape[2]:
            return v
        if self._idx < self.offset:
            return [
                mx.concatenate(
                    [x[..., : self.keep, :], x[..., self._idx :, :], x[..., self.keep : self._idx, :]], axis=2
                )
                for x in v
            ]
        return [x[..., : self._idx, :] for x in v]

    def _update_concat(self, keys: mx.array, values: mx.array) -> tuple[QuantizedArrays, QuantizedArrays]:
        q_keys = _quantize(keys, self.group_size, self.bits)
        q_values = _quantize(values, self.group_size, self.bits)
        if self.keys is None:
            self.keys, self.values = q_keys, q_values
        else:
            self.keys = self._temporal_order(self.keys)
            self.values = self._temporal_order(self.values)
            self._idx = self._length()
            trim_size = self._idx - self.max_size + 1
            self.keys = self._trim(trim_size, self.keys, q_keys)
            self.values = self._trim(trim_size, self.values, q_values)
        self.offset += keys.shape[2]
        self._idx = self._length()
        return self.keys_and_values()

    def _empty(self, batch: int, n_kv_heads: int, length: int, dim: int, dtype: mx.Dtype) -> QuantizedArrays:
        per_word = 8 * mx.uint32.size // self.bits
        shape = (batch, n_kv_heads, length)
        return [
            mx.zeros((*shape, dim // per_word), dtype=mx.uint32),
            mx.zeros((*shape, dim // self.group_size), dtype=dtype),
            mx.zeros((*shape, dim // self.group_size), dtype=dtype),
        ]

    def _update_in_place(self, keys: mx.array, values: mx.array) -> tuple[QuantizedArrays, QuantizedArrays]:
        batch, n_kv_heads, length, k_dim = keys.shape
        start = self.offset
        if self.keys is None or (start >= self._length() and self._length() < self.max_size):
            new_size = min(self.step, self.max_size - start)
            new_k = self._empty(batch, n_kv_heads, new_size, k_dim, keys.dtype)
            new_v = self._empty(batch, n_kv_heads, new_size, values.shape[3], values.dtype)
            if self.keys is not None:
                self.keys = [mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k, strict=True)]
                self.values = [mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v, strict=True)]
            else:
                self.keys, self.values = new_k, new_v
            self._idx = start

        trim_size = self._length() - self.max_size
        if trim_size > 0:
            self.keys = self._trim(trim_size, self.keys)
            self.values = self._trim(trim_size, self.values)
            self._idx = self.max_size
        if self._idx == self.max_size:
            self._idx = self.keep

        q_keys = _quantize(keys, self.group_size, self.bits)
        q_values = _quantize(values, self.group_size, self.bits)
        for i in range(len(self.keys)):
            self.keys[i][..., self._idx : self._idx + length, :] = q_keys[i]
            self.values[i][..., self._idx : self._idx + length, :] = q_values[i]
        self.offset += length
        self._idx += length
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[QuantizedArrays, QuantizedArrays]:
        """The active window: the first `offset` positions until the window is full, then all."""
        if self.offset < self.max_size:
            return [x[..., : self.offset, :] for x in self.keys], [x[..., : self.offset, :] for x in self.values]
        return self.keys, self.values

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None else [*self.keys, *self.values]

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> RotatingQuantizedKVCache:
        return self


Cache = KVCache | QuantizedKVCache | RotatingKVCache | RotatingQuantizedKVCache

QUANTIZED = (QuantizedKVCache, RotatingQuantizedKVCache)


def quantize_layer(cache: Any, bits: int, group_size: int, n_chunk: int | None = None) -> Any:
    """One layer's cache, quantized; an already quantized cache is returned as it is.

    A rotating window becomes a RotatingQuantizedKVCache (its write index carried across);
    an unbounded cache a QuantizedKVCache, or a FusedQuantizedKVCache when `n_chunk` is given.
    """
    if isinstance(cache, QUANTIZED):
        return cache
    if isinstance(cache, RotatingKVCache):
        converted = RotatingQuantizedKVCache(cache.max_size, cache.keep, group_size=group_size, bits=bits)
        converted._idx = cache._idx
    elif n_chunk is not None:
        converted = FusedQuantizedKVCache(group_size=group_size, bits=bits, n_chunk=n_chunk)
    else:
        converted = QuantizedKVCache(group_size=group_size, bits=bits)
    converted.offset = cache.offset
    converted.keys = _quantize(cache.keys, group_size, bits)
    converted.values = _quantize(cache.values, group_size, bits)
    return converted


def trim(cache: Any, n: int) -> None:
    """Forget the last `n` positions of an unbounded cache (the buffers keep them until overwritten)."""
    if isinstance(cache, RotatingKVCache):
        raise NotImplementedError("trimming a rotating cache is not part of the composed paths")
    cache.offset -= min(cache.offset, n)


# Class names as both sides report them (the oracle reports mlx-lm's / optiq's).
_TYPE_NAMES = {
    FusedQuantizedKVCache: "QuantizedKVCache",
    QuantizedKVCache: "QuantizedKVCache",
    KVCache: "KVCache",
    RotatingQuantizedKVCache: "RotatingQuantizedKVCache",
    RotatingKVCache: "RotatingKVCache",
}


def _digest(arrays: list[mx.array]) -> str:
    """sha256 over each array's shape and raw bytes (the dtype's bits, whatever the dtype)."""
    digest = hashlib.sha256()
    for x in arrays:
        digest.update(repr(tuple(x.shape)).encode())
        digest.update(np.array(mx.contiguous(x).view(mx.uint8)).tobytes())
    return digest.hexdigest()


def cache_digest(caches: list[Any]) -> list[dict[str, Any]]:
    """Per layer: class, offset, bits/group size, and a hash of the stored keys and values.

    Unbounded caches are hashed over their first `offset` positions (what attention can
    read; a trimmed tail is not state); rotating ones over the whole ring buffer, with the
    write index, since their order in the buffer is part of the state.
    """
    out = []
    for cache in caches:
        entry: dict[str, Any] = {"type": _TYPE_NAMES[type(cache)], "offset": int(cache.offset)}
        if isinstance(cache, QUANTIZED):
            entry["bits"], entry["group_size"] = int(cache.bits), int(cache.group_size)
        if cache.keys is None:
            entry["sha256"] = None
        else:
            keys = cache.keys if isinstance(cache.keys, (list, tuple)) else [cache.keys]
            values = cache.values if isinstance(cache.values, (list, tuple)) else [cache.values]
            if isinstance(cache, RotatingKVCache):
                entry["idx"] = int(cache._idx)
                arrays = [*keys, *values]
            else:
                arrays = [x[..., : cache.offset, :] for x in (*keys, *values)]
            entry["sha256"] = _digest(arrays)
        out.append(entry)
    return out
