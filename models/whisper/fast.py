"""The Whisper fast path (L2): the faithful model's weights, fused, and a device-resident greedy loop.

The faithful path (model.py, decoding.py) reproduces mlx-whisper's graph bit for bit. This
path computes the same function with fewer, larger operations and without a host round
trip per decoder step; its logits differ from the oracle's by rounding, so it is judged at
L2 by a token budget with every difference explained as a near-tie
(harness/checks/token_budget.py; docs/whisper-fast.md):

- `mx.fast.scaled_dot_product_attention` everywhere (scale `(D/H) ** -0.5` on q, instead of
  `(D/H) ** -0.25` on both q and k and a separate softmax);
- the encoder's q|k|v weights concatenated: one matmul per encoder layer (and per decoder
  self-attention);
- every decoder layer's cross-attention K and V from one matmul pair per window (all
  layers' weights concatenated), head-split once;
- the single-token decoder step — embedding, layers, final norm, logits, every logit filter
  (fast_filters.py), the greedy choice and its log-probability — is one `mx.compile`d
  function of arrays: self-attention K/V in fixed `[B, H, n_text_ctx, D/H]` buffers written
  at the step's position, the filters' per-step state as int32 arrays;
- the chosen token stays on the device and feeds the next step; the host reads whether
  the previous step ended while the next one computes (mlx-whisper's async_eval pattern,
  which also keeps the oracle's one-step lookahead: the step past the end is computed and
  dropped);
- a window's audio features are kept for the next decode call of the same Mel window (the
  temperature fallback ladder re-decodes it; the faithful path re-encodes).

Greedy decoding (T = 0, one sample) runs here. Sampling (T > 0, `best_of`), beam search,
language identification and a decode call without a language delegate to the faithful
`decoding.decode` on the faithful model: the same results as the faithful path, no speed-up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import tiktoken

from models.whisper.decoding import (
    DecodeObserver,
    DecodingOptions,
    DecodingResult,
    DecodingTask,
    TemperatureSampler,
    compression_ratio,
    decode,
)
from models.whisper.fast_filters import FastFilters, FilterState
from models.whisper.model import MultiHeadAttention, Whisper
from models.whisper.run import TranscriptionRecorder, transcribe_record
from models.whisper.transcribe import transcribe

__all__ = ["FastWhisper", "as_fast", "fast_decode", "fast_transcribe_record", "transcribe_fast"]


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

    Exposes what `transcribe.transcribe` and `decoding.detect_language` use: `dims`,
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
    """The logit filters, the greedy pick and its bookkeeping, as decoding.GreedyDecoder does:
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


def _delegates(options: DecodingOptions) -> bool:
    return (
        options.temperature != 0
        or options.beam_size is not None
        or (options.best_of or 1) > 1
        or options.language is None
        or options.task == "lang_id"
    )


def fast_decode(
    model: FastWhisper,
    mel: mx.array,
    encoding: tiktoken.Encoding,
    options: DecodingOptions | None = None,
    *,
    sampler: TemperatureSampler | None = None,
    observer: DecodeObserver | None = None,
    forced_tokens: Sequence[Sequence[int]] | None = None,
    **kwargs: Any,
) -> DecodingResult | list[DecodingResult]:
    """`decoding.decode`'s signature and results, on the fast path (greedy) or delegated.

    An observer sees what decoding.py's observers see (each step's logits before the
    filters, the appended tokens, the step past the end as not kept); one with an
    `on_fast_step(picks, kept)` method also gets the fast path's own pick each step (under
    teacher forcing, what it would have appended), and one with `on_fast_filters(dict)` the
    filters of the call. Without an observer nothing per step is read on the host but
    whether the previous step ended.
    """
    if not isinstance(model, FastWhisper):
        raise TypeError(f"fast_decode needs a FastWhisper (fast.as_fast(model)), got {type(model).__name__}")
    options = options or DecodingOptions()
    if kwargs:
        options = replace(options, **kwargs)
    if _delegates(options):
        return decode(
            model.model, mel, encoding, options, sampler=sampler, observer=observer, forced_tokens=forced_tokens
        )
    single = mel.ndim == 2
    if single:
        mel = mel[None]
    results = _FastTask(model, options, encoding, observer, forced_tokens).run(mel)
    return results[0] if single else results


class _FastTask:
    def __init__(
        self,
        fast: FastWhisper,
        options: DecodingOptions,
        encoding: tiktoken.Encoding,
        observer: DecodeObserver | None,
        forced_tokens: Sequence[Sequence[int]] | None,
    ):
        # The faithful task decides the prompt, the suppressed tokens and the filters.
        self.task = DecodingTask(fast.model, options, encoding)
        self.fast = fast
        self.options = options
        self.observer = observer
        self.forced_tokens = forced_tokens
        self.tokenizer = self.task.tokenizer
        self.filters = FastFilters.from_decoding(self.task.logit_filters, fast.dims.n_vocab)
        self.eot = self.tokenizer.eot
        self._no_force: mx.array | None = None

    def _audio_features(self, mel: mx.array) -> mx.array:
        if self.options.fp16:
            mel = mel.astype(mx.float16)
        dims = self.fast.dims
        features = mel if mel.shape[-2:] == (dims.n_audio_ctx, dims.n_audio_state) else self.fast.embed_audio(mel)
        if features.dtype != (mx.float16 if self.options.fp16 else mx.float32):
            raise TypeError(f"audio_features has an incorrect dtype: {features.dtype}")
        return features

    def _forced(self, step: int, n_batch: int) -> mx.array:
        if self.forced_tokens is None:
            # made once per call: a new host array every step is a host-to-device copy per step
            if self._no_force is None or self._no_force.shape[0] != n_batch:
                self._no_force = mx.zeros((n_batch,), mx.int32)
            return self._no_force
        if len(self.forced_tokens) != n_batch:
            raise ValueError(f"teacher forcing: {len(self.forced_tokens)} forced sequences for a batch of {n_batch}")
        return mx.array([m[step] if step < len(m) else self.eot for m in self.forced_tokens], mx.int32)

    def run(self, mel: mx.array) -> list[DecodingResult]:
        fast, task, observer = self.fast, self.task, self.observer
        features = self._audio_features(mel)
        if observer is not None:
            observer.on_audio_features(features)
        n_batch = features.shape[0]
        initial = task.initial_tokens
        if observer is not None:
            observer.on_decode_begin(initial, n_batch, self.options.temperature)
            if hasattr(observer, "on_fast_filters"):
                observer.on_fast_filters(self.filters.to_dict())
        on_pick = getattr(observer, "on_fast_step", None)

        forcing = self.forced_tokens is not None
        choose = fast.chooser(self.filters, forcing, self.eot)
        step = fast.step(self.filters, forcing, self.eot)

        cross = fast.cross_kv(features)
        prompt = mx.broadcast_to(mx.array(initial, mx.int32), (n_batch, len(initial)))
        raw, sot_logits, self_kv = fast.prefill(prompt, cross, task.sot_index)
        no_speech = mx.softmax(sot_logits, axis=-1)[:, self.tokenizer.no_speech]
        fed = prompt[:, -1]
        state = FilterState.initial(n_batch)
        sums = mx.zeros((n_batch,), mx.float32)
        token, completed, sums, state, pick = choose(raw, fed, state, sums, self._forced(0, n_batch))
        mx.async_eval(token, completed, sums)
        if observer is not None:
            observer.on_step(raw, token, True)
            if on_pick is not None:
                on_pick(pick, True)

        sampled = [token]
        length = len(initial) + 1
        # The step's position stays on the device (one add per step), as the token does.
        offset = mx.array(length - 1, mx.int32)
        for i in range(1, task.sample_len):
            if length > task.n_ctx:
                break
            out = step(token, offset, self_kv, cross, state, sums, self._forced(i, n_batch))
            next_raw, next_kv, next_token, next_completed, next_sums, next_state, next_pick = out
            mx.async_eval(next_token, next_completed, next_sums, next_kv)
            done = bool(completed.item())  # the previous step, read while this one computes
            if observer is not None:
                observer.on_step(next_raw, next_token, not done)
                if on_pick is not None:
                    on_pick(next_pick, not done)
            if done:
                break
            token, completed, sums, state, self_kv = next_token, next_completed, next_sums, next_state, next_kv
            sampled.append(token)
            length += 1
            offset = offset + 1

        tokens = mx.stack(sampled, axis=1)
        mx.eval(tokens, sums, no_speech)
        results = []
        for row, total, p_no_speech, features_row in zip(
            tokens.tolist(), sums.tolist(), no_speech.tolist(), features, strict=True
        ):
            row = row[: row.index(self.eot)] if self.eot in row else row
            text = self.tokenizer.decode(row).strip()
            results.append(
                DecodingResult(
                    audio_features=features_row,
                    language=self.options.language,
                    tokens=row,
                    text=text,
                    avg_logprob=total / (len(row) + 1),
                    no_speech_prob=p_no_speech,
                    temperature=self.options.temperature,
                    compression_ratio=compression_ratio(text),
                )
            )
        return results


def transcribe_fast(model: Whisper | FastWhisper, audio: Any, encoding: tiktoken.Encoding, **options: Any) -> dict:
    """`transcribe.transcribe` on the fast path (the faithful model is fused once, then kept)."""
    return transcribe(as_fast(model), audio, encoding, decode_fn=fast_decode, **options)


def fast_transcribe_record(
    model: Whisper | FastWhisper,
    model_dir: str | Path,
    audio_path: str | Path,
    options: dict[str, Any],
    forced: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`run.transcribe_record` on the fast path: the same record, and per decode call
    `fast_filters` (the call's filters, `FastFilters.to_dict`) and `fast_picks` (per kept
    step, per batch member, the fast path's own pick: under teacher forcing what it would
    have appended) where the fast path decoded (absent where it delegated)."""
    return transcribe_record(
        as_fast(model), model_dir, audio_path, options, forced, decode_fn=fast_decode, recorder_class=_FastRecorder
    )


class _FastRecorder(TranscriptionRecorder):
    """run.TranscriptionRecorder plus the fast path's filters and picks per decode call."""

    def on_decode_begin(self, initial_tokens: tuple[int, ...], n_batch: int, temperature: float) -> None:
        super().on_decode_begin(initial_tokens, n_batch, temperature)
        self._fast: dict[str, Any] = {}

    def on_fast_filters(self, filters: dict[str, Any]) -> None:
        self._fast["fast_filters"] = filters
        self._fast["fast_picks"] = []

    def on_fast_step(self, picks: mx.array, kept: bool) -> None:
        if kept:
            self._fast["fast_picks"].append([int(t) for t in picks.tolist()])

    def on_decode_call(self, seek: int, segment_size: int, result: DecodingResult, needs_fallback: bool) -> None:
        super().on_decode_call(seek, segment_size, result, needs_fallback)
        self.decode_calls[-1].update(self._fast)
