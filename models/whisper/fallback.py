"""The temperature ladder's decisions (openai-whisper's `decode_with_fallback` criteria): the
default ladder, when a window's result is decoded again at the next temperature, and when a
window is skipped as silence. The seek loop (seek_loop.py) runs the ladder."""

from __future__ import annotations

from models.whisper.decoding_types import DecodingResult

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def needs_fallback(
    result: DecodingResult,
    compression_ratio_threshold: float | None,
    logprob_threshold: float | None,
    no_speech_threshold: float | None,
) -> bool:
    """Decode again at the next temperature: too repetitive or too improbable, unless silent."""
    fallback = False
    if compression_ratio_threshold is not None and result.compression_ratio > compression_ratio_threshold:
        fallback = True
    if logprob_threshold is not None and result.avg_logprob < logprob_threshold:
        fallback = True
    if no_speech_threshold is not None and result.no_speech_prob > no_speech_threshold:
        fallback = False
    return fallback


def should_skip(result: DecodingResult, logprob_threshold: float | None, no_speech_threshold: float | None) -> bool:
    """The window is silence: no-speech probability high and average log-probability not."""
    if no_speech_threshold is None:
        return False
    skip = result.no_speech_prob > no_speech_threshold
    if logprob_threshold is not None and result.avg_logprob > logprob_threshold:
        skip = False
    return skip
