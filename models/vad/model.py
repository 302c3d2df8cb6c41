"""Silero VAD v6 (16 kHz) in MLX: the graph of the package's TorchScript model, chunk by chunk.

Per 512-sample chunk the package's model computes (read from `silero_vad.jit`'s code):

1. `x = [context (64 samples) | chunk (512)]`: the context is the last 64 samples of the
   previous chunk's input (zeros before the first chunk). Dropping it, or padding both
   sides as whisper.cpp's port does, changes every probability.
2. reflect pad on the right only, by 64 -> 640 samples.
3. STFT as a strided conv: 258 filters of 256 taps (129 real + 129 imaginary DFT rows,
   windowed), stride 128 -> 4 frames; magnitude sqrt(re^2 + im^2) -> (129, 4).
4. four conv blocks (conv k=3 pad=1 + ReLU): 129->128 s1, 128->64 s2, 64->64 s2,
   64->128 s1 -> (128, 1).
5. an LSTMCell(128, 128), gates (i, f, g, o), state (h, c) carried to the next chunk.
6. ReLU(h) -> 1x1 conv 128->1 -> sigmoid: the speech probability.

Steps 1-4 and the LSTM's input projection do not depend on the state, so `probabilities`
runs them for all chunks of a clip at once; only the recurrence steps chunk by chunk.
`VADStream` runs the identical per-chunk functions with a batch of one, for audio that
arrives in pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

SAMPLE_RATE = 16000
CHUNK_SAMPLES = 512  # one probability per 32 ms
CONTEXT_SAMPLES = 64
REFLECT_PAD = 64
N_FFT = 256
HOP = 128
HIDDEN = 128


@dataclass(frozen=True)
class VADState:
    """What carries from one chunk to the next: the LSTM state and the 64-sample context."""

    h: mx.array  # (batch, 128)
    c: mx.array  # (batch, 128)
    context: mx.array  # (batch, 64)

    @staticmethod
    def zeros(batch: int = 1) -> VADState:
        return VADState(
            h=mx.zeros((batch, HIDDEN), mx.float32),
            c=mx.zeros((batch, HIDDEN), mx.float32),
            context=mx.zeros((batch, CONTEXT_SAMPLES), mx.float32),
        )


def _conv1d(x: mx.array, weight: mx.array, bias: mx.array | None, stride: int, padding: int) -> mx.array:
    """Conv over (batch, length, channels) with an MLX-layout weight (out, kernel, in)."""
    y = mx.conv1d(x, weight, stride=stride, padding=padding)
    return y if bias is None else y + bias


class SileroVAD:
    """The 16 kHz Silero VAD graph over converted weights (models.vad.convert names)."""

    def __init__(self, weights: dict[str, mx.array]):
        def conv_weight(name: str) -> mx.array:  # torch (out, in, k) -> mlx (out, k, in)
            return mx.array(np.ascontiguousarray(np.asarray(weights[name]).transpose(0, 2, 1)))

        self.stft_basis = conv_weight("stft_basis")  # (258, 256, 1)
        self.convs = [
            (conv_weight(f"conv{i}.weight"), mx.array(weights[f"conv{i}.bias"]), stride)
            for i, stride in ((1, 1), (2, 2), (3, 2), (4, 1))
        ]
        self.weight_ih_t = mx.array(np.ascontiguousarray(np.asarray(weights["lstm.weight_ih"]).T))
        self.weight_hh_t = mx.array(np.ascontiguousarray(np.asarray(weights["lstm.weight_hh"]).T))
        self.bias_ih = mx.array(weights["lstm.bias_ih"])
        self.bias_hh = mx.array(weights["lstm.bias_hh"])
        self.head_weight = conv_weight("head.weight")  # (1, 1, 128)
        self.head_bias = mx.array(weights["head.bias"])

    # -- per-chunk stages (any batch of chunks) ------------------------------------------

    def features(self, frames: mx.array) -> mx.array:
        """(n, 64 + 512) context-prefixed chunks -> (n, 128) encoder output (steps 2-4)."""
        padded = mx.concatenate([frames, frames[:, -REFLECT_PAD - 1 : -1][:, ::-1]], axis=1)  # reflect, right
        spectrum = _conv1d(padded[:, :, None], self.stft_basis, None, stride=HOP, padding=0)  # (n, 4, 258)
        cutoff = N_FFT // 2 + 1
        real, imag = spectrum[..., :cutoff], spectrum[..., cutoff:]
        x = mx.sqrt(real * real + imag * imag)  # (n, 4, 129)
        for weight, bias, stride in self.convs:
            x = mx.maximum(_conv1d(x, weight, bias, stride=stride, padding=1), 0)
        return x[:, 0, :]  # (n, 1, 128) -> (n, 128)

    def input_gates(self, features: mx.array) -> mx.array:
        """The LSTM's input projection x @ W_ih^T + b_ih, state-free (batched over chunks)."""
        return features @ self.weight_ih_t + self.bias_ih

    def lstm_step(self, input_gates: mx.array, h: mx.array, c: mx.array) -> tuple[mx.array, mx.array]:
        """One LSTMCell step given the precomputed input gates (torch.lstm_cell's arithmetic)."""
        gates = input_gates + (h @ self.weight_hh_t + self.bias_hh)
        i, f, g, o = mx.split(gates, 4, axis=-1)
        c = mx.sigmoid(f) * c + mx.sigmoid(i) * mx.tanh(g)
        h = mx.sigmoid(o) * mx.tanh(c)
        return h, c

    def head(self, h: mx.array) -> mx.array:
        """(n, 128) hidden states -> (n,) speech probabilities."""
        y = _conv1d(mx.maximum(h, 0)[:, None, :], self.head_weight, self.head_bias, stride=1, padding=0)
        return mx.sigmoid(y)[:, 0, 0]

    # -- whole clips ---------------------------------------------------------------------

    def probabilities(self, audio: np.ndarray | mx.array, eval_every: int = 256) -> np.ndarray:
        """Per-chunk speech probabilities (float32) of a 16 kHz mono clip, as the package's
        `get_speech_timestamps` computes them: the last chunk zero-padded to 512 samples,
        state and context starting from zeros."""
        samples = check_audio(audio)
        n_chunks = -(-samples.shape[0] // CHUNK_SAMPLES)
        if n_chunks == 0:
            return np.zeros((0,), np.float32)
        padded = mx.pad(samples, (CONTEXT_SAMPLES, n_chunks * CHUNK_SAMPLES - samples.shape[0]))
        # chunk k's input is padded[k*512 : k*512 + 576]: its context is the previous chunk's tail
        index = mx.arange(n_chunks)[:, None] * CHUNK_SAMPLES + mx.arange(CONTEXT_SAMPLES + CHUNK_SAMPLES)[None, :]
        gates = self.input_gates(self.features(padded[index]))
        mx.eval(gates)
        state = VADState.zeros(1)
        h, c = state.h, state.c
        hidden = []
        for k in range(n_chunks):
            h, c = self.lstm_step(gates[k : k + 1], h, c)
            hidden.append(h)
            if (k + 1) % eval_every == 0:
                mx.eval(h, c)  # bound the lazy graph on long clips
        probs = self.head(mx.concatenate(hidden, axis=0))
        return np.array(probs, copy=True)


def check_audio(audio: np.ndarray | mx.array) -> mx.array:
    """A 1-D float32 clip, or a clear error naming what was expected."""
    array = np.asarray(audio)
    if array.ndim != 1:
        raise ValueError(f"Silero VAD expects mono audio as a 1-D array, got shape {array.shape}")
    if array.dtype != np.float32:
        raise ValueError(f"Silero VAD expects float32 samples in [-1, 1], got dtype {array.dtype}")
    return mx.array(array)


def check_sample_rate(sample_rate: int) -> None:
    if sample_rate != SAMPLE_RATE:
        raise ValueError(
            f"Silero VAD (this port) runs the 16 kHz model only: sample rate {sample_rate} Hz given, "
            f"expected {SAMPLE_RATE} Hz (resample first)"
        )


class VADStream:
    """Streaming Silero VAD: feed audio in pieces of any size, get each finished chunk's
    probability. The state (LSTM h, c and the 64-sample context) carries between calls,
    so feeding a clip in pieces gives the probabilities `SileroVAD.probabilities` gives
    for the whole clip (`flush` zero-pads the final partial chunk, as the package does)."""

    def __init__(self, model: SileroVAD):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.state = VADState.zeros(1)
        self._pending = np.zeros((0,), np.float32)
        self.chunks_done = 0

    def step(self, chunk: np.ndarray | mx.array) -> float:
        """Exactly one 512-sample chunk -> its speech probability."""
        samples = check_audio(chunk)
        if samples.shape[0] != CHUNK_SAMPLES:
            raise ValueError(f"VADStream.step takes {CHUNK_SAMPLES} samples (16 kHz), got {samples.shape[0]}")
        frame = mx.concatenate([self.state.context, samples[None, :]], axis=1)
        gates = self.model.input_gates(self.model.features(frame))
        h, c = self.model.lstm_step(gates, self.state.h, self.state.c)
        prob = self.model.head(h)
        self.state = VADState(h=h, c=c, context=frame[:, -CONTEXT_SAMPLES:])
        mx.eval(prob, self.state.h, self.state.c, self.state.context)
        self.chunks_done += 1
        return float(np.array(prob)[0])

    def feed(self, audio: np.ndarray | mx.array) -> list[float]:
        """Append samples; returns the probabilities of the chunks they complete."""
        self._pending = np.concatenate([self._pending, np.asarray(check_audio(audio))])
        out = []
        while self._pending.shape[0] >= CHUNK_SAMPLES:
            out.append(self.step(self._pending[:CHUNK_SAMPLES]))
            self._pending = self._pending[CHUNK_SAMPLES:]
        return out

    def flush(self) -> list[float]:
        """Zero-pad and run a final partial chunk, if any (end of the stream)."""
        if self._pending.shape[0] == 0:
            return []
        tail = np.zeros((CHUNK_SAMPLES,), np.float32)
        tail[: self._pending.shape[0]] = self._pending
        self._pending = np.zeros((0,), np.float32)
        return [self.step(tail)]
