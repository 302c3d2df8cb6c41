"""The decoder forward pass with its self-attention cache (openai-whisper's `Inference`),
and the cache's row reordering that beam search needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx


class Inference:
    """The decoder forward pass with its self-attention cache, logits cast to float32."""

    def __init__(self, model: Any):
        self.model = model
        self.kv_cache = None

    def logits(self, tokens: mx.array, audio_features: mx.array) -> mx.array:
        logits, self.kv_cache, _ = self.model.logits(tokens, audio_features, kv_cache=self.kv_cache)
        return logits.astype(mx.float32)

    def reset(self) -> None:
        self.kv_cache = None

    def reorder(self, source_rows: Sequence[int]) -> None:
        """Row i of the self-attention cache becomes old row `source_rows[i]` (beam search)."""
        if self.kv_cache is not None and list(source_rows) != list(range(len(source_rows))):
            self.kv_cache = reorder_self_attention_cache(self.kv_cache, source_rows)


def reorder_self_attention_cache(kv_cache: list[Any], source_rows: Sequence[int]) -> list[Any]:
    """The cache with each layer's self-attention K/V rows gathered on the device.

    One layer's cache is `((self_k, self_v), (cross_k, cross_v))`, each `[rows, T, D]`. Only
    the self-attention part follows the beam rows: the cross-attention K/V are computed from
    the audio features, which beam search never copies per row (their batch is the audio's).
    """
    rows = mx.array(list(source_rows), dtype=mx.int32)
    reordered = []
    for self_kv, cross_kv in kv_cache:
        if self_kv is not None:
            if self_kv[0].shape[0] != len(source_rows):
                raise ValueError(
                    f"beam search: the self-attention cache has {self_kv[0].shape[0]} rows, "
                    f"{len(source_rows)} source rows were given"
                )
            self_kv = (mx.take(self_kv[0], rows, axis=0), mx.take(self_kv[1], rows, axis=0))
        reordered.append((self_kv, cross_kv))
    return reordered
