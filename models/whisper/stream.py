"""Streaming transcription: the seek loop as a resumable object, bit for bit the batch run.

    stream = StreamingTranscriber(model, encoding, temperature=0.0)
    for chunk in chunks:                 # mono float samples at 16 kHz, any sizes
        new_segments = stream.feed(chunk)
    result = stream.finish()             # == transcribe(model, all_samples, encoding, temperature=0.0)

`feed` computes the log-Mel frames whose STFT support has fully arrived (frame i needs samples
up to `i * HOP_LENGTH + N_FFT // 2`; the reflected head of the first frames is in the first
201 samples), never one frame alone (a one-row Mel product rounds differently), and decodes
each window once `N_FRAMES` frames past its seek exist (`seek_loop.SeekLoop.next_window`).
`finish` appends the batch run's padding (a window of zeros, then the reflected tail, zeros
too), computes the remaining frames and drains the loop with the clip's length known.

Whisper floors the log-Mel 8 decades below the *whole clip's* loudest value, which a stream
only knows at the end. A window decoded before `finish` uses the loudest value so far; `finish`
checks every such window (and the language-detection window) against the final floor, and if
any frame of one would differ it runs the loop again from the start over the final Mel
(`restarts` counts it; the random generator is re-seeded with `seed`, so sampled fallbacks
repeat the batch run's draws). The segments `feed` returned are then revised: `finish`'s result
is the transcript. Options that need the clip's length before a window is decided
(`hallucination_silence_threshold` with word timestamps) make every window wait for `finish`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import tiktoken

from models.whisper.audio import HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE, floored, log10_mel_frames
from models.whisper.decoding import decode
from models.whisper.hooks import TranscribeObserver
from models.whisper.seek_loop import WAIT, SeekLoop
from models.whisper.token_decoders import TemperatureSampler

MIN_BLOCK = 8  # frames computed together at least (earlier frames are recomputed to make up the block)


class StreamError(ValueError):
    """Bad input to a stream: wrong sample rate, not mono samples, feeding a finished stream."""


class StreamingTranscriber:
    """`transcribe.transcribe` fed chunk by chunk. `options` are its keyword arguments (not
    `forced_calls` or `sampler`: a stream owns a fresh sampler, as a recorded batch run does);
    `seed` seeds `mx.random` now and again on a restart."""

    def __init__(
        self,
        model: Any,
        encoding: tiktoken.Encoding,
        *,
        sample_rate: int = SAMPLE_RATE,
        seed: int | None = None,
        observer: TranscribeObserver | None = None,
        decode_fn: Callable[..., Any] = decode,
        **options: Any,
    ) -> None:
        _check_rate(sample_rate)
        for name in ("forced_calls", "sampler"):
            if name in options:
                raise StreamError(f"StreamingTranscriber: {name!r} is not a streaming option (batch transcribe only)")
        self.model, self.encoding, self.seed = model, encoding, seed
        self.observer = observer or TranscribeObserver()
        self._decode_fn, self._options = decode_fn, options
        self.n_mels = model.dims.n_mels
        self._samples = np.zeros(N_SAMPLES, np.float32)  # capacity grows by doubling
        self._n = 0
        self._raw = np.zeros((0, self.n_mels), np.float32)  # log10 Mel frames before the floor
        self._top: np.float32 | None = None  # the loudest raw value so far
        self._decided: list[tuple[int, int, mx.array]] = []  # frames [start, stop) used, with their floor
        self.finished = False
        self.restarts = 0
        self.windows_before_finish = 0
        if seed is not None:
            mx.random.seed(seed)
        self._loop = self._new_loop()
        self._begun = False

    def _new_loop(self) -> SeekLoop:
        return SeekLoop(
            self.model,
            self.encoding,
            observer=self.observer,
            sampler=TemperatureSampler(),
            decode_fn=self._decode_fn,
            **dict(self._options),
        )

    # -- input -------------------------------------------------------------------------------

    def feed(self, samples: Any, sample_rate: int | None = None) -> list[dict[str, Any]]:
        """Add mono float samples (16 kHz); decode every window they complete. Returns the
        segments those windows added (provisional until `finish`: see the module's notes)."""
        if self.finished:
            raise StreamError("feed after finish: the stream is finished; start a new StreamingTranscriber")
        if sample_rate is not None:
            _check_rate(sample_rate)
        chunk = _mono_floats(samples)
        if self._n + chunk.size > self._samples.size:
            grown = np.zeros(max(2 * self._samples.size, self._n + chunk.size), np.float32)
            grown[: self._n] = self._samples[: self._n]
            self._samples = grown
        self._samples[self._n : self._n + chunk.size] = chunk
        self._n += chunk.size
        ready = (self._n - N_FFT // 2 - 1) // HOP_LENGTH + 1 if self._n > N_FFT // 2 else 0
        if ready - self._raw.shape[0] > 0 and ready >= MIN_BLOCK:
            self._extend(mx.array(self._samples[: self._n]), ready)
        before = len(self._loop.all_segments)
        self._advance(final=False)
        return self._loop.all_segments[before:]

    def finish(self) -> dict[str, Any]:
        """Pad as the batch run does, decode the remaining windows and return the transcript
        (`{"text", "segments", "language"}`, equal to `transcribe`'s on the same samples)."""
        if self.finished:
            raise StreamError("finish after finish: the stream is already finished")
        self.finished = True
        tail = np.zeros(N_SAMPLES + N_FFT // 2, np.float32)  # the window of zeros and the reflected tail
        signal = mx.array(np.concatenate([self._samples[: self._n], tail]))
        total = (self._n + N_SAMPLES) // HOP_LENGTH  # the batch Mel's frames (its last STFT frame dropped)
        self._extend(signal, total)
        top = mx.array(self._top)
        raw = mx.array(self._raw)
        mel = floored(raw, top)
        content_frames = total - N_FRAMES
        if any(not _same_frames(raw[a:b], floor, top) for a, b, floor in self._decided):
            self.restarts += 1
            self.observer.on_restart()
            if self.seed is not None:
                mx.random.seed(self.seed)
            self._loop, self._begun = self._new_loop(), False
        self.observer.on_mel(mel)
        if self._begun:
            self._loop.set_length(content_frames)
        self._advance(final=True, mel=mel, content_frames=content_frames)
        return self._loop.result()

    # -- the loop ----------------------------------------------------------------------------

    def _extend(self, signal: mx.array, ready: int) -> None:
        have = self._raw.shape[0]
        start = max(0, min(have, ready - MIN_BLOCK))
        block = np.array(log10_mel_frames(signal, start, ready, self.n_mels))[have - start :]
        self._raw = np.concatenate([self._raw, block])
        top = block.max()
        self._top = top if self._top is None else max(self._top, top)

    def _window_mel(self, start: int, stop: int) -> tuple[mx.array, mx.array]:
        floor = mx.array(self._top)
        return floored(mx.array(self._raw[start:stop]), floor), floor

    def _advance(self, *, final: bool, mel: mx.array | None = None, content_frames: int | None = None) -> None:
        loop = self._loop
        ready = self._raw.shape[0]
        if not self._begun:
            if loop.needs_language_mel and not final and ready < N_FRAMES:
                return
            if final:
                loop.begin(lambda: mel[:N_FRAMES], content_frames)
            else:

                def first_window() -> mx.array:
                    window, floor = self._window_mel(0, N_FRAMES)
                    self._decided.append((0, N_FRAMES, floor))
                    return window

                loop.begin(first_window, None)
            self._begun = True
        while (window := loop.next_window(ready)) not in (None, WAIT):
            seek, size = window
            if final:
                window_mel = mel[seek : seek + size]
            else:
                window_mel, floor = self._window_mel(seek, seek + size)
                self._decided.append((seek, seek + size, floor))
                self.windows_before_finish += 1
            loop.run_window(window_mel, seek, size)


def _same_frames(raw: mx.array, floor_used: mx.array, top: mx.array) -> bool:
    """Frames floored below `floor_used` (the loudest value when decided) equal them floored below `top`."""
    return bool(mx.array_equal(floored(raw, floor_used), floored(raw, top)))


def _check_rate(sample_rate: Any) -> None:
    if sample_rate != SAMPLE_RATE:
        raise StreamError(f"sample rate {sample_rate!r} Hz: expected {SAMPLE_RATE} Hz (resample before feeding)")


def _mono_floats(samples: Any) -> np.ndarray:
    array = np.asarray(samples)
    if array.ndim != 1:
        raise StreamError(f"samples of shape {array.shape}: expected mono, a 1-D array of samples")
    if not np.issubdtype(array.dtype, np.floating):
        raise StreamError(f"samples of dtype {array.dtype}: expected floats in [-1, 1) (int16 PCM / 32768)")
    return array.astype(np.float32, copy=False)
