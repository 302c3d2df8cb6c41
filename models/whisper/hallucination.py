"""mlx-whisper's `hallucination_silence_threshold` pass (with word timestamps only): scoring
words as unlike speech, and dropping a window, or its tail, where anomalous segments sit in
silence. `WindowTimes` is where the window sits in the clip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.whisper.audio import FRAMES_PER_SECOND
from models.whisper.segments import last_word_end

# The words that do not count when judging a segment's words anomalous (mlx-whisper's list:
# the default prepended and appended punctuation, run together; a word is skipped when it is
# a substring of it).
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


def word_anomaly_score(word: dict[str, Any]) -> float:
    """How unlike speech a word looks: improbable, very short or very long."""
    probability = word.get("probability", 0.0)
    duration = word["end"] - word["start"]
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: dict[str, Any] | None) -> bool:
    """Its first eight non-punctuation words look like a hallucination."""
    if segment is None or not segment["words"]:
        return False
    words = [word for word in segment["words"] if word["word"] not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(word) for word in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((segment for segment in segments if segment["words"]), None)


@dataclass(frozen=True)
class WindowTimes:
    """Where one window sits in the clip, in frames and seconds (the seek loop's locals)."""

    seek: int  # the window's first frame (`previous_seek` in the reference)
    segment_size: int  # its frames of audio
    time_offset: float
    window_end_time: float
    segment_duration: float
    content_frames: int
    content_duration: float


def skip_hallucination_silence(
    segments: list[dict[str, Any]],
    window: WindowTimes,
    seek: Any,
    *,
    threshold: float,
    single_timestamp_ending: bool,
    last_speech_timestamp: float,
) -> tuple[Any, bool]:
    """mlx-whisper's `hallucination_silence_threshold` pass over one window's segments.

    Returns the next seek and whether the window is dropped whole (its first worded segment
    is anomalous and starts after more than `threshold` seconds of silence: decoding resumes
    at that segment). Otherwise `segments` may lose its tail from an anomalous segment
    surrounded by silence or more anomalies, and seek moves to that segment.
    """
    if not single_timestamp_ending:
        end = last_word_end(segments)
        if end is not None and end > window.time_offset:
            remaining_duration = window.window_end_time - end
            if remaining_duration > threshold:
                seek = round(end * FRAMES_PER_SECOND)
            else:
                seek = window.seek + window.segment_size

    first_segment = next_words_segment(segments)
    if first_segment is not None and is_segment_anomaly(first_segment):
        gap = first_segment["start"] - window.time_offset
        if gap > threshold:
            return window.seek + round(gap * FRAMES_PER_SECOND), True

    hal_last_end = last_speech_timestamp
    for index, segment in enumerate(segments):
        if not segment["words"]:
            continue
        if is_segment_anomaly(segment):
            next_segment = next_words_segment(segments[index + 1 :])
            if next_segment is not None:
                hal_next_start = next_segment["words"][0]["start"]
            else:
                hal_next_start = window.time_offset + window.segment_duration
            silence_before = (
                segment["start"] - hal_last_end > threshold
                or segment["start"] < threshold
                or segment["start"] - window.time_offset < 2.0
            )
            silence_after = (
                hal_next_start - segment["end"] > threshold
                or is_segment_anomaly(next_segment)
                or window.window_end_time - segment["end"] < 2.0
            )
            if silence_before and silence_after:
                seek = round(max(window.time_offset + 1, segment["start"]) * FRAMES_PER_SECOND)
                if window.content_duration - segment["end"] < threshold:
                    seek = window.content_frames
                segments[index:] = []
                break
        hal_last_end = segment["end"]
    return seek, False
