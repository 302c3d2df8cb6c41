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

fast_model.py holds the fused model and its compiled step; this module is the decode loop
(`fast_decode`) and `transcribe_fast`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import tiktoken

from models.whisper.decoding import DecodingTask, decode_batch
from models.whisper.decoding_types import DecodingOptions, DecodingResult, compression_ratio
from models.whisper.fast_filters import FastFilters, FilterState
from models.whisper.fast_model import FastWhisper, as_fast
from models.whisper.hooks import DecodeHooks, DecodeObserver, decode_entry
from models.whisper.model import Whisper
from models.whisper.transcribe import transcribe

__all__ = ["fast_decode", "transcribe_fast"]


def _delegates(options: DecodingOptions) -> bool:
    return (
        options.temperature != 0
        or options.beam_size is not None
        or (options.best_of or 1) > 1
        or options.language is None
        or options.task == "lang_id"
    )


@decode_entry
def fast_decode(
    model: FastWhisper, mel: mx.array, encoding: tiktoken.Encoding, options: DecodingOptions, hooks: DecodeHooks
) -> list[DecodingResult]:
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
    if _delegates(options):
        return decode_batch(model.model, mel, encoding, options, hooks)
    return _FastTask(model, options, encoding, hooks.observer, hooks.forced_tokens).run(mel)


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
