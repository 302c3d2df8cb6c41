"""KVCache: per-layer keys and values, grown in preallocated blocks.

The growth policy is mlx-lm's KVCache: buffers grow in steps of 256 positions and the
attention reads a slice `[..., :offset, :]`. The policy changes which arrays SDPA sees
(a sliced view vs. a whole buffer), so it is kept identical rather than simplified.
"""

from __future__ import annotations

import mlx.core as mx


class KVCache:
    step = 256

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append keys/values of shape (B, n_kv_heads, L, head_dim); return all so far."""
        start = self.offset
        needed = start + keys.shape[2]
        if self.keys is None or needed > self.keys.shape[2]:
            self._grow(keys, values)
        self.offset = needed
        self.keys[..., start:needed, :] = keys
        self.values[..., start:needed, :] = values
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array) -> None:
        batch, n_kv_heads, length, k_dim = keys.shape
        n_blocks = (self.step + length - 1) // self.step
        new_k = mx.zeros((batch, n_kv_heads, n_blocks * self.step, k_dim), keys.dtype)
        new_v = mx.zeros((batch, n_kv_heads, n_blocks * self.step, values.shape[3]), values.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
            return
        if self.offset % self.step != 0:
            # Drop the unused tail of the last block before appending fresh blocks.
            self.keys = self.keys[..., : self.offset, :]
            self.values = self.values[..., : self.offset, :]
        self.keys = mx.concatenate([self.keys, new_k], axis=2)
        self.values = mx.concatenate([self.values, new_v], axis=2)

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        if self.offset < self.keys.shape[2]:
            return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]
        return self.keys, self.values

    @property
    def state(self) -> tuple[mx.array | None, mx.array | None]:
        """The arrays to evaluate after a prefill chunk (what mlx-lm evaluates)."""
        return self.keys, self.values

    def attention_mask(self, n_queries: int) -> str | None:
        # One query attends to everything cached; several need the causal mask (SDPA
        # aligns it to the end of the keys, so the cached prefix stays visible).
        return "causal" if n_queries > 1 else None
