"""Whisper's encoder-decoder, computing exactly what mlx-whisper 0.4.3 computes.

The graph keeps every choice of the reference that changes bits:

- GELU is `mlx.nn.gelu`, which is `mx.compile`d: the fused kernel rounds differently
  from the same four ops run one by one.
- Attention scales q and k by `(D/H) ** -0.25` each before `q @ kᵀ`, adds the causal mask
  (the float32 minimum cast to the model dtype: `-inf` in float16), and uses the precise
  softmax. In float16 the products are float16 matmuls.
- Self-attention K/V are cached un-split `[B, T, D]` and concatenated one step at a time;
  cross-attention K/V are projected once per window and then reused as they are.
- Weights keep the dtype they were stored in; the model dtype decides only the encoder's
  sinusoids and the causal mask (mlx-whisper's loader does not cast either).

Shapes: the mel is `(batch, n_frames, n_mels)`, audio features `(batch, n_audio_ctx,
n_audio_state)`, tokens `(batch, n_tokens)` int32, logits `(batch, n_tokens, n_vocab)`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# One layer's cache: ((self_k, self_v), (cross_k, cross_v)), each [B, T, D].
LayerCache = tuple[tuple[mx.array, mx.array] | None, tuple[mx.array, mx.array] | None]
KVCache = list[LayerCache]

__all__ = [
    "AudioEncoder",
    "KVCache",
    "ModelDimensions",
    "MultiHeadAttention",
    "ResidualAttentionBlock",
    "TextDecoder",
    "Whisper",
    "sinusoids",
]


@dataclass(frozen=True)
class ModelDimensions:
    """The numbers in an mlx-whisper config.json; they decide every tensor shape."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"ModelDimensions.{f.name} must be a positive int, got {value!r}")
        if self.n_audio_state % self.n_audio_head or self.n_text_state % self.n_text_head:
            raise ValueError(f"heads must divide the state width: {self}")
        if self.n_audio_state % 2:
            raise ValueError(f"n_audio_state must be even for the sinusoids, got {self.n_audio_state}")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelDimensions:
        """Exactly the ModelDimensions keys (a `model_type` key is ignored); anything else is an error."""
        names = [f.name for f in fields(cls)]
        keys = set(config) - {"model_type"}
        missing = [n for n in names if n not in keys]
        unknown = sorted(keys - set(names))
        if missing or unknown:
            raise ValueError(f"whisper config: missing keys {missing}, unknown keys {unknown}")
        return cls(**{n: config[n] for n in names})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def sinusoids(length: int, channels: int, max_timescale: float = 10000) -> mx.array:
    """The encoder's fixed positional table `[length, channels]`: sines then cosines, float32."""
    if channels % 2:
        raise ValueError(f"sinusoids need an even channel count, got {channels}")
    half = channels // 2
    log_increment = math.log(max_timescale) / (half - 1)
    inverse_timescales = mx.exp(-log_increment * mx.arange(half))
    angles = mx.arange(length)[:, None] * inverse_timescales[None, :]
    return mx.concatenate([mx.sin(angles), mx.cos(angles)], axis=1)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def __call__(
        self,
        x: mx.array,
        xa: mx.array | None = None,
        mask: mx.array | None = None,
        kv_cache: tuple[mx.array, mx.array] | None = None,
    ) -> tuple[mx.array, tuple[mx.array, mx.array], mx.array]:
        """Returns (output, the K/V to cache, the pre-softmax scores `[B, H, Tq, Tk]`)."""
        q = self.query(x)
        if xa is None:  # self-attention: this step's K/V appended to the cached ones
            k, v = self.key(x), self.value(x)
            if kv_cache is not None:
                k = mx.concatenate([kv_cache[0], k], axis=1)
                v = mx.concatenate([kv_cache[1], v], axis=1)
        elif kv_cache is None:  # cross-attention, first step of the window
            k, v = self.key(xa), self.value(xa)
        else:
            k, v = kv_cache
        attended, scores = self.attend(q, k, v, mask)
        return self.out(attended), (k, v), scores

    def attend(self, q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None) -> tuple[mx.array, mx.array]:
        batch, n_query, n_state = q.shape
        scale = (n_state // self.n_head) ** -0.25
        q = q.reshape(batch, n_query, self.n_head, -1).transpose(0, 2, 1, 3) * scale
        k = k.reshape(*k.shape[:2], self.n_head, -1).transpose(0, 2, 3, 1) * scale
        v = v.reshape(*v.shape[:2], self.n_head, -1).transpose(0, 2, 1, 3)
        scores = q @ k
        if mask is not None:
            # A square slice, as the reference takes it: exact for a whole prompt without a
            # cache and for one token with a cache, the only two ways decoding calls it.
            scores = scores + mask[:n_query, :n_query]
        weights = mx.softmax(scores, axis=-1, precise=True)
        attended = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, n_query, n_state)
        return attended, scores


class ResidualAttentionBlock(nn.Module):
    """Pre-norm block: self-attention, then cross-attention (decoder only), then a GELU MLP."""

    def __init__(self, n_state: int, n_head: int, cross_attention: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = nn.LayerNorm(n_state) if cross_attention else None
        self.mlp1 = nn.Linear(n_state, 4 * n_state)
        self.mlp2 = nn.Linear(4 * n_state, n_state)
        self.mlp_ln = nn.LayerNorm(n_state)

    def __call__(
        self,
        x: mx.array,
        xa: mx.array | None = None,
        mask: mx.array | None = None,
        kv_cache: LayerCache | None = None,
    ) -> tuple[mx.array, LayerCache, mx.array | None]:
        self_kv, cross_kv = kv_cache if kv_cache else (None, None)
        y, self_kv, _ = self.attn(self.attn_ln(x), mask=mask, kv_cache=self_kv)
        x = x + y
        cross_scores = None
        if self.cross_attn is not None:
            y, cross_kv, cross_scores = self.cross_attn(self.cross_attn_ln(x), xa, kv_cache=cross_kv)
            x = x + y
        x = x + self.mlp2(nn.gelu(self.mlp1(self.mlp_ln(x))))
        return x, (self_kv, cross_kv), cross_scores


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int, dtype: mx.Dtype):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        # Underscored: computed, not loaded (MLX treats it as a non-parameter).
        self._positional_embedding = sinusoids(n_ctx, n_state).astype(dtype)
        self.blocks = [ResidualAttentionBlock(n_state, n_head) for _ in range(n_layer)]
        self.ln_post = nn.LayerNorm(n_state)

    def stem(self, mel: mx.array) -> mx.array:
        """The two GELU convolutions plus the positional embedding: the first block's input."""
        x = nn.gelu(self.conv1(mel))
        x = nn.gelu(self.conv2(x))
        if tuple(x.shape[1:]) != tuple(self._positional_embedding.shape):
            raise ValueError(
                f"mel of shape {tuple(mel.shape)} gives encoder input {tuple(x.shape[1:])}, "
                f"expected {tuple(self._positional_embedding.shape)} (a full 30 s window)"
            )
        return x + self._positional_embedding

    def __call__(self, mel: mx.array) -> mx.array:
        x = self.stem(mel)
        for block in self.blocks:
            x, _, _ = block(x)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int, dtype: mx.Dtype):
        super().__init__()
        self.token_embedding = nn.Embedding(n_vocab, n_state)
        self.positional_embedding = mx.zeros((n_ctx, n_state))
        self.blocks = [ResidualAttentionBlock(n_state, n_head, cross_attention=True) for _ in range(n_layer)]
        self.ln = nn.LayerNorm(n_state)
        # float32 minimum above the diagonal, cast: float16 turns it into -inf.
        self._mask = nn.MultiHeadAttention.create_additive_causal_mask(n_ctx).astype(dtype)

    def __call__(
        self, tokens: mx.array, audio_features: mx.array, kv_cache: KVCache | None = None
    ) -> tuple[mx.array, KVCache, list[mx.array | None]]:
        """Logits for `tokens` after what `kv_cache` holds; returns (logits, new cache, cross scores).

        The first call of a window passes the whole prompt and no cache; later calls pass
        one new token per row and the cache returned by the previous call.
        """
        offset = kv_cache[0][0][0].shape[1] if kv_cache else 0
        n_tokens = tokens.shape[-1]
        if offset + n_tokens > self.positional_embedding.shape[0]:
            raise ValueError(
                f"{offset} cached + {n_tokens} new tokens exceed the text context of "
                f"{self.positional_embedding.shape[0]}"
            )
        x = self.token_embedding(tokens) + self.positional_embedding[offset : offset + n_tokens]

        layer_caches: list[LayerCache | None] = list(kv_cache) if kv_cache else [None] * len(self.blocks)
        cross_scores: list[mx.array | None] = [None] * len(self.blocks)
        for i, block in enumerate(self.blocks):
            x, layer_caches[i], cross_scores[i] = block(x, audio_features, mask=self._mask, kv_cache=layer_caches[i])
        x = self.ln(x)
        return self.token_embedding.as_linear(x), layer_caches, cross_scores


class Whisper(nn.Module):
    def __init__(self, dims: ModelDimensions, dtype: mx.Dtype = mx.float16):
        super().__init__()
        self.dims = dims
        self.dtype = dtype
        self.encoder = AudioEncoder(
            dims.n_mels, dims.n_audio_ctx, dims.n_audio_state, dims.n_audio_head, dims.n_audio_layer, dtype
        )
        self.decoder = TextDecoder(
            dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head, dims.n_text_layer, dtype
        )
        # Default alignment heads: every head of the upper half of the decoder (the
        # checkpoint's own list, when it has one, replaces this at load time).
        upper_half = np.zeros((dims.n_text_layer, dims.n_text_head), dtype=bool)
        upper_half[dims.n_text_layer // 2 :] = True
        self.alignment_heads = mx.array(np.asarray(upper_half.nonzero()).T)

    def set_alignment_heads(self, heads: np.ndarray | mx.array) -> None:
        """`[n, 2]` (layer, head) pairs of the cross-attention heads that follow timing."""
        heads = np.asarray(heads)
        if heads.ndim != 2 or heads.shape[1] != 2:
            raise ValueError(f"alignment heads must be [n, 2] (layer, head) pairs, got shape {heads.shape}")
        if heads.size and (
            heads.min() < 0 or heads[:, 0].max() >= self.dims.n_text_layer or heads[:, 1].max() >= self.dims.n_text_head
        ):
            raise ValueError(f"alignment heads {heads.tolist()} out of range for {self.dims}")
        self.alignment_heads = mx.array(heads)

    def embed_audio(self, mel: mx.array) -> mx.array:
        return self.encoder(mel)

    def logits(
        self, tokens: mx.array, audio_features: mx.array, kv_cache: KVCache | None = None
    ) -> tuple[mx.array, KVCache, list[mx.array | None]]:
        """The decoder step: (logits, kv_cache, cross_qk), as `TextDecoder.__call__` returns them."""
        return self.decoder(tokens, audio_features, kv_cache=kv_cache)

    def forward(self, mel: mx.array, tokens: mx.array) -> mx.array:
        return self.decoder(tokens, self.encoder(mel))[0]

    def __call__(self, mel: mx.array, tokens: mx.array) -> mx.array:
        return self.forward(mel, tokens)

    def forward_with_cross_qk(self, mel: mx.array, tokens: mx.array) -> tuple[mx.array, list[mx.array | None]]:
        logits, _, cross_qk = self.decoder(tokens, self.encoder(mel))
        return logits, cross_qk

    @property
    def is_multilingual(self) -> bool:
        return self.dims.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.dims.n_vocab - 51765 - int(self.is_multilingual)
