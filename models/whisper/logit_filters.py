"""The logit filters (openai-whisper's LogitFilter), applied each step in this order before a
token is chosen: `SuppressBlank`, `SuppressTokens`, `ApplyTimestampRules` (the timestamp
grammar, on the device)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from models.whisper.tokenizer import Tokenizer


class LogitFilter:
    def apply(self, logits: mx.array, tokens: mx.array) -> mx.array:
        """`logits` `[n_batch, n_vocab]` after masking, given the `[n_batch, length]` tokens so far."""
        raise NotImplementedError


class SuppressBlank(LogitFilter):
    """At the first sampled position, forbid " " and EOT (an empty transcript)."""

    def __init__(self, tokenizer: Tokenizer, sample_begin: int, n_vocab: int):
        self.sample_begin = sample_begin
        mask = np.zeros(n_vocab, np.float32)
        mask[[*tokenizer.encode(" "), tokenizer.eot]] = -np.inf
        self.mask = mx.array(mask)

    def apply(self, logits: mx.array, tokens: mx.array) -> mx.array:
        if tokens.shape[1] == self.sample_begin:
            return logits + self.mask
        return logits


class SuppressTokens(LogitFilter):
    """Forbid a fixed set of tokens at every step."""

    def __init__(self, suppress_tokens: Sequence[int], n_vocab: int):
        mask = np.zeros(n_vocab, np.float32)
        mask[list(suppress_tokens)] = -np.inf
        self.mask = mx.array(mask)

    def apply(self, logits: mx.array, tokens: mx.array) -> mx.array:
        return logits + self.mask


class ApplyTimestampRules(LogitFilter):
    """Timestamp grammar: never `<|notimestamps|>`; timestamps come in pairs (except right
    before EOT); the first sampled token is a timestamp no later than
    `max_initial_timestamp_index`; and a timestamp is forced whenever the timestamps'
    total probability beats every single text token's.

    The monotonic rule (no timestamp before the last one) runs only with
    `fix_monotonic_timestamps`: mlx-whisper's version of it masks an empty range.
    `openai_whisper=True` is openai-whisper's filter (the beam-search reference): the
    monotonic rule, and the timestamp-vs-text comparison made on the logits after the
    grammar mask, where mlx-whisper compares the logits as they came in.

    mlx-whisper reads the token list back to the host every step (`tokens.tolist()`) and
    builds the grammar mask in numpy row by row. Here the mask is a function of arrays: what
    the rules read (the last and penultimate sampled token, the last sampled timestamp) is
    sliced from `tokens` on the device, and how many tokens were sampled is its shape, which
    the host knows. Nothing is read back, so the decode loop can queue the next step before
    the current one is done. The mask holds the same values (0 or -inf) at the same places,
    and the timestamp-vs-text comparison uses mlx-whisper's very ops and dtype (float32
    logsumexp and max with keepdims, `>`), so the filtered logits are the same bits.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        sample_begin: int,
        max_initial_timestamp_index: int | None,
        fix_monotonic_timestamps: bool = False,
        openai_whisper: bool = False,
    ):
        self.tokenizer = tokenizer
        self.sample_begin = sample_begin
        self.max_initial_timestamp_index = max_initial_timestamp_index
        self.fix_monotonic_timestamps = fix_monotonic_timestamps or openai_whisper
        self.openai_whisper = openai_whisper
        self._constants: _GrammarMasks | None = None

    def _masks(self, n_vocab: int) -> _GrammarMasks:
        if self._constants is None or self._constants.n_vocab != n_vocab:
            self._constants = _GrammarMasks.build(self.tokenizer, n_vocab, self.max_initial_timestamp_index)
        return self._constants

    def grammar_mask(self, tokens: mx.array, n_vocab: int) -> mx.array:
        """`[n_batch or 1, n_vocab]` float32, 0 or -inf: what the grammar forbids after `tokens`."""
        masks = self._masks(n_vocab)
        timestamp_begin = self.tokenizer.timestamp_begin
        n_sampled = tokens.shape[1] - self.sample_begin
        if n_sampled == 0:
            return masks.initial
        last_was_timestamp = tokens[:, -1] >= timestamp_begin
        if n_sampled >= 2:
            penultimate_was_timestamp = tokens[:, -2] >= timestamp_begin
            # 0: text last; 1: a pair just closed (text or EOT next); 2: a pair is open (its
            # closing timestamp or EOT next)
            state = last_was_timestamp.astype(mx.int32) * (2 - penultimate_was_timestamp.astype(mx.int32))
        else:  # a lone first timestamp closes a pair
            state = last_was_timestamp.astype(mx.int32)
        mask = masks.by_state[state]
        if self.fix_monotonic_timestamps:
            # openai-whisper: no going back; a new segment must not be empty either
            sampled = tokens[:, self.sample_begin :]
            positions = mx.arange(1, n_sampled + 1, dtype=mx.int32)[None]
            last_position = mx.max(mx.where(sampled >= timestamp_begin, positions, 0), axis=1, keepdims=True)
            last_timestamp = mx.take_along_axis(sampled, mx.maximum(last_position - 1, 0), axis=1).astype(mx.int32)
            bound = mx.where(state[:, None] == 2, last_timestamp, last_timestamp + 1)
            going_back = (last_position > 0) & masks.is_timestamp & (masks.vocab < bound)
            mask = mx.where(going_back, _NEG_INF, mask)
        return mask

    def apply(self, logits: mx.array, tokens: mx.array) -> mx.array:
        timestamp_begin = self.tokenizer.timestamp_begin
        mask = self.grammar_mask(tokens, logits.shape[-1])
        if self.openai_whisper:
            logits, mask = logits + mask, mx.zeros_like(mask)
        # mlx-whisper: the comparison uses the logits as they came in (earlier filters
        # applied, this filter's grammar mask not); openai-whisper: after the grammar mask.
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        timestamp_logprob = logprobs[:, timestamp_begin:].logsumexp(axis=-1, keepdims=True)
        max_text_token_logprob = logprobs[:, :timestamp_begin].max(axis=-1, keepdims=True)
        text = self._masks(logits.shape[-1]).is_text
        mask = mx.where((timestamp_logprob > max_text_token_logprob) & text, _NEG_INF, mask)
        return logits + mask


@dataclass(frozen=True)
class _GrammarMasks:
    """ApplyTimestampRules' constant masks for one vocabulary size, built once per filter."""

    n_vocab: int
    vocab: mx.array  # [1, n_vocab] int32 token ids
    is_timestamp: mx.array  # [1, n_vocab] bool
    is_text: mx.array  # [1, n_vocab] bool: below the first timestamp (EOT and the other specials too)
    initial: mx.array  # [1, n_vocab] float32: the first sampled token's mask
    by_state: mx.array  # [3, n_vocab] float32: text last, a pair closed, a pair open

    @classmethod
    def build(cls, tokenizer: Tokenizer, n_vocab: int, max_initial_timestamp_index: int | None) -> _GrammarMasks:
        timestamp_begin, eot = tokenizer.timestamp_begin, tokenizer.eot
        by_state = np.zeros((3, n_vocab), np.float32)
        by_state[:, tokenizer.no_timestamps] = -np.inf
        by_state[1, timestamp_begin:] = -np.inf
        by_state[2, :eot] = -np.inf
        initial = by_state[:1].copy()
        initial[:, :timestamp_begin] = -np.inf
        if max_initial_timestamp_index is not None:
            initial[:, timestamp_begin + max_initial_timestamp_index + 1 :] = -np.inf
        vocab = mx.arange(n_vocab, dtype=mx.int32)[None]
        is_timestamp = vocab >= timestamp_begin
        masks = cls(n_vocab, vocab, is_timestamp, ~is_timestamp, mx.array(initial), mx.array(by_state))
        mx.eval(masks.vocab, masks.is_timestamp, masks.is_text, masks.initial, masks.by_state)
        return masks


_NEG_INF = mx.array(-mx.inf, dtype=mx.float32)
