"""`RotatingKVCache`: a KV cache of at most `max_size` positions, with mlx-lm's policies
(mlx-lm 0.32.2, models/cache.py).

The first `keep` positions are never evicted. A multi-token update concatenates (after putting
the buffer back in temporal order and trimming it to `max_size - 1` old positions); a single
token is written in place, wrapping around to `keep` when the buffer is full.
"""

from __future__ import annotations

import mlx.core as mx

from models.universal.cache import _FloatCache
from models.universal.masks import create_causal_mask
from models.universal.quantized_cache import QuantizedKVCache

# A rotating cache always keeps the first positions (mlx-lm's make_prompt_cache uses 4).
ROTATING_KEEP = 4


class RotatingKVCache(_FloatCache):
    """At most `max_size` positions; the first `keep` stay, the rest is a ring buffer.

    `_idx` is the write position in the buffer; `offset` counts every position ever fed
    (it is the RoPE offset), so once the ring wraps the buffer is not in temporal order.
    """

    step = 256

    def __init__(self, max_size: int, keep: int = 0) -> None:
        self.keep = keep
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.max_size = max_size
        self._idx = 0

    def _trim(self, trim_size: int, v: mx.array, append: mx.array | None = None) -> mx.array:
        """Drop `trim_size` positions right after the kept ones, optionally appending."""
        parts = [v[..., : self.keep, :], v[..., trim_size + self.keep :, :]] if trim_size > 0 else [v]
        if append is not None:
            parts.append(append)
        return mx.concatenate(parts, axis=2)

    def _temporal_order(self, v: mx.array) -> mx.array:
        """The buffer in temporal order, its unused end sliced off."""
        if self._idx == v.shape[2]:
            return v
        if self._idx < self.offset:
            return mx.concatenate(
                [v[..., : self.keep, :], v[..., self._idx :, :], v[..., self.keep : self._idx, :]], axis=2
            )
        return v[..., : self._idx, :]

    def _concat_trim_size(self) -> int:
        """The old positions a multi-token write into the ring drops: it keeps max_size - 1, so every
        new query sees max_size keys."""
        return self._idx - self.max_size + 1

    def _update_concat(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = self._temporal_order(self.keys)
            self.values = self._temporal_order(self.values)
            self._idx = self.keys.shape[2]
            trim_size = self._concat_trim_size()
            self.keys = self._trim(trim_size, self.keys, keys)
            self.values = self._trim(trim_size, self.values, values)
        self.offset += keys.shape[2]
        self._idx = self.keys.shape[2]
        return self.keys, self.values

    def _update_in_place(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        batch, n_kv_heads, length, k_dim = keys.shape
        start = self.offset
        if self.keys is None or (start >= self.keys.shape[2] and self.keys.shape[2] < self.max_size):
            # Not at max_size yet: grow by a block (at most up to max_size).
            new_size = min(self.step, self.max_size - start)
            new_k = mx.zeros((batch, n_kv_heads, new_size, k_dim), keys.dtype)
            new_v = mx.zeros((batch, n_kv_heads, new_size, values.shape[3]), values.dtype)
            if self.keys is not None:
                self.keys = mx.concatenate([self.keys, new_k], axis=2)
                self.values = mx.concatenate([self.values, new_v], axis=2)
            else:
                self.keys, self.values = new_k, new_v
            self._idx = start

        # A previous multi-token update may have left the buffer above max_size.
        trim_size = self.keys.shape[2] - self.max_size
        if trim_size > 0:
            self.keys = self._trim(trim_size, self.keys)
            self.values = self._trim(trim_size, self.values)
            self._idx = self.max_size

        if self._idx == self.max_size:
            self._idx = self.keep  # wrap around, past the kept positions

        self.keys[..., self._idx : self._idx + length, :] = keys
        self.values[..., self._idx : self._idx + length, :] = values
        self.offset += length
        self._idx += length
        return self.keys_and_values()

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if keys.shape[2] == 1:
            return self._update_in_place(keys, values)
        return self._update_concat(keys, values)

    def make_mask(
        self, n_queries: int, window_size: int | None = None, return_array: bool = False
    ) -> mx.array | str | None:
        if n_queries > 1:
            window_size = window_size or self.max_size
            offset = min(self.max_size - 1, self.offset)
            if offset + n_queries > window_size or return_array:
                return create_causal_mask(n_queries, offset, window_size=window_size)
            return "causal"
        if window_size is None:
            return None
        # One query with its own window is asked by sliding-window attention layers only, which
        # no in-tree model family has: refused rather than kept unjudged (mlx-lm 0.32.2 rolls a
        # window mask over the ring here; issue 53: no gate could tell a fault in it).
        raise NotImplementedError(
            f"RotatingKVCache.make_mask(1, window_size={window_size}): sliding-window attention over a "
            "rotating cache is not implemented in-tree (no in-tree model family has it)"
        )

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> QuantizedKVCache:
        # mlx-lm 0.32.2 raises here too ("RotatingKVCache Quantization NYI").
        raise NotImplementedError(
            "kv_bits with max_kv_size: a RotatingKVCache cannot be quantized (mlx-lm 0.32.2 raises "
            "NotImplementedError when its cache reaches quantized_kv_start)"
        )
