"""Choosing tokens (openai-whisper's TokenDecoder and SequenceRanker): the compiled
temperature sampler, the greedy / sampling decoder, beam search, and the ranker that keeps one
of each audio's finished sequences."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from models.whisper.inference import Inference


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
        # In place, as in mlx-whisper: the step computed past the end (see `DecodingTask._main_loop`)
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
