"""Speech segments from per-chunk probabilities: silero-vad 6.2.3's `get_speech_timestamps` rules.

A hysteresis over the chunk probabilities (in at >= threshold, out below neg_threshold),
ends confirmed only after `min_silence_duration_ms` of silence, segments shorter than
`min_speech_duration_ms` dropped, segments longer than `max_speech_duration_s` cut (at the
longest silence seen inside them that lasted more than `min_silence_at_max_speech` ms, or
where the speech first stopped, or where the limit is hit), then `speech_pad_ms` of padding
on each side (halving the gap when two segments are closer than twice the pad). Offsets are
integer samples at 16 kHz. The arithmetic follows the package's exactly, float thresholds
included (`threshold * rate / 1000` style sample counts compared with int offsets), so the
segments are identical whenever the probabilities fall on the same side of the thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from models.vad.model import CHUNK_SAMPLES, check_sample_rate


@dataclass(frozen=True)
class SpeechTimestampOptions:
    """`get_speech_timestamps`' options, with the package's defaults."""

    threshold: float = 0.5
    neg_threshold: float | None = None  # None: max(threshold - 0.15, 0.01)
    min_speech_duration_ms: int = 250
    max_speech_duration_s: float = math.inf
    min_silence_duration_ms: int = 100
    speech_pad_ms: int = 30
    min_silence_at_max_speech: int = 98  # ms
    use_max_poss_sil_at_max_speech: bool = True

    @classmethod
    def from_dict(cls, values: dict) -> SpeechTimestampOptions:
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"unknown get_speech_timestamps options {unknown}; known: {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**values)


@dataclass(frozen=True)
class SpeechSegment:
    start: int  # sample offset, inclusive
    end: int  # sample offset, exclusive

    def as_dict(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end}


def speech_segments(
    probs: Sequence[float],
    n_samples: int,
    options: SpeechTimestampOptions | None = None,
    sample_rate: int = 16000,
) -> list[SpeechSegment]:
    """Speech segments of a clip of `n_samples` samples from its chunk probabilities."""
    check_sample_rate(sample_rate)
    opt = options or SpeechTimestampOptions()
    if len(probs) != -(-n_samples // CHUNK_SAMPLES):
        raise ValueError(f"{len(probs)} chunk probabilities for {n_samples} samples: expected one per 512 samples")
    rate = sample_rate
    min_speech = rate * opt.min_speech_duration_ms / 1000
    pad = rate * opt.speech_pad_ms / 1000
    max_speech = rate * opt.max_speech_duration_s - CHUNK_SAMPLES - 2 * pad
    min_silence = rate * opt.min_silence_duration_ms / 1000
    min_silence_at_max = rate * opt.min_silence_at_max_speech / 1000
    neg_threshold = opt.neg_threshold if opt.neg_threshold is not None else max(opt.threshold - 0.15, 0.01)

    segments: list[dict[str, int]] = []
    current: dict[str, int] = {}
    in_speech = False
    silence_start = 0  # where the current run of sub-neg_threshold chunks began (0: none)
    last_cut = resume = 0  # legacy cut point and where speech resumed after it
    silences: list[tuple[int, int]] = []  # (start, length) of silences inside the current segment

    def close(end: int) -> None:
        nonlocal current
        current["end"] = end
        segments.append(current)
        current = {}

    for index, prob in enumerate(probs):
        prob = float(prob)
        sample = CHUNK_SAMPLES * index
        if prob >= opt.threshold and silence_start:
            length = sample - silence_start
            if length > min_silence_at_max:
                silences.append((silence_start, length))
            silence_start = 0
            if resume < last_cut:
                resume = sample
        if prob >= opt.threshold and not in_speech:
            in_speech = True
            current["start"] = sample
            continue
        if in_speech and sample - current["start"] > max_speech:
            if opt.use_max_poss_sil_at_max_speech and silences:
                cut, length = max(silences, key=lambda s: s[1])  # first of the longest
                close(cut)
                resume = cut + length
                if resume < cut + sample:
                    current["start"] = resume
                else:
                    in_speech = False
                last_cut = resume = silence_start = 0
                silences = []
            elif last_cut:
                close(last_cut)
                if resume < last_cut:
                    in_speech = False
                else:
                    current["start"] = resume
                last_cut = resume = silence_start = 0
                silences = []
            else:
                close(sample)
                last_cut = resume = silence_start = 0
                in_speech = False
                silences = []
                continue
        if prob < neg_threshold and in_speech:
            if not silence_start:
                silence_start = sample
            silent_for = sample - silence_start
            if not opt.use_max_poss_sil_at_max_speech and silent_for > min_silence_at_max:
                last_cut = silence_start
            if silent_for < min_silence:
                continue
            if silence_start - current["start"] > min_speech:
                close(silence_start)
            current = {}
            last_cut = resume = silence_start = 0
            in_speech = False
            silences = []
            continue

    if current and n_samples - current["start"] > min_speech:
        close(n_samples)

    for i, seg in enumerate(segments):
        if i == 0:
            seg["start"] = int(max(0, seg["start"] - pad))
        if i != len(segments) - 1:
            gap = segments[i + 1]["start"] - seg["end"]
            if gap < 2 * pad:
                seg["end"] += int(gap // 2)
                segments[i + 1]["start"] = int(max(0, segments[i + 1]["start"] - gap // 2))
            else:
                seg["end"] = int(min(n_samples, seg["end"] + pad))
                segments[i + 1]["start"] = int(max(0, segments[i + 1]["start"] - pad))
        else:
            seg["end"] = int(min(n_samples, seg["end"] + pad))
    return [SpeechSegment(int(s["start"]), int(s["end"])) for s in segments]


def clip_timestamps(segments: Sequence[SpeechSegment], sample_rate: int = 16000) -> str:
    """Segments as a Whisper `clip_timestamps` string ("start,end,start,end", seconds), so
    transcription skips the silence between them. Empty when there is no speech."""
    return ",".join(f"{s.start / sample_rate:.3f},{s.end / sample_rate:.3f}" for s in segments)
