"""Word-level timestamps: mlx-whisper 0.4.3's timing stage, computing what it computes.

The decoder is run once more over a window's text with the audio, and the cross-attention
scores of the checkpoint's alignment heads say which audio frame each token listens to:
softmax over frames, standardised over tokens, median-filtered over frames, averaged over
heads; dynamic time warping then finds the monotonic token-to-frame path, and a word
starts where its first token's path first reaches it. Punctuation is merged into the
neighbouring words, and a few duration heuristics trim words that run into silence.

Every step keeps the reference's arithmetic, because each changes bits:

- the scores, their softmax and standardisation are MLX ops (precise softmax, `mx.var`
  with ddof 0, then `sqrt`), in the order mlx-whisper writes them;
- the median filter, the mean over heads and the word times are numpy: float32 medians of
  a reflect-padded window (a median of an odd count is one of the inputs, so any exact
  selection gives the same bits), float32 `mean(axis=0)`, float64 times (`frame / 50`);
- the DTW accumulates float32 costs, with ties broken as the reference does (diagonal only
  when strictly cheapest, then up when strictly cheapest, else left);
- word times are rounded with numpy's `round(np.float64, 2)` (scale, round half to even,
  unscale), which is not Python's decimal-correct `round(float, 2)`; the values stay numpy
  float64 here, as they are in mlx-whisper's result (`transcribe` hands out Python floats).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from models.whisper.audio import HOP_LENGTH, SAMPLE_RATE, TOKENS_PER_SECOND
from models.whisper.tokenizer import Tokenizer

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
MEDFILT_WIDTH = 7


@dataclass
class WordTiming:
    """One word of the alignment: its text, tokens, start and end (seconds into the window,
    numpy float64) and mean token probability (numpy float32)."""

    word: str
    tokens: list[int]
    start: Any
    end: Any
    probability: Any


def median_filter(x: np.ndarray, filter_width: int) -> np.ndarray:
    """Median over a sliding window of `filter_width` (odd) along the last axis, the ends
    reflect-padded; rows no longer than half the width come back unchanged (the reference
    cannot reflect-pad them)."""
    if filter_width <= 0 or filter_width % 2 != 1:
        raise ValueError(f"median filter width must be a positive odd number, got {filter_width}")
    half = filter_width // 2
    if x.shape[-1] <= half:
        return x
    pad = [(0, 0)] * (x.ndim - 1) + [(half, half)]
    padded = np.pad(x, pad, mode="reflect").astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(padded, filter_width, axis=-1)
    # The middle of each sorted window: exactly one of its values, no arithmetic.
    return np.sort(windows, axis=-1)[..., half]


def dtw(cost_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost_matrix` `[N, M]` (float32), from (0, 0) to
    (N-1, M-1): (row indices, column indices), int64, one entry per step. With M = 0 (a window of
    one Mel frame has no audio position) every row gets column -1, as the reference's backtrace.
    Accumulated costs are float32 as in the reference; a cell's cost depends only on its
    upper, left and upper-left neighbours, so whole anti-diagonals are computed at once.
    """
    x = np.asarray(cost_matrix, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"dtw needs a non-empty 2-D cost matrix (at least one row), got shape {x.shape}")
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    cost[0, 0] = 0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for diagonal in range(2, n + m + 1):
        i = np.arange(max(1, diagonal - m), min(n, diagonal - 1) + 1)
        j = diagonal - i
        diag, up, left = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        take_diag = (diag < up) & (diag < left)
        take_up = ~take_diag & (up < diag) & (up < left)
        step = np.where(take_diag, 0, np.where(take_up, 1, 2)).astype(np.int8)
        best = np.where(take_diag, diag, np.where(take_up, up, left))
        cost[i, j] = x[i - 1, j - 1] + best
        trace[i, j] = step
    return _backtrace(trace)


def _backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walk `trace` back from its last cell; the first row leads left, the first column up."""
    trace = trace.copy()
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        elif step == 2:
            j -= 1
        else:
            raise ValueError(f"dtw: cell ({i}, {j}) was never reached")
    path_array = np.array(path[::-1], dtype=np.int64)
    return path_array[:, 0], path_array[:, 1]


def alignment_weights(
    cross_qk: Sequence[mx.array], alignment_heads: Sequence[Sequence[int]], num_frames: int, qk_scale: float = 1.0
) -> mx.array:
    """Per alignment head `[heads, tokens, frames]`: softmax over the window's first
    `num_frames // 2` audio positions, then standardised over tokens (float32)."""
    weights = mx.stack([cross_qk[layer][0, head] for layer, head in alignment_heads])
    weights = weights[:, :, : num_frames // 2]
    weights = mx.softmax(weights * qk_scale, axis=-1, precise=True).astype(mx.float32)
    mean = mx.mean(weights, axis=-2, keepdims=True)
    std = mx.var(weights, axis=-2, keepdims=True, ddof=0).sqrt()
    return (weights - mean) / std


def find_alignment(
    model: Any,
    tokenizer: Tokenizer,
    text_tokens: list[int],
    mel: mx.array,
    num_frames: int,
    *,
    medfilt_width: int = MEDFILT_WIDTH,
    qk_scale: float = 1.0,
) -> list[WordTiming]:
    """Words of `text_tokens` with window-relative times from `mel` (one padded window,
    `[n_frames, n_mels]`, of which the first `num_frames` are audio)."""
    if len(text_tokens) == 0:
        return []
    sot_length = len(tokenizer.sot_sequence)
    tokens = mx.array([*tokenizer.sot_sequence, tokenizer.no_timestamps, *text_tokens, tokenizer.eot])
    logits, cross_qk = model.forward_with_cross_qk(mel[None, :], tokens[None, :])

    # The probability of each text token where it was predicted (after no_timestamps ... up
    # to the last text token), over the text vocabulary only.
    text_logits = logits[0][sot_length:-2, : tokenizer.eot]
    token_probs = mx.softmax(text_logits, precise=True, axis=-1)
    text_token_probs = np.array(mx.take_along_axis(token_probs, mx.array(text_tokens)[:, None], axis=1).squeeze(1))

    heads = model.alignment_heads.tolist()
    weights = median_filter(np.array(alignment_weights(cross_qk, heads, num_frames, qk_scale)), medfilt_width)
    matrix = weights.mean(axis=0)[sot_length:-1]  # no_timestamps, the text and EOT rows
    text_indices, time_indices = dtw(-matrix)

    words, word_tokens = tokenizer.split_to_word_tokens(text_tokens + [tokenizer.eot])
    if len(word_tokens) <= 1:  # only EOT: no words
        return []
    word_boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    # Where the path first enters each token row (moves down), in seconds.
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    probabilities = [
        np.mean(text_token_probs[begin:end])
        for begin, end in zip(word_boundaries[:-1], word_boundaries[1:], strict=True)
    ]
    return [
        WordTiming(word, tokens_of_word, start, end, probability)
        for word, tokens_of_word, start, end, probability in zip(
            words, word_tokens, start_times, end_times, probabilities, strict=False
        )
    ]


def merge_punctuations(alignment: list[WordTiming], prepended: str, appended: str) -> None:
    """Fold opening punctuation (a spaced word in `prepended`) into the word after it and
    closing punctuation (a word in `appended`) into the word before it, in place; the
    emptied entries stay, with no text and no tokens."""
    # Right to left: a run of openers all lands on the word that follows the run.
    target = len(alignment) - 1
    for index in range(len(alignment) - 2, -1, -1):
        previous, following = alignment[index], alignment[target]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            target = index
    # Left to right: a run of closers all lands on the word before the run.
    target = 0
    for index in range(1, len(alignment)):
        previous, following = alignment[target], alignment[index]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            target = index


def add_word_timestamps(
    *,
    segments: list[dict[str, Any]],
    model: Any,
    tokenizer: Tokenizer,
    mel: mx.array,
    num_frames: int,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
    last_speech_timestamp: float,
    **alignment_options: Any,
) -> None:
    """Give each of one window's `segments` its `words` (word, start, end, probability),
    and move the segment's start/end to its words' where the heuristics say so."""
    if len(segments) == 0:
        return
    text_tokens_per_segment = [[t for t in segment["tokens"] if t < tokenizer.eot] for segment in segments]
    text_tokens = list(itertools.chain.from_iterable(text_tokens_per_segment))
    alignment = find_alignment(model, tokenizer, text_tokens, mel, num_frames, **alignment_options)

    durations = np.array([timing.end - timing.start for timing in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations) if len(durations) > 0 else 0.0))
    max_duration = median_duration * 2

    # Words at sentence boundaries tend to swallow the pause next to them: at most twice
    # the median duration.
    if len(durations) > 0:
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - max_duration

    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    time_offset = segments[0]["seek"] * HOP_LENGTH / SAMPLE_RATE
    word_index = 0
    for segment, segment_text_tokens in zip(segments, text_tokens_per_segment, strict=True):
        consumed = 0
        words = []
        while word_index < len(alignment) and consumed < len(segment_text_tokens):
            timing = alignment[word_index]
            if timing.word:
                words.append(
                    {
                        "word": timing.word,
                        "start": round(time_offset + timing.start, 2),
                        "end": round(time_offset + timing.end, 2),
                        "probability": float(timing.probability),
                    }
                )
            consumed += len(timing.tokens)
            word_index += 1
        if len(words) > 0:
            _trim_after_pause(words, last_speech_timestamp, median_duration, max_duration)
            _reconcile_with_segment(segment, words, median_duration)
            last_speech_timestamp = segment["end"]
        segment["words"] = words


# A pause is longer than this many median word durations (mlx-whisper's add_word_timestamps: 4).
PAUSE_MEDIANS = 4


def _trim_after_pause(
    words: list[dict[str, Any]], last_speech_timestamp: float, median_duration: float, max_duration: float
) -> None:
    """The first (and second) word after a long pause is at most `max_duration` long."""
    first = words[0]
    after_pause = first["end"] - last_speech_timestamp > median_duration * PAUSE_MEDIANS
    too_long = first["end"] - first["start"] > max_duration or (
        len(words) > 1 and words[1]["end"] - first["start"] > max_duration * 2
    )
    if after_pause and too_long:
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - max_duration)


def _reconcile_with_segment(segment: dict[str, Any], words: list[dict[str, Any]], median_duration: float) -> None:
    """A first or last word reaching half a second past the segment's timestamp is cut back
    to it; otherwise the segment takes its words' start and end."""
    if segment["start"] < words[0]["end"] and segment["start"] - 0.5 > words[0]["start"]:
        words[0]["start"] = max(0, min(words[0]["end"] - median_duration, segment["start"]))
    else:
        segment["start"] = words[0]["start"]
    if segment["end"] > words[-1]["start"] and segment["end"] + 0.5 < words[-1]["end"]:
        words[-1]["end"] = max(words[-1]["start"] + median_duration, segment["end"])
    else:
        segment["end"] = words[-1]["end"]
