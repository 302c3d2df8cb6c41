"""One decoded window's tokens as transcript segments: cut at timestamp pairs (which also
decides where the next window starts), emptied when instantaneous or blank, their numpy times
made Python numbers; and the helpers the word-timestamp cut reads (last word's end, a window
ending on a single timestamp)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.whisper.audio import HOP_LENGTH, SAMPLE_RATE
from models.whisper.decoding_types import DecodingResult
from models.whisper.tokenizer import Tokenizer


@dataclass(frozen=True)
class WindowSegments:
    segments: list[dict[str, Any]]
    seek_advance: int  # frames to move `seek` by


def split_segments(
    tokens: Sequence[int],
    tokenizer: Tokenizer,
    result: DecodingResult,
    *,
    seek: int,
    segment_size: int,
    input_stride: int,
) -> WindowSegments:
    """Cut one window's sampled tokens into segments at consecutive timestamp pairs.

    Ending on a single timestamp means no speech after it: the whole window is consumed.
    Otherwise the unfinished last segment is dropped and the next window starts at the
    last timestamp. Without any pair, the window is one segment, ending at its last
    timestamp when it has one (other than <|0.00|>).
    """
    tokens = np.array(tokens)
    time_offset = float(seek * HOP_LENGTH / SAMPLE_RATE)
    time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp step
    segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
    timestamp_begin = tokenizer.timestamp_begin

    def new_segment(start: float, end: float, segment_tokens: np.ndarray) -> dict[str, Any]:
        token_list = segment_tokens.tolist()
        return {
            "seek": seek,
            "start": start,
            "end": end,
            "text": tokenizer.decode([t for t in token_list if t < tokenizer.eot]),
            "tokens": token_list,
            "temperature": result.temperature,
            "avg_logprob": result.avg_logprob,
            "compression_ratio": result.compression_ratio,
            "no_speech_prob": result.no_speech_prob,
        }

    is_timestamp = tokens >= timestamp_begin
    single_timestamp_ending = is_timestamp[-2:].tolist() == [False, True]
    pair_ends = np.where(np.logical_and(is_timestamp[:-1], is_timestamp[1:]))[0] + 1

    segments = []
    if len(pair_ends) > 0:
        cuts = pair_ends.tolist()
        if single_timestamp_ending:
            cuts.append(len(tokens))
        last_cut = 0
        for cut in cuts:
            piece = tokens[last_cut:cut]
            start_position = piece[0].item() - timestamp_begin
            end_position = piece[-1].item() - timestamp_begin
            segments.append(
                new_segment(
                    time_offset + start_position * time_precision, time_offset + end_position * time_precision, piece
                )
            )
            last_cut = cut
        if single_timestamp_ending:
            advance = segment_size
        else:
            advance = (tokens[last_cut - 1].item() - timestamp_begin) * input_stride
    else:
        duration = segment_duration
        timestamps = tokens[is_timestamp.nonzero()[0]]
        if len(timestamps) > 0 and timestamps[-1].item() != timestamp_begin:
            duration = (timestamps[-1].item() - timestamp_begin) * time_precision
        segments.append(new_segment(time_offset, time_offset + duration, tokens))
        advance = segment_size
    return WindowSegments(segments, advance)


def clear_empty_segments(segments: list[dict[str, Any]]) -> None:
    """An instantaneous or blank segment keeps its times but loses its text and tokens."""
    for segment in segments:
        if segment["start"] == segment["end"] or segment["text"].strip() == "":
            segment["text"] = ""
            segment["tokens"] = []
            segment["words"] = []


def ends_on_single_timestamp(tokens: Sequence[int], tokenizer: Tokenizer) -> bool:
    """The window's tokens end on a text token then one timestamp: no speech after it."""
    is_timestamp = np.array(tokens) >= tokenizer.timestamp_begin
    return is_timestamp[-2:].tolist() == [False, True]


def last_word_end(segments: list[dict[str, Any]]) -> Any:
    """The end of the last word of `segments`; the last segment's end if none has words;
    None without segments."""
    ends = (word["end"] for segment in reversed(segments) for word in reversed(segment["words"]))
    return next(ends, segments[-1]["end"] if segments else None)


def plain_floats(segments: list[dict[str, Any]]) -> None:
    """numpy scalars in segment and word times (the word-timestamp path) as Python numbers."""
    for segment in segments:
        for key in ("start", "end"):
            if isinstance(segment[key], np.generic):
                segment[key] = segment[key].item()
        for word in segment.get("words", []):
            for key in ("start", "end", "probability"):
                if isinstance(word[key], np.generic):
                    word[key] = word[key].item()
