"""The float KV caches grown in blocks of 256 positions, with mlx-lm's policies (mlx-lm 0.32.2,
models/cache.py): `KVCache`, and `BatchKVCache` for several sequences, with the buffer growth
and write they share.

- `KVCache`: keys and values grown in preallocated blocks of 256 positions; attention reads
  the slice `[..., :offset, :]`. The policy changes which arrays SDPA sees (a sliced view vs.
  a whole buffer), so it is kept identical rather than simplified. `to_quantized` turns it
  into a QuantizedKVCache (models/universal/quantized_cache.py).
- `BatchKVCache`: several sequences in one (B, heads, positions, dim) buffer, as mlx-lm's
  BatchGenerator keeps them: shorter rows padded on the left, per-row RoPE offsets, and a
  mask that hides each row's padding (see the class).

`_FloatCache` is the read-up-to-`offset` base that RotatingKVCache (rotating_cache.py) shares.
"""

from __future__ import annotations

import mlx.core as mx

from models.universal.masks import create_attention_mask, create_causal_mask
from models.universal.quantized_cache import QuantizedKVCache


def grow_buffers(
    key_buffer: mx.array | None, value_buffer: mx.array | None, used: int, step: int, keys: mx.array, values: mx.array
) -> tuple[mx.array, mx.array]:
    """mlx-lm's growth of a float KV buffer: whole `step`-sized blocks of zeros, appended after
    dropping the unused tail of the last block (`used` positions are kept)."""
    batch, n_kv_heads, length, k_dim = keys.shape
    n_blocks = (step + length - 1) // step
    new_k = mx.zeros((batch, n_kv_heads, n_blocks * step, k_dim), keys.dtype)
    new_v = mx.zeros((batch, n_kv_heads, n_blocks * step, values.shape[3]), values.dtype)
    if key_buffer is None or value_buffer is None:
        return new_k, new_v
    if used % step != 0:
        key_buffer, value_buffer = key_buffer[..., :used, :], value_buffer[..., :used, :]
    return mx.concatenate([key_buffer, new_k], axis=2), mx.concatenate([value_buffer, new_v], axis=2)


def store_at(cache: KVCache | BatchKVCache, start: int, keys: mx.array, values: mx.array) -> int:
    """Write keys/values into positions [start, end) of the cache's buffers, grown first
    (its `_grow`) when they are shorter than that; returns end."""
    end = start + keys.shape[2]
    if cache.keys is None or end > cache.keys.shape[2]:
        cache._grow(keys, values)
    cache.keys[..., start:end, :] = keys
    cache.values[..., start:end, :] = values
    return end


class _FloatCache:
    """What the float caches share: buffers read up to `offset`, and the arrays to evaluate."""

    keys: mx.array | None
    values: mx.array | None
    offset: int

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        if self.offset < self.keys.shape[2]:
            return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]
        return self.keys, self.values

    @property
    def state(self) -> list[mx.array]:
        """The arrays to evaluate after a prefill chunk (what mlx-lm evaluates)."""
        return [] if self.keys is None else [self.keys, self.values]


class KVCache(_FloatCache):
    step = 256

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append keys/values of shape (B, n_kv_heads, L, head_dim); return all so far."""
        self.offset = store_at(self, self.offset, keys, values)
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array) -> None:
        self.keys, self.values = grow_buffers(self.keys, self.values, self.offset, self.step, keys, values)

    def make_mask(
        self, n_queries: int, window_size: int | None = None, return_array: bool = False
    ) -> mx.array | str | None:
        # One query attends to everything cached; several need the causal mask (SDPA
        # aligns it to the end of the keys, so the cached prefix stays visible).
        return create_attention_mask(n_queries, self.offset, return_array, window_size)

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> QuantizedKVCache:
        """The same positions, quantized: the whole buffers, unused zero tail included."""
        quantized = QuantizedKVCache(group_size=group_size, bits=bits)
        quantized.offset = self.offset
        if self.keys is not None:
            quantized.keys = mx.quantize(self.keys, group_size=group_size, bits=bits)
            quantized.values = mx.quantize(self.values, group_size=group_size, bits=bits)
        return quantized


def create_batch_causal_mask(n_queries: int, offset: int, left_padding: mx.array) -> mx.array:
    """Boolean (B, 1, n_queries, offset + n_queries): causal, and no row sees its left padding."""
    causal = create_causal_mask(n_queries, offset)
    positions = mx.arange(offset + n_queries)[None]
    return causal & (mx.expand_dims(left_padding, (1, 2, 3)) <= positions)


def roll_rows(x: mx.array, shifts: mx.array) -> mx.array:
    """Roll each batch row of (B, heads, positions, dim) right by its own shift, wrapping."""
    size = x.shape[2]
    source = (mx.arange(size)[:, None] - shifts[:, None, None, None]) % size
    return mx.take_along_axis(x, source, axis=2)


class BatchKVCache:
    """mlx-lm's BatchKVCache (0.32.2), as BatchGenerator uses it: one buffer for B rows.

    Positions [0, _idx) of the buffer are filled for every row; row b's first
    `left_padding[b]` of them are padding, masked out of attention. `offset[b]` is the
    row's true length (its RoPE offset), so it is an array, not an int. Buffers grow in
    blocks of 256 as KVCache's do, but reads always slice to `_idx`.

    Prompts are fed right-padded: `prepare(right_padding=...)` before the model call
    records the padding, `finalize()` after it rolls every row right by its padding (the
    whole buffer, wrapping), turning it into left padding.
    """

    step = 256

    def __init__(self, left_padding: list[int]) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.offset = self.offset + keys.shape[2]
        self._idx = store_at(self, self._idx, keys, values)
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array) -> None:
        self.keys, self.values = grow_buffers(self.keys, self.values, self._idx, self.step, keys, values)

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        return self.keys[..., : self._idx, :], self.values[..., : self._idx, :]

    def prepare(self, *, right_padding: list[int]) -> None:
        """Before a right-padded model call: remember each row's padding for finalize()."""
        if max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """After a right-padded call: move each row's padding to its left (see the class)."""
        if self._right_padding is None:
            return
        padding = self._right_padding
        self.keys = roll_rows(self.keys, padding)
        self.values = roll_rows(self.values, padding)
        self.offset = self.offset - padding
        self.left_padding = self.left_padding + padding
        self._right_padding = None

    def filter(self, rows: list[int]) -> None:
        """Keep `rows` (in that order), then drop the padding columns all of them share."""
        if self.keys is not None:
            self.keys = self.keys[rows]
            self.values = self.values[rows]
        self.offset = self.offset[rows]
        self.left_padding = self.left_padding[rows]
        shared = min(self.left_padding.tolist())
        if shared > 0:
            if self.keys is not None:
                self.keys = self.keys[..., shared:, :]
                self.values = self.values[..., shared:, :]
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    @property
    def state(self) -> list[mx.array]:
        arrays = [self.offset, self.left_padding]
        return arrays if self.keys is None else [self.keys, self.values, *arrays]

    def make_mask(self, n_queries: int, window_size: int | None = None, return_array: bool = False) -> mx.array:
        # Always an array, even for one query: the padding differs per row.
        if window_size is not None:
            raise NotImplementedError("window_size: a BatchKVCache mask has no sliding window")
        return create_batch_causal_mask(n_queries, self._idx, self.left_padding)
