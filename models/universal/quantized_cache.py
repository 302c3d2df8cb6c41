"""`QuantizedKVCache`: keys and values as `mx.quantize`d (packed, scales, biases) triples, with
mlx-lm's policies (mlx-lm 0.32.2, models/cache.py), and the bit widths and group sizes it takes.

It grows as KVCache does (blocks of 256 positions). A KVCache becomes one through its
`to_quantized`, which quantizes the *whole* preallocated buffers (zero tail included), as
mlx-lm does.
"""

from __future__ import annotations

import mlx.core as mx

from models.universal.masks import create_attention_mask

# The bit widths and group sizes mx.quantize's affine mode accepts.
KV_BITS = (2, 3, 4, 5, 6, 8)
KV_GROUP_SIZES = (32, 64, 128)

QuantizedArrays = list[mx.array]  # mx.quantize's (packed uint32, scales, biases)


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
