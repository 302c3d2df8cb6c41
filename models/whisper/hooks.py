"""The in-tree Whisper's instrumentation interface: what a caller may see and steer without
changing what is computed. The parity harness builds its record on it
(harness/runners/whisper_record.py); nothing here knows that record's layout.

- `observer`: a `DecodeObserver` given to `decoding.decode` (or `fast.fast_decode`) sees each
  decode call begin, its audio features, and every step's logits before the filters with the
  tokens appended after them (the step computed past the end is marked not kept). A
  `TranscribeObserver` given to `transcribe.transcribe` (or `stream.StreamingTranscriber`) also
  sees the clip's Mel, each decode call's outcome with the seek loop's fallback decision, and a
  stream's restart. On the fast path, an observer with an `on_fast_filters(dict)` method gets
  each call's filters (`fast_filters.FastFilters.to_dict`) and one with `on_fast_step(picks,
  kept)` the fast path's own pick each step (under teacher forcing, what it would have appended).
- Teacher forcing: `forced_tokens` (a decode call's, per batch member up to its first EOT) are
  fed instead of the chosen tokens; `forced_calls` (transcribe's, a `ForcedCall` per decode
  call) replay a reference run's windows, temperatures, tokens and fallback decisions.
- `sampler` (`token_decoders.TemperatureSampler`): a fresh one samples as mlx-whisper does in a
  fresh process. `decode_fn` (transcribe's): what runs each decode call (`decoding.decode`'s
  signature; the fast path passes `fast.fast_decode`).

Every observer method here is a no-op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import tiktoken

from models.whisper.decoding_types import DecodingOptions, DecodingResult
from models.whisper.token_decoders import TemperatureSampler


class DecodeObserver:
    """Sees what one decode call computes, in order. Every method is a no-op here."""

    def on_decode_begin(self, initial_tokens: tuple[int, ...], n_batch: int, temperature: float) -> None:
        pass

    def on_audio_features(self, audio_features: mx.array) -> None:
        pass

    def on_step(self, logits: mx.array, tokens: mx.array, kept: bool) -> None:
        """`logits`: `[n_batch, n_vocab]` float32 before any filter; `tokens`: `[n_batch]` appended.

        `kept` is False for the one step computed after every sequence ended, which the
        decode call then drops.
        """

    def on_candidates(self, tokens: list[list[list[int]]], sum_logprobs: list[list[float]]) -> None:
        """Beam search only: per audio, the finished sequences handed to the ranker (sampled
        tokens up to EOT), in the order they finished, and their float32 sums."""


class TranscribeObserver(DecodeObserver):
    """A `DecodeObserver` that also sees the clip's Mel and every decode call's outcome."""

    def on_mel(self, mel: mx.array) -> None:
        pass

    def on_decode_call(self, seek: int, segment_size: int, result: DecodingResult, needs_fallback: bool) -> None:
        pass

    def on_restart(self) -> None:
        """A stream starts its seek loop over (`stream.StreamingTranscriber.finish`): forget the calls seen."""


@dataclass(frozen=True)
class ForcedCall:
    """One decode call of a reference run, replayed: where, at which temperature, which
    tokens (per batch member, its sampled tokens up to its first EOT) and whether the
    reference fell back after it."""

    seek: int
    temperature: float
    member_tokens: Sequence[Sequence[int]]
    needs_fallback: bool


@dataclass(frozen=True)
class DecodeHooks:
    """What a caller steers or sees of one decode call beyond its options (above)."""

    sampler: TemperatureSampler | None = None
    observer: DecodeObserver | None = None
    forced_tokens: Sequence[Sequence[int]] | None = None


BatchDecode = Callable[[Any, mx.array, tiktoken.Encoding, DecodingOptions, DecodeHooks], list[DecodingResult]]


def decode_entry(decode_batch: BatchDecode) -> Callable[..., DecodingResult | list[DecodingResult]]:
    """openai-whisper's `decode` face over a function of a batch of Mel windows: the face takes
    one (`[frames, n_mels]`) or several windows and returns one result or a list, its `kwargs`
    override `options`; `decode_batch(model, mel_batch, encoding, options, hooks)` decodes the
    batch. `decoding.decode` and the fast path's `fast.fast_decode` are two."""

    @functools.wraps(decode_batch)
    def entry(
        model: Any,
        mel: mx.array,
        encoding: tiktoken.Encoding,
        options: DecodingOptions | None = None,
        *,
        sampler: TemperatureSampler | None = None,
        observer: DecodeObserver | None = None,
        forced_tokens: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> DecodingResult | list[DecodingResult]:
        options = options or DecodingOptions()
        if kwargs:
            options = replace(options, **kwargs)
        single = mel.ndim == 2
        hooks = DecodeHooks(sampler, observer, forced_tokens)
        results = decode_batch(model, mel[None] if single else mel, encoding, options, hooks)
        return results[0] if single else results

    return entry
