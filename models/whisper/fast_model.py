"""The fast path's model (fast.py says what the fast path is): a faithful `Whisper`'s weights
fused once (q|k|v per layer, every layer's cross-attention K and V), the fused-SDPA encoder and
decoder layers over fixed-size K/V buffers, and the compiled decoder step and chooser (logit
filters, greedy pick, its log-probability) that the fast decode loop calls."""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from models.whisper.fast_filters import FastFilters, FilterState
from models.whisper.model import MultiHeadAttention, Whisper

__all__ = ["FastWhisper", "as_fast"]


def _layer_norm(x: mx.array, ln: nn.LayerNorm) -> mx.array:
    return mx.fast.layer_norm(x, ln.weight, ln.bias, ln.eps)


def fuse_qkv(attn: MultiHeadAttention) -> tuple[mx.array, mx.array]:
    """`([3D, D] weight, [3D] bias)`: q, k, v stacked in that order (the key has no bias: zeros)."""
    weight = mx.concatenate([attn.query.weight, attn.key.weight, attn.value.weight], axis=0)
    bias = mx.concatenate([attn.query.bias, mx.zeros_like(attn.query.bias), attn.value.bias])
    return weight, bias


def _split_heads(x: mx.array, n_head: int) -> mx.array:
    """`[B, T, D]` -> `[B, H, T, D/H]`."""
    b, t, d = x.shape
    if t == 1:  # the same elements in the same order: one reshape, no transposed view to copy later
        return x.reshape(b, n_head, 1, d // n_head)
    return x.reshape(b, t, n_head, d // n_head).transpose(0, 2, 1, 3)


def _merge_heads(x: mx.array) -> mx.array:
    b, h, t, dh = x.shape
    if t == 1:
        return x.reshape(b, 1, h * dh)
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


class FastWhisper:
    """A faithful `Whisper`'s weights, fused once, for the fast path.

    Exposes what `transcribe.transcribe` and `language.detect_language` use: `dims`,
    `is_multilingual`, `num_languages`, `embed_audio` (the fast encoder) and `logits` (the
    faithful decoder, for language detection). `model` is the faithful model (delegation).
    """

    def __init__(self, model: Whisper):
        if not isinstance(model, Whisper):
            raise TypeError(f"FastWhisper needs a loaded models.whisper.model.Whisper, got {type(model).__name__}")
        self.model = model
        self.dims = model.dims
        self.dtype = model.dtype
        enc, dec = model.encoder, model.decoder
        self._encoder_qkv = [fuse_qkv(block.attn) for block in enc.blocks]
        self._decoder_qkv = [fuse_qkv(block.attn) for block in dec.blocks]
        cross = [block.cross_attn for block in dec.blocks]
        # One matmul pair per window gives every layer's cross-attention K and V.
        self._cross_k = mx.concatenate([c.key.weight for c in cross], axis=0)  # [L*D, D]
        self._cross_v = mx.concatenate([c.value.weight for c in cross], axis=0)
        self._cross_v_bias = mx.concatenate([c.value.bias for c in cross])
        mx.eval(self._encoder_qkv, self._decoder_qkv, self._cross_k, self._cross_v, self._cross_v_bias)
        # The fused SDPA's scales (float32 inside the kernel), held here so a test can move them.
        self.audio_attention_scale = (self.dims.n_audio_state // self.dims.n_audio_head) ** -0.5
        self.text_attention_scale = (self.dims.n_text_state // self.dims.n_text_head) ** -0.5
        self._encode = mx.compile(self._encoder_forward)
        self._steps: dict[tuple[FastFilters, bool, int], Any] = {}
        self._choosers: dict[tuple[FastFilters, bool, int], Any] = {}
        self._features_memo: tuple[bytes, mx.array] | None = None

    # -- what transcribe needs --------------------------------------------------------------

    @property
    def is_multilingual(self) -> bool:
        return self.model.is_multilingual

    @property
    def num_languages(self) -> int:
        return self.model.num_languages

    def logits(self, tokens: mx.array, audio_features: mx.array, kv_cache: Any = None) -> Any:
        """The faithful decoder call (language detection: one call per clip)."""
        return self.model.logits(tokens, audio_features, kv_cache=kv_cache)

    def embed_audio(self, mel: mx.array) -> mx.array:
        """Audio features `[B, n_audio_ctx, n_audio_state]`; the last window's are reused."""
        key = _content_key(mel)
        if self._features_memo is not None and self._features_memo[0] == key:
            return self._features_memo[1]
        features = self._encode(mel)
        mx.eval(features)
        self._features_memo = (key, features)
        return features

    # -- encoder ----------------------------------------------------------------------------

    def _encoder_forward(self, mel: mx.array) -> mx.array:
        enc = self.model.encoder
        x = enc.stem(mel)
        n_head = self.dims.n_audio_head
        scale = self.audio_attention_scale
        for block, (w_qkv, b_qkv) in zip(enc.blocks, self._encoder_qkv, strict=True):
            q, k, v = mx.split(mx.addmm(b_qkv, _layer_norm(x, block.attn_ln), w_qkv.T), 3, axis=-1)
            attended = mx.fast.scaled_dot_product_attention(
                _split_heads(q, n_head), _split_heads(k, n_head), _split_heads(v, n_head), scale=scale
            )
            x = x + block.attn.out(_merge_heads(attended))
            x = x + block.mlp2(nn.gelu(block.mlp1(_layer_norm(x, block.mlp_ln))))
        return _layer_norm(x, enc.ln_post)

    # -- decoder ----------------------------------------------------------------------------

    def cross_kv(self, audio_features: mx.array) -> list[tuple[mx.array, mx.array]]:
        """Every decoder layer's cross-attention (K, V), `[B, H, n_audio_ctx, D/H]`, from one
        matmul pair over all layers' concatenated weights."""
        n_layer, n_head = self.dims.n_text_layer, self.dims.n_text_head
        b, t, d = audio_features.shape

        def split(x: mx.array) -> mx.array:  # [B, T, L*D] -> [L, B, H, T, D/H]
            return x.reshape(b, t, n_layer, n_head, d // n_head).transpose(2, 0, 3, 1, 4)

        k = split(audio_features @ self._cross_k.T)
        v = split(mx.addmm(self._cross_v_bias, audio_features, self._cross_v.T))
        return [(k[i], v[i]) for i in range(n_layer)]

    def _decoder_layers(
        self,
        x: mx.array,
        offset: mx.array | None,
        self_kv: list[tuple[mx.array, mx.array]] | None,
        cross: list[tuple[mx.array, mx.array]],
    ) -> tuple[mx.array, list[tuple[mx.array, mx.array]]]:
        """`x` `[B, T, D]`: one token per row at position `offset` after the buffers `self_kv`,
        or (`offset` None, no buffers) the prompt from position 0."""
        dec = self.model.decoder
        n_head = self.dims.n_text_head
        scale = self.text_attention_scale
        n_ctx = self.dims.n_text_ctx
        n_new = x.shape[1]
        positions = mx.arange(n_ctx)
        if offset is not None:  # made once for every layer
            here = (positions == offset)[None, None, :, None]
            mask = (positions <= offset)[None, None, None, :]
        new_kv = []
        buffers = self_kv if self_kv is not None else [(None, None)] * len(dec.blocks)
        for block, (w_qkv, b_qkv), (k_buf, v_buf), (ck, cv) in zip(
            dec.blocks, self._decoder_qkv, buffers, cross, strict=True
        ):
            q, k, v = mx.split(mx.addmm(b_qkv, _layer_norm(x, block.attn_ln), w_qkv.T), 3, axis=-1)
            q, k, v = _split_heads(q, n_head), _split_heads(k, n_head), _split_heads(v, n_head)
            if offset is not None:  # one step: write position `offset`, attend to 0..offset
                k_buf, v_buf = mx.where(here, k, k_buf), mx.where(here, v, v_buf)
                attended = mx.fast.scaled_dot_product_attention(q, k_buf, v_buf, scale=scale, mask=mask)
            else:  # the prompt from position 0: causal over itself
                attended = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
                pad = [(0, 0), (0, 0), (0, n_ctx - n_new), (0, 0)]
                k_buf, v_buf = mx.pad(k, pad), mx.pad(v, pad)
            new_kv.append((k_buf, v_buf))
            x = x + block.attn.out(_merge_heads(attended))
            cq = _split_heads(block.cross_attn.query(_layer_norm(x, block.cross_attn_ln)), n_head)
            x = x + block.cross_attn.out(_merge_heads(mx.fast.scaled_dot_product_attention(cq, ck, cv, scale=scale)))
            x = x + block.mlp2(nn.gelu(block.mlp1(_layer_norm(x, block.mlp_ln))))
        return x, new_kv

    def _logits(self, x: mx.array) -> mx.array:
        dec = self.model.decoder
        return dec.token_embedding.as_linear(_layer_norm(x, dec.ln)).astype(mx.float32)

    def prefill(
        self, tokens: mx.array, cross: list[tuple[mx.array, mx.array]], sot_index: int
    ) -> tuple[mx.array, mx.array, list[tuple[mx.array, mx.array]]]:
        """The prompt `[B, T]`: (logits at its last position, logits at `sot_index`, K/V buffers)."""
        dec = self.model.decoder
        n_tokens = tokens.shape[-1]
        if n_tokens > self.dims.n_text_ctx:
            raise ValueError(f"a prompt of {n_tokens} tokens exceeds the text context of {self.dims.n_text_ctx}")
        x = dec.token_embedding(tokens) + dec.positional_embedding[:n_tokens]
        x, kv = self._decoder_layers(x, None, None, cross)
        logits = self._logits(x[:, mx.array([sot_index, n_tokens - 1])])
        return logits[:, 1], logits[:, 0], kv

    def chooser(self, filters: FastFilters, forcing: bool, eot: int) -> Any:
        """Compiled: filters, argmax, log-probability, state update (the prompt's step)."""
        key = (filters, forcing, eot)
        if key not in self._choosers:
            self._choosers[key] = mx.compile(_Chooser(filters, forcing, eot))
        return self._choosers[key]

    def step(self, filters: FastFilters, forcing: bool, eot: int) -> Any:
        """Compiled: one decoder step for one token per row, then what `chooser` does."""
        key = (filters, forcing, eot)
        if key not in self._steps:
            choose = _Chooser(filters, forcing, eot)
            dec = self.model.decoder

            def step(token, offset, self_kv, cross, state, sum_logprobs, forced):
                x = dec.token_embedding(token[:, None]) + dec.positional_embedding[offset][None, None]
                x, self_kv = self._decoder_layers(x, offset, self_kv, cross)
                raw = self._logits(x)[:, 0]
                return (raw, self_kv, *choose(raw, token, state, sum_logprobs, forced))

            self._steps[key] = mx.compile(step)
        return self._steps[key]


class _Chooser:
    """The logit filters, the greedy pick and its bookkeeping, as token_decoders.GreedyDecoder does:
    an ended row appends EOT and adds nothing to its sum; a forced token replaces the pick of a
    row that has not ended. Returns (appended, all ended, sums, new filter state, own pick)."""

    def __init__(self, filters: FastFilters, forcing: bool, eot: int):
        self.filters = filters
        self.forcing = forcing
        self.eot = eot
        self.masks = filters.masks()

    def __call__(self, raw: mx.array, fed: mx.array, state: FilterState, sum_logprobs: mx.array, forced: mx.array):
        eot = self.eot
        logits = self.filters.apply(raw, state, self.masks)
        ended = fed == eot
        pick = mx.where(ended, eot, mx.argmax(logits, axis=-1).astype(mx.int32))
        chosen = mx.where(ended, pick, forced) if self.forcing else pick
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen_logprob = mx.take_along_axis(logprobs, chosen[:, None], axis=-1)[:, 0]
        sum_logprobs = sum_logprobs + chosen_logprob * (fed != eot)
        completed = mx.all(chosen == eot)
        begin = self.filters.timestamps.begin if self.filters.timestamps is not None else self.filters.n_vocab
        return chosen, completed, sum_logprobs, state.advance(chosen, begin), pick


def _content_key(mel: mx.array) -> bytes:
    data = np.array(mel)
    return hashlib.sha256(repr((data.shape, data.dtype.str)).encode() + data.tobytes()).digest()


_FAST: dict[int, tuple[Whisper, FastWhisper]] = {}


def as_fast(model: Whisper | FastWhisper) -> FastWhisper:
    """The FastWhisper of `model` (built once per model object; the last one is kept)."""
    if isinstance(model, FastWhisper):
        return model
    cached = _FAST.get(id(model))
    if cached is None or cached[0] is not model:
        _FAST.clear()
        cached = (model, FastWhisper(model))
        _FAST[id(model)] = cached
    return cached[1]
