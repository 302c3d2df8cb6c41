"""Decoding one 30-second window, computing exactly what mlx-whisper 0.4.3's DecodingTask does.

One `DecodingTask` per window and temperature: encode the Mel window, build the prompt
(`<|startofprev|>` + previous text, the start-of-transcript sequence, an optional prefix),
then one decoder call per step. Each step takes the last position's logits (cast to
float32) and passes them through the logit filters in mlx-whisper's order —
`SuppressBlank`, `SuppressTokens`, `ApplyTimestampRules` — before the `GreedyDecoder`
picks the next token (argmax at T=0, `mx.random.categorical(logits / T)` otherwise).
The `MaximumLikelihoodRanker` picks one of `best_of` samples.

What changes bits or decisions is reproduced as the oracle does it:

- float32 running `sum_logprobs` on device; `avg_logprob = sum / (len(tokens) + 1)` in
  Python floats; `no_speech_prob` is the softmax at the start-of-transcript position of
  the FIRST step's logits; `compression_ratio` via CPython's zlib at level 6.
- The step loop computes one more step after every sequence has ended (the oracle
  overlaps a step with the completion check) and throws it away; that step's logits are
  still computed, and observed here, and at T>0 it draws from the sampler.
- Sampling: see `TemperatureSampler` (the random key is drawn once per compiled trace).
- `ApplyTimestampRules`' "timestamps must not decrease" rule never fires in mlx-whisper
  (it collects positions, not timestamp tokens, and masks an empty range). The default
  reproduces that; `DecodingOptions(fix_monotonic_timestamps=True)` applies
  openai-whisper's rule instead (the logits before the filters are unchanged, the chosen
  tokens and `avg_logprob` may change).

Instrumentation: a `DecodeObserver` sees every step's logits before the filters and the
token appended after them; `forced_tokens` (per batch member, its tokens up to its first
EOT) feeds given tokens instead of the chosen ones (teacher forcing), everything else
computed as usual.

Beam search (`DecodingOptions.beam_size`): mlx-whisper raises NotImplementedError, so its
reference is openai-whisper (20250625), and a beam-search task follows openai-whisper's
DecodingTask wherever that differs from mlx-whisper's: its `BeamSearchDecoder` (see there),
its step loop (no step past the end: it stops right after the update that completes the
search), and its `ApplyTimestampRules` (the monotonic rule, and the timestamp-vs-text
comparison on the logits after the grammar mask). Teacher forcing has no beam-search path.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import numpy as np
import tiktoken

from models.whisper.audio import CHUNK_LENGTH
from models.whisper.tokenizer import Tokenizer, get_tokenizer


def compression_ratio(text: str) -> float:
    """UTF-8 length over zlib-compressed length (level 6): high for repetitive text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def detect_language(model: Any, mel: mx.array, tokenizer: Tokenizer) -> tuple[mx.array, list[dict[str, float]]]:
    """Most probable language token per audio, and the probabilities of every language.

    `mel` may be a Mel window (`[n_mels, frames]`-shaped per audio as the encoder takes
    it) or already-encoded audio features. One decoder call on `<|startoftranscript|>`;
    every non-language logit is masked before argmax and softmax.
    """
    if tokenizer.language is None or tokenizer.language_token not in tokenizer.sot_sequence:
        raise ValueError("This model doesn't have language tokens so it can't perform lang id")
    single = mel.ndim == 2
    if single:
        mel = mel[None]
    if mel.shape[-2:] != (model.dims.n_audio_ctx, model.dims.n_audio_state):
        mel = model.embed_audio(mel)

    n_audio = mel.shape[0]
    logits = model.logits(mx.array([[tokenizer.sot]] * n_audio), mel)[0][:, 0]
    only_languages = mx.full(logits.shape[-1], -mx.inf, dtype=mx.float32)
    only_languages[list(tokenizer.all_language_tokens)] = 0.0
    logits += only_languages
    language_tokens = mx.argmax(logits, axis=-1)
    probs = np.array(mx.softmax(logits, axis=-1))
    language_probs = [
        {
            code: probs[i, token].item()
            for token, code in zip(tokenizer.all_language_tokens, tokenizer.all_language_codes, strict=True)
        }
        for i in range(n_audio)
    ]
    if single:
        return language_tokens[0], language_probs[0]
    return language_tokens, language_probs


@dataclass(frozen=True)
class DecodingOptions:
    """mlx-whisper's DecodingOptions, plus `fix_monotonic_timestamps` (see the module docstring)."""

    task: str = "transcribe"  # "transcribe", "translate" or "lang_id"
    language: str | None = None  # detected when None
    temperature: float = 0.0
    sample_len: int | None = None  # at most this many steps; n_text_ctx // 2 when None
    best_of: int | None = None  # independent samples at T > 0
    beam_size: int | None = None  # beam search with openai-whisper's semantics (see the module docstring)
    patience: float | None = None  # beam search: stop at round(beam_size * patience) finished sequences
    length_penalty: float | None = None  # Google NMT alpha; plain length normalization when None
    prompt: str | list[int] | None = None  # previous context, after <|startofprev|>
    prefix: str | list[int] | None = None  # forced start of the current window's text
    suppress_tokens: str | Iterable[int] | None = "-1"  # "-1" adds the non-speech tokens
    suppress_blank: bool = True  # no blank or EOT as the first sampled token
    without_timestamps: bool = False  # <|notimestamps|> in the prompt, text tokens only
    max_initial_timestamp: float | None = 1.0
    fp16: bool = True
    fix_monotonic_timestamps: bool = False


@dataclass(frozen=True)
class DecodingResult:
    audio_features: mx.array
    language: str
    language_probs: dict[str, float] | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    avg_logprob: float = np.nan
    no_speech_prob: float = np.nan
    temperature: float = np.nan
    compression_ratio: float = np.nan


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


class MaximumLikelihoodRanker:
    """Picks the sample with the highest sum of log-probabilities over its length penalty:
    the length itself, or ((5 + length) / 6) ** alpha (Google NMT) when alpha is given."""

    def __init__(self, length_penalty: float | None):
        self.length_penalty = length_penalty

    def rank(self, tokens: list[list[list[int]]], sum_logprobs: list[list[float]]) -> list[int]:
        def score(logprob: float, length: int) -> float:
            penalty = length if self.length_penalty is None else ((5 + length) / 6) ** self.length_penalty
            return logprob / penalty

        return [
            int(np.argmax([score(lp, len(t)) for lp, t in zip(group_logprobs, group, strict=True)]))
            for group, group_logprobs in zip(tokens, sum_logprobs, strict=True)
        ]


def _sample_categorical(logits: mx.array, temperature: float) -> mx.array:
    return mx.random.categorical(logits / temperature)


class TemperatureSampler:
    """`mx.random.categorical(logits / T)` inside `mx.compile`, as mlx-whisper samples.

    mx.compile traces the function on its first call for each (logits shape, T); the
    random key drawn from the global generator during that trace becomes a constant of
    the compiled graph. So every later call with the same shape and T reuses the same
    Gumbel noise, and only a new trace (a new shape or T) draws a new key. mlx-whisper
    keeps one compiled sampler per process; each instance of this class is one such trace
    cache (a new instance samples like mlx-whisper in a fresh process).
    """

    def __init__(self) -> None:
        self._sample = mx.compile(_sample_categorical)

    def __call__(self, logits: mx.array, temperature: float) -> mx.array:
        return self._sample(logits, temperature)


PROCESS_SAMPLER = TemperatureSampler()


class GreedyDecoder:
    """Argmax at T=0, a categorical sample at T>0; a finished sequence keeps appending EOT."""

    def __init__(self, temperature: float, eot: int, sampler: TemperatureSampler | None = None):
        self.temperature = temperature
        self.eot = eot
        self.sampler = sampler or PROCESS_SAMPLER

    def reset(self) -> None:
        pass

    def update(
        self, tokens: mx.array, logits: mx.array, sum_logprobs: mx.array, forced: mx.array | None = None
    ) -> tuple[mx.array, mx.array, mx.array]:
        """`(tokens + next token, all ended?, updated sum_logprobs)`; `forced` replaces the choice."""
        if self.temperature == 0:
            next_tokens = logits.argmax(axis=-1)
        else:
            next_tokens = self.sampler(logits, self.temperature)
        ended = tokens[:, -1] == self.eot
        if forced is not None:
            # An ended sequence keeps its own choice: it only ever adds 0 x its (finite)
            # log-probability, where a forced EOT's could be -inf and make 0 x -inf = NaN.
            next_tokens = mx.where(ended, next_tokens, forced)

        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen_logprobs = logprobs[mx.arange(logprobs.shape[0]), next_tokens]
        # In place, as in mlx-whisper: the step computed past the end (see `_main_loop`)
        # adds its 0 x log-probability to the sums the caller keeps.
        sum_logprobs += chosen_logprobs * (tokens[:, -1] != self.eot)
        next_tokens = next_tokens * (1 - ended) + self.eot * ended
        tokens = mx.concatenate([tokens, next_tokens[:, None]], axis=-1)
        return tokens, mx.all(tokens[:, -1] == self.eot), sum_logprobs

    def finalize(self, tokens: mx.array, sum_logprobs: mx.array) -> tuple[mx.array, mx.array]:
        # every sequence gets at least one EOT at its end
        return mx.pad(tokens, [(0, 0), (0, 0), (0, 1)], constant_values=self.eot), sum_logprobs


class BeamSearchDecoder:
    """openai-whisper's beam search over `beam_size` rows per audio, at most `sample_len` steps.

    Each step, every row proposes its `beam_size + 1` most probable next tokens (top-k of
    its log-probabilities on the device; only the `[rows, k]` slice is read back) scored
    by the row's float32 sum plus the token's log-probability, added in float32. Per
    audio, the candidates are ranked by score (descending; equal scores keep proposal
    order: row-major, then top-k order). A sequence proposed twice (at the first step all
    rows hold the prompt) keeps its first place in that order and its last proposal's score
    and row. Walking the ranking, a candidate ending in EOT is set aside as finished and
    any other becomes the next beam row, until `beam_size` rows are filled; the finished
    ones ranked above the last filled row are then added to the audio's finished
    sequences, best first, while it holds fewer than `round(beam_size * patience)`. The
    search completes when every audio holds that many. The self-attention cache rows are
    gathered to follow the rows' sources.

    Equal log-probabilities within a row come out lowest token id first (openai-whisper
    takes torch's CPU top-k order, which leaves equal values unordered): only a tie
    between two candidates decides anything, so this matters only on exactly equal float32
    scores, or when a row has fewer than `beam_size + 1` finite log-probabilities.
    """

    def __init__(self, beam_size: int, eot: int, inference: Inference, patience: float | None = None):
        self.beam_size = beam_size
        self.eot = eot
        self.inference = inference
        self.patience = patience or 1.0  # openai-whisper: None and 0 both mean 1
        self.max_candidates = round(beam_size * self.patience)
        if beam_size < 1 or self.max_candidates < 1:
            raise ValueError(
                f"beam search: beam_size {beam_size} and patience {patience} leave "
                f"{self.max_candidates} finished sequences to wait for (expected at least 1)"
            )
        self.finished: list[dict[tuple[int, ...], float]] | None = None

    def reset(self) -> None:
        self.finished = None

    def top_candidates(self, logits: mx.array, sum_logprobs: mx.array) -> tuple[list[list[int]], list[list[float]]]:
        """Per row, its `beam_size + 1` best tokens and their float32 scores, best first."""
        k = self.beam_size + 1
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token_ids = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
        scores = sum_logprobs[:, None] + mx.take_along_axis(logprobs, token_ids, axis=-1)
        mx.eval(token_ids, scores)
        ids, values = token_ids.tolist(), scores.tolist()
        ranked_ids, ranked_scores = [], []
        for row_ids, row_scores in zip(ids, values, strict=True):
            order = sorted(range(k), key=lambda c: (-row_scores[c], row_ids[c]))
            ranked_ids.append([row_ids[c] for c in order])
            ranked_scores.append([row_scores[c] for c in order])
        return ranked_ids, ranked_scores

    def update(self, tokens: mx.array, logits: mx.array, sum_logprobs: mx.array) -> tuple[mx.array, bool, mx.array]:
        """(the new beam rows, search completed?, their sums); `tokens` `[n_audio * beam_size, length]`."""
        n_rows = tokens.shape[0]
        if n_rows % self.beam_size != 0:
            raise ValueError(f"beam search: {n_rows} rows is not a multiple of beam_size {self.beam_size}")
        n_audio = n_rows // self.beam_size
        if self.finished is None:
            self.finished = [{} for _ in range(n_audio)]
        token_ids, scores = self.top_candidates(logits, sum_logprobs)
        rows = tokens.tolist()

        next_rows: list[list[int]] = []
        next_sums: list[float] = []
        sources: list[int] = []
        for audio in range(n_audio):
            # proposal order; a repeated sequence keeps its first slot, its last score and row
            proposals: dict[tuple[int, ...], tuple[float, int]] = {}
            for row in range(audio * self.beam_size, (audio + 1) * self.beam_size):
                for token, score in zip(token_ids[row], scores[row], strict=True):
                    proposals[(*rows[row], token)] = (score, row)
            ranking = sorted(proposals.items(), key=lambda item: -item[1][0])  # stable: ties keep order
            newly_finished: list[tuple[tuple[int, ...], float]] = []
            filled = 0
            for sequence, (score, row) in ranking:
                if sequence[-1] == self.eot:
                    newly_finished.append((sequence, score))
                    continue
                next_rows.append(list(sequence))
                next_sums.append(score)
                sources.append(row)
                filled += 1
                if filled == self.beam_size:
                    break
            finished = self.finished[audio]
            for sequence, score in newly_finished:  # already best first
                if len(finished) >= self.max_candidates:
                    break
                finished[sequence] = score

        self.inference.reorder(sources)
        completed = all(len(finished) >= self.max_candidates for finished in self.finished)
        return mx.array(next_rows), completed, mx.array(next_sums, dtype=mx.float32)

    def finalize(
        self, tokens: list[list[list[int]]], sum_logprobs: list[list[float]]
    ) -> tuple[list[list[list[int]]], list[list[float]]]:
        """Per audio, its finished sequences (each ending in EOT) and their sums, in the order
        they finished; an audio with fewer than `beam_size` gets its best live rows too.

        The live rows are taken by descending sum, equal sums the later row first (the
        reverse of a stable ascending sort, as openai-whisper takes them).
        """
        if self.finished is None:
            self.finished = [{} for _ in tokens]
        for finished, rows, sums in zip(self.finished, tokens, sum_logprobs, strict=True):
            by_sum = sorted(range(len(rows)), key=lambda r: sums[r])[::-1]
            for row in by_sum:
                if len(finished) >= self.beam_size:
                    break
                finished[(*rows[row], self.eot)] = sums[row]
        return (
            [[list(sequence) for sequence in finished] for finished in self.finished],
            [list(finished.values()) for finished in self.finished],
        )


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


class DecodingTask:
    """One decode call: `run(mel)` encodes the window and samples until EOT or `sample_len`."""

    def __init__(
        self,
        model: Any,
        options: DecodingOptions,
        encoding: tiktoken.Encoding,
        *,
        sampler: TemperatureSampler | None = None,
        observer: DecodeObserver | None = None,
        forced_tokens: Sequence[Sequence[int]] | None = None,
    ):
        self.model = model
        self.tokenizer = get_tokenizer(
            encoding,
            multilingual=model.is_multilingual,
            num_languages=model.num_languages,
            language=options.language or "en",
            task=options.task,
        )
        self.options = self._verify_options(options)
        self.observer = observer or DecodeObserver()
        self.forced_tokens = forced_tokens

        self.n_group = options.beam_size or options.best_of or 1
        self.n_ctx = model.dims.n_text_ctx
        self.sample_len = options.sample_len or model.dims.n_text_ctx // 2

        self.sot_sequence = self.tokenizer.sot_sequence
        if options.without_timestamps:
            self.sot_sequence = self.tokenizer.sot_sequence_including_notimestamps
        self.initial_tokens = self._initial_tokens()
        self.sample_begin = len(self.initial_tokens)
        self.sot_index = self.initial_tokens.index(self.tokenizer.sot)

        self.inference = Inference(model)
        self.sequence_ranker = MaximumLikelihoodRanker(options.length_penalty)
        self.decoder: GreedyDecoder | BeamSearchDecoder
        if options.beam_size is not None:
            if forced_tokens is not None:
                raise ValueError(
                    "teacher forcing (forced_tokens) is not supported with beam search (beam_size): "
                    "a beam row's tokens come from the search itself"
                )
            self.decoder = BeamSearchDecoder(options.beam_size, self.tokenizer.eot, self.inference, options.patience)
        else:
            self.decoder = GreedyDecoder(options.temperature, self.tokenizer.eot, sampler)
        self.logit_filters = self._logit_filters()

    def _logit_filters(self) -> list[LogitFilter]:
        n_vocab = self.model.dims.n_vocab
        filters: list[LogitFilter] = []
        if self.options.suppress_blank:
            filters.append(SuppressBlank(self.tokenizer, self.sample_begin, n_vocab))
        if self.options.suppress_tokens:
            filters.append(SuppressTokens(self._suppress_tokens(), n_vocab))
        if not self.options.without_timestamps:
            precision = CHUNK_LENGTH / self.model.dims.n_audio_ctx  # 0.02 s per audio position
            max_initial_timestamp_index = None
            if self.options.max_initial_timestamp:
                max_initial_timestamp_index = round(self.options.max_initial_timestamp / precision)
            filters.append(
                ApplyTimestampRules(
                    self.tokenizer,
                    self.sample_begin,
                    max_initial_timestamp_index,
                    self.options.fix_monotonic_timestamps,
                    openai_whisper=self.beam_search,
                )
            )
        return filters

    @property
    def beam_search(self) -> bool:
        """Beam search follows openai-whisper's DecodingTask (see the module docstring)."""
        return self.options.beam_size is not None

    @staticmethod
    def _verify_options(options: DecodingOptions) -> DecodingOptions:
        if options.beam_size is not None and options.best_of is not None:
            raise ValueError("beam_size and best_of can't be given together")
        if options.temperature == 0 and options.best_of is not None:
            raise ValueError("best_of with greedy sampling (T=0) is not compatible")
        if options.patience is not None and options.beam_size is None:
            raise ValueError("patience requires beam_size to be given")
        if options.length_penalty is not None and not 0 <= options.length_penalty <= 1:
            raise ValueError("length_penalty (alpha) should be a value between 0 and 1")
        return options

    def _initial_tokens(self) -> tuple[int, ...]:
        tokens = list(self.sot_sequence)
        if prefix := self.options.prefix:
            prefix_tokens = self.tokenizer.encode(" " + prefix.strip()) if isinstance(prefix, str) else prefix
            if self.sample_len is not None:
                # Sliced as the oracle does: with the default sample_len the budget is 0, and
                # [-0:] keeps the whole prefix (a negative budget drops its head).
                prefix_tokens = prefix_tokens[-(self.n_ctx // 2 - self.sample_len) :]
            tokens = tokens + list(prefix_tokens)
        if prompt := self.options.prompt:
            prompt_tokens = self.tokenizer.encode(" " + prompt.strip()) if isinstance(prompt, str) else prompt
            tokens = [self.tokenizer.sot_prev, *prompt_tokens[-(self.n_ctx // 2 - 1) :], *tokens]
        return tuple(tokens)

    def _suppress_tokens(self) -> tuple[int, ...]:
        suppress = self.options.suppress_tokens
        if isinstance(suppress, str):
            suppress = [int(t) for t in suppress.split(",")]
        if -1 in suppress:
            suppress = [t for t in suppress if t >= 0]
            suppress.extend(self.tokenizer.non_speech_tokens)
        elif suppress is None or len(suppress) == 0:
            suppress = []
        else:
            if not isinstance(suppress, list):
                raise TypeError("suppress_tokens must be a list")
            suppress = list(suppress)
        tokenizer = self.tokenizer
        suppress.extend(
            [tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm]
        )
        # the no-speech probability is read separately, from the first step's logits
        suppress.append(tokenizer.no_speech)
        return tuple(sorted(set(suppress)))

    def _audio_features(self, mel: mx.array) -> mx.array:
        if self.options.fp16:
            mel = mel.astype(mx.float16)
        if mel.shape[-2:] == (self.model.dims.n_audio_ctx, self.model.dims.n_audio_state):
            audio_features = mel  # already encoded
        else:
            audio_features = self.model.embed_audio(mel)
        if audio_features.dtype != (mx.float16 if self.options.fp16 else mx.float32):
            raise TypeError(f"audio_features has an incorrect dtype: {audio_features.dtype}")
        return audio_features

    def _detect_language(
        self, audio_features: mx.array, tokens: mx.array
    ) -> tuple[list[str], list[dict[str, float]] | None, mx.array]:
        languages = [self.options.language] * audio_features.shape[0]
        language_probs = None
        if self.options.language is None or self.options.task == "lang_id":
            language_tokens, language_probs = detect_language(self.model, audio_features, self.tokenizer)
            languages = [max(probs, key=probs.get) for probs in language_probs]
            if self.options.language is None:
                tokens = np.array(tokens)
                tokens[:, self.sot_index + 1] = np.array(language_tokens)
                tokens = mx.array(tokens)
        return languages, language_probs, tokens

    def _forced_step(self, step: int, n_batch: int) -> mx.array | None:
        if self.forced_tokens is None:
            return None
        if len(self.forced_tokens) != n_batch:
            raise ValueError(f"teacher forcing: {len(self.forced_tokens)} forced sequences for a batch of {n_batch}")
        # Past a forced sequence's end comes EOT (what an ended sequence appends anyway).
        eot = self.tokenizer.eot
        return mx.array([member[step] if step < len(member) else eot for member in self.forced_tokens], mx.uint32)

    def _step(
        self, inputs: mx.array, audio_features: mx.array, tokens: mx.array, sum_logprobs: mx.array, step: int
    ) -> tuple[mx.array, mx.array, mx.array, mx.array, mx.array]:
        pre_logits = self.inference.logits(inputs, audio_features)
        logits = pre_logits[:, -1]  # the last position only
        step_logits = logits
        for logit_filter in self.logit_filters:
            logits = logit_filter.apply(logits, tokens)
        forced = self._forced_step(step, tokens.shape[0])
        tokens, completed, sum_logprobs = self.decoder.update(tokens, logits, sum_logprobs, forced)
        return tokens, completed, sum_logprobs, pre_logits, step_logits

    def _main_loop(self, audio_features: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        n_batch = tokens.shape[0]
        sum_logprobs = mx.zeros(n_batch)
        tokens, completed, sum_logprobs, pre_logits, step_logits = self._step(
            tokens, audio_features, tokens, sum_logprobs, 0
        )
        probs_at_sot = mx.softmax(pre_logits[:, self.sot_index], axis=-1)
        no_speech_probs = probs_at_sot[:, self.tokenizer.no_speech]
        mx.async_eval(completed, tokens, sum_logprobs, no_speech_probs)
        self.observer.on_step(step_logits, tokens[:, -1], True)

        for step in range(1, self.sample_len):
            if tokens.shape[-1] > self.n_ctx:
                break
            # As the oracle does: this step is queued before the previous one's `completed`
            # is read (the only host read per step: the logit filters read nothing back), so
            # the device computes it while the host waits. A step past the end is therefore
            # computed (and sampled) and then dropped.
            next_tokens, next_completed, next_sum_logprobs, _, step_logits = self._step(
                tokens[:, -1:], audio_features, tokens, sum_logprobs, step
            )
            mx.async_eval(next_completed, next_tokens, next_sum_logprobs)
            self.observer.on_step(step_logits, next_tokens[:, -1], not completed)
            if completed:
                break
            tokens, completed, sum_logprobs = next_tokens, next_completed, next_sum_logprobs
        return tokens, sum_logprobs, no_speech_probs

    def _beam_main_loop(self, audio_features: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """openai-whisper's step loop: no step past the end, and the context check after the update."""
        decoder = self.decoder
        assert isinstance(decoder, BeamSearchDecoder)
        sum_logprobs = mx.zeros(tokens.shape[0])
        no_speech_probs = mx.full((tokens.shape[0],), mx.nan)
        for step in range(self.sample_len):
            pre_logits = self.inference.logits(tokens if step == 0 else tokens[:, -1:], audio_features)
            if step == 0:
                probs_at_sot = mx.softmax(pre_logits[:, self.sot_index], axis=-1)
                no_speech_probs = probs_at_sot[:, self.tokenizer.no_speech]
            step_logits = logits = pre_logits[:, -1]
            for logit_filter in self.logit_filters:
                logits = logit_filter.apply(logits, tokens)
            tokens, completed, sum_logprobs = decoder.update(tokens, logits, sum_logprobs)
            self.observer.on_step(step_logits, tokens[:, -1], True)
            if completed or tokens.shape[-1] > self.n_ctx:
                break
        return tokens, sum_logprobs, no_speech_probs

    def _beam_candidates(
        self, tokens: mx.array, sum_logprobs: mx.array, n_audio: int
    ) -> tuple[list[list[list[int]]], list[list[float]]]:
        """Per audio, the finished sequences (sampled tokens up to EOT) and their sums."""
        decoder = self.decoder
        assert isinstance(decoder, BeamSearchDecoder)
        mx.eval(tokens, sum_logprobs)
        rows = tokens.reshape(n_audio, self.n_group, -1).tolist()
        sums = sum_logprobs.reshape(n_audio, self.n_group).tolist()
        sequences, group_logprobs = decoder.finalize(rows, sums)
        eot = self.tokenizer.eot
        return [[s[self.sample_begin : s.index(eot)] for s in group] for group in sequences], group_logprobs

    def run(self, mel: mx.array) -> list[DecodingResult]:
        self.inference.reset()
        self.decoder.reset()
        tokenizer = self.tokenizer
        n_audio = mel.shape[0]

        audio_features = self._audio_features(mel)
        self.observer.on_audio_features(audio_features)
        tokens = mx.broadcast_to(mx.array(self.initial_tokens), (n_audio, len(self.initial_tokens)))
        languages, language_probs, tokens = self._detect_language(audio_features, tokens)
        if self.options.task == "lang_id":
            return [
                DecodingResult(audio_features=features, language=language, language_probs=probs)
                for features, language, probs in zip(audio_features, languages, language_probs, strict=True)
            ]

        if self.n_group > 1:  # best_of samples or beam rows of every audio, group-major
            tokens = mx.broadcast_to(tokens[:, None, :], [n_audio, self.n_group, len(self.initial_tokens)])
            tokens = tokens.reshape((n_audio * self.n_group, len(self.initial_tokens)))
        self.observer.on_decode_begin(self.initial_tokens, tokens.shape[0], self.options.temperature)

        if self.beam_search:
            tokens, sum_logprobs, no_speech_probs = self._beam_main_loop(audio_features, tokens)
            token_lists, group_logprobs = self._beam_candidates(tokens, sum_logprobs, n_audio)
            mx.eval(no_speech_probs)
            no_speech = no_speech_probs[:: self.n_group].tolist()
        else:
            tokens, sum_logprobs, no_speech_probs = self._main_loop(audio_features, tokens)
            no_speech_probs = no_speech_probs[:: self.n_group]
            tokens = tokens.reshape(n_audio, self.n_group, -1)
            sum_logprobs = sum_logprobs.reshape(n_audio, self.n_group)
            tokens, sum_logprobs = self.decoder.finalize(tokens, sum_logprobs)
            tokens = tokens[..., self.sample_begin :]
            mx.eval(tokens, sum_logprobs, no_speech_probs)
            token_lists = [[t[: t.index(tokenizer.eot)] for t in group] for group in tokens.tolist()]
            group_logprobs = sum_logprobs.tolist()
            no_speech = no_speech_probs.tolist()
        audio_features = audio_features[:: self.n_group]

        selected = self.sequence_ranker.rank(token_lists, group_logprobs)
        chosen_tokens = [group[i] for i, group in zip(selected, token_lists, strict=True)]
        texts = [tokenizer.decode(t).strip() for t in chosen_tokens]
        chosen_logprobs = [lps[i] for i, lps in zip(selected, group_logprobs, strict=True)]
        avg_logprobs = [lp / (len(t) + 1) for t, lp in zip(chosen_tokens, chosen_logprobs, strict=True)]

        return [
            DecodingResult(
                audio_features=features,
                language=language,
                tokens=toks,
                text=text,
                avg_logprob=avg_logprob,
                no_speech_prob=no_speech_prob,
                temperature=self.options.temperature,
                compression_ratio=compression_ratio(text),
            )
            for text, language, toks, features, avg_logprob, no_speech_prob in zip(
                texts, languages, chosen_tokens, audio_features, avg_logprobs, no_speech, strict=True
            )
        ]


def decode(
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
    """Decode one (`[frames, n_mels]`) or several Mel windows; `kwargs` override `options`."""
    options = options or DecodingOptions()
    single = mel.ndim == 2
    if single:
        mel = mel[None]
    if kwargs:
        options = replace(options, **kwargs)
    task = DecodingTask(model, options, encoding, sampler=sampler, observer=observer, forced_tokens=forced_tokens)
    result = task.run(mel)
    return result[0] if single else result
