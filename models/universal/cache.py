"""KV caches and attention masks, with mlx-lm's policies (mlx-lm 0.32.2, models/cache.py).

- `KVCache`: keys and values grown in preallocated blocks of 256 positions; attention reads
  the slice `[..., :offset, :]`. The policy changes which arrays SDPA sees (a sliced view vs.
  a whole buffer), so it is kept identical rather than simplified.
- `QuantizedKVCache`: the same growth policy over `mx.quantize`d (packed, scales, biases)
  triples. A KVCache becomes one through `to_quantized`, which quantizes the *whole*
  preallocated buffers (zero tail included), as mlx-lm does.
- `RotatingKVCache`: at most `max_size` positions (the first `keep` never evicted). A
  multi-token update concatenates (after putting the buffer back in temporal order and
  trimming it to `max_size - 1` old positions); a single token is written in place, wrapping
  around to `keep` when the buffer is full.

- `BatchKVCache`: several sequences in one (B, heads, positions, dim) buffer, as mlx-lm's
  BatchGenerator keeps them: shorter rows padded on the left, per-row RoPE offsets, and a
  mask that hides each row's padding (see the class).

Every cache has `make_mask(n_queries, window_size=None, return_array=False)`, which is what
mlx-lm's Llama asks its first layer's cache for: `None` (one query, no window), the string
"causal" (SDPA aligns it to the end of the keys) or a boolean (n_queries, n_keys) array.
"""

from __future__ import annotations

import mlx.core as mx

# The bit widths and group sizes mx.quantize's affine mode accepts.
KV_BITS = (2, 3, 4, 5, 6, 8)
KV_GROUP_SIZES = (32, 64, 128)
# A rotating cache always keeps the first positions (mlx-lm's make_prompt_cache uses 4).
ROTATING_KEEP = 4

QuantizedArrays = list[mx.array]  # mx.quantize's (packed uint32, scales, biases)


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


class QuantizedKVCache:
    """Keys and values as mx.quantize triples; `bits` marks it for the quantized attention."""

    step = 256

    def __init__(self, group_size: int = 64, bits: int = 8) -> None:
        self.keys: QuantizedArrays | None = None
        self.values: QuantizedArrays | None = None
        self.offset = 0
        self.group_size = group_size
        self.bits = bits

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[QuantizedArrays, QuantizedArrays]:
        batch, n_kv_heads, length, k_dim = keys.shape
        v_dim = values.shape[-1]
        start = self.offset
        if self.keys is None or start + length > self.keys[0].shape[-2]:
            per_word = 8 * mx.uint32.size // self.bits
            shape = (batch, n_kv_heads, (self.step + length - 1) // self.step * self.step)

            def empty(dim: int) -> QuantizedArrays:
                return [
                    mx.zeros((*shape, dim // per_word), dtype=mx.uint32),
                    mx.zeros((*shape, dim // self.group_size), dtype=keys.dtype),
                    mx.zeros((*shape, dim // self.group_size), dtype=keys.dtype),
                ]

            def extend(x: mx.array) -> mx.array:
                return mx.concatenate([x, mx.zeros((*shape, x.shape[-1]), dtype=x.dtype)], axis=-2)

            if self.keys is not None:
                if start % self.step != 0:
                    self.keys = [x[..., :start, :] for x in self.keys]
                    self.values = [x[..., :start, :] for x in self.values]
                self.keys = [extend(x) for x in self.keys]
                self.values = [extend(x) for x in self.values]
            else:
                self.keys, self.values = empty(k_dim), empty(v_dim)

        self.offset += length
        q_keys = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        q_values = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for i in range(len(self.keys)):
            self.keys[i][..., start : self.offset, :] = q_keys[i]
            self.values[i][..., start : self.offset, :] = q_values[i]
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[QuantizedArrays, QuantizedArrays]:
        if self.offset == self.keys[0].shape[2]:
            return self.keys, self.values
        return [x[..., : self.offset, :] for x in self.keys], [x[..., : self.offset, :] for x in self.values]

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None else [*self.keys, *self.values]

    def make_mask(
        self, n_queries: int, window_size: int | None = None, return_array: bool = False
    ) -> mx.array | str | None:
        return create_attention_mask(n_queries, self.offset, return_array, window_size)


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

    def _update_concat(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = self._temporal_order(self.keys)
            self.values = self._temporal_order(self.values)
            self._idx = self.keys.shape[2]
            # Keep max_size - 1 old positions, so every new query sees max_size keys.
            trim_size = self._idx - self.max_size + 1
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
        # One query with a window narrower than the buffer: mask the positions outside it.
        if self.offset >= window_size and self.max_size > window_size:
            idx = self._idx
            if idx >= self.max_size:
                idx = 0
            mask_size = self.offset + 1 if self.offset < self.max_size else self.max_size
            mask = mx.arange(mask_size) >= (mask_size - window_size)
            return mx.roll(mask, shift=idx + 1)
        return None

    def to_quantized(self, group_size: int = 64, bits: int = 4) -> QuantizedKVCache:
        # mlx-lm 0.32.2 raises here too ("RotatingKVCache Quantization NYI").
        raise NotImplementedError(
            "kv_bits with max_kv_size: a RotatingKVCache cannot be quantized (mlx-lm 0.32.2 raises "
            "NotImplementedError when its cache reaches quantized_kv_start)"
        )


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


Cache = KVCache | QuantizedKVCache | RotatingKVCache


def maybe_quantize_kv_cache(
    caches: list[Cache], quantized_kv_start: int, kv_group_size: int, kv_bits: int | None
) -> None:
    """mlx-lm's rule, run after every model call: each cache that can be quantized and holds
    `quantized_kv_start` positions or more is replaced (in the list) by its quantized copy."""
    if kv_bits is None:
        return
    for i, cache in enumerate(caches):
        if hasattr(cache, "to_quantized") and cache.offset >= quantized_kv_start:
            caches[i] = cache.to_quantized(group_size=kv_group_size, bits=kv_bits)
