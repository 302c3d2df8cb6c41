"""What one decode call takes and gives back: `DecodingOptions` (mlx-whisper's, plus one
switch), `DecodingResult`, and the `compression_ratio` a result reports (decoding.py's
docstring says how each result field is computed)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np


def compression_ratio(text: str) -> float:
    """UTF-8 length over zlib-compressed length (level 6): high for repetitive text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


@dataclass(frozen=True)
class DecodingOptions:
    """mlx-whisper's DecodingOptions, plus `fix_monotonic_timestamps` (see decoding.py's docstring)."""

    task: str = "transcribe"  # "transcribe", "translate" or "lang_id"
    language: str | None = None  # detected when None
    temperature: float = 0.0
    sample_len: int | None = None  # at most this many steps; n_text_ctx // 2 when None
    best_of: int | None = None  # independent samples at T > 0
    beam_size: int | None = None  # beam search with openai-whisper's semantics (see decoding.py's docstring)
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
