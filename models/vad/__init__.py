"""Silero VAD (v6, 16 kHz) in MLX: the silero-vad package's model and its speech timestamps.

    model = load_model("silero_vad.jit")   # the package's file, or a weights.safetensors
    audio = read_wav("clip.wav")                               # 16 kHz mono float32
    probs = model.probabilities(audio)                         # one per 512 samples (batch)
    segments = get_speech_timestamps(audio, model)             # [SpeechSegment(start, end), ...]
    stream = VADStream(model); stream.feed(piece); stream.flush()   # the same, in pieces

docs/vad.md describes the graph, the gate against the package and the silence skip for
Whisper (`speech_clip_timestamps`).
"""

from __future__ import annotations

import numpy as np

from models.vad.load import load_model, read_wav
from models.vad.model import CHUNK_SAMPLES, SAMPLE_RATE, SileroVAD, VADStream, check_sample_rate
from models.vad.timestamps import SpeechSegment, SpeechTimestampOptions, clip_timestamps, speech_segments

__all__ = [
    "CHUNK_SAMPLES",
    "SAMPLE_RATE",
    "SileroVAD",
    "SpeechSegment",
    "SpeechTimestampOptions",
    "VADStream",
    "clip_timestamps",
    "get_speech_timestamps",
    "load_model",
    "read_wav",
    "speech_clip_timestamps",
    "speech_segments",
]


def get_speech_timestamps(
    audio: np.ndarray,
    model: SileroVAD,
    options: SpeechTimestampOptions | None = None,
    sample_rate: int = SAMPLE_RATE,
) -> list[SpeechSegment]:
    """Speech segments (integer sample offsets) of a 16 kHz clip, as the package finds them."""
    check_sample_rate(sample_rate)
    probs = model.probabilities(audio)
    return speech_segments(probs.tolist(), int(np.asarray(audio).shape[0]), options, sample_rate)


def speech_clip_timestamps(
    audio: np.ndarray, model: SileroVAD, options: SpeechTimestampOptions | None = None
) -> str | None:
    """The speech spans as a `clip_timestamps` string for models.whisper.transcribe, or None
    when the clip holds no speech (then skip transcription: an empty clip_timestamps string
    means "the whole clip" to transcribe). Pass `fix_clip_start=True` with it, so that each
    clip starts at its own start instead of where the previous one stopped decoding."""
    segments = get_speech_timestamps(audio, model, options)
    return clip_timestamps(segments) or None
