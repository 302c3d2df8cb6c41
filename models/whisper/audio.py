"""Audio stage: load a waveform, pad or trim it to a window, and compute the log-Mel spectrogram.

The numbers follow mlx-whisper 0.4.3 op for op, so the float32 mel is bit-identical to
`mlx_whisper.audio.log_mel_spectrogram`: reflect padding built from slices, frames taken
with `as_strided`, a periodic Hann window, `rfft`, squared magnitudes, the slaney Mel
filter bank, `log10` of the clamped energies, an 8-decade floor and `(x + 4) / 4`.
The spectrogram is laid out `(n_frames, n_mels)`, as mlx-whisper's encoder expects.

The filter bank is computed here (librosa's float64 arithmetic, then the same float32
rounding librosa applies) instead of being read from a shipped `.npz`.
"""

from __future__ import annotations

import shutil
import subprocess
import wave
from functools import cache
from pathlib import Path

import mlx.core as mx
import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window

N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the encoder's second convolution has stride 2
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 10 ms per mel frame
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 20 ms per audio token


# --------------------------------------------------------------------------- loading


def _pcm16_to_float(pcm: np.ndarray) -> mx.array:
    # The same ops mlx-whisper applies to ffmpeg's s16le output.
    return mx.array(pcm).flatten().astype(mx.float32) / 32768.0


def _read_plain_wav(path: Path, sr: int) -> np.ndarray | None:
    """int16 samples of a mono 16-bit PCM WAV at `sr`, or None when ffmpeg must convert it.

    For such a file ffmpeg's `-f s16le -ac 1 -ar sr` output is the samples unchanged, so
    reading them directly gives exactly what mlx-whisper's ffmpeg path would.
    """
    try:
        with wave.open(str(path), "rb") as w:
            if w.getnchannels() != 1 or w.getsampwidth() != 2 or w.getframerate() != sr:
                return None
            if w.getcomptype() != "NONE":
                return None
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError):
        return None  # not a plain PCM WAV (e.g. WAVE_FORMAT_EXTENSIBLE, float): let ffmpeg decide
    return np.frombuffer(frames, dtype="<i2")


def _ffmpeg_pcm16(path: Path, sr: int) -> np.ndarray:
    if shutil.which("ffmpeg") is None:
        raise RuntimeError(
            f"cannot decode {path}: only mono 16-bit PCM WAV at {sr} Hz is read in-tree; "
            "other formats need the ffmpeg command line tool, which is not on PATH"
        )
    cmd = ["ffmpeg", "-nostdin", "-i", str(path), "-threads", "0", "-f", "s16le", "-ac", "1"]
    cmd += ["-acodec", "pcm_s16le", "-ar", str(sr), "-"]
    result = subprocess.run(cmd, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ffmpeg failed to decode {path}: {result.stderr.decode(errors='replace')[-2000:]}")
    return np.frombuffer(result.stdout, dtype=np.int16)


def load_audio(path: str | Path, sr: int = SAMPLE_RATE) -> mx.array:
    """A mono float32 waveform in [-1, 1) at `sr` Hz (int16 samples / 32768)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no audio file at {path}")
    pcm = _read_plain_wav(path, sr)
    if pcm is None:
        pcm = _ffmpeg_pcm16(path, sr)
    return _pcm16_to_float(pcm)


def pad_or_trim(array: mx.array, length: int = N_SAMPLES, *, axis: int = -1) -> mx.array:
    """Zero-pad on the right or cut `array` along `axis` to exactly `length`."""
    size = array.shape[axis]
    if size > length:
        index = [slice(None)] * array.ndim
        index[axis] = slice(0, length)
        array = array[tuple(index)]
    elif size < length:
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, length - size)
        array = mx.pad(array, widths)
    return array


# --------------------------------------------------------------------------- mel filter bank

# Slaney's Mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_MEL_F_SP = 200.0 / 3
_MEL_MIN_LOG_HZ = 1000.0
_MEL_MIN_LOG_MEL = _MEL_MIN_LOG_HZ / _MEL_F_SP
_MEL_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz >= _MEL_MIN_LOG_HZ:
        return _MEL_MIN_LOG_MEL + np.log(hz / _MEL_MIN_LOG_HZ) / _MEL_LOGSTEP
    return hz / _MEL_F_SP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = _MEL_F_SP * mels
    above = mels >= _MEL_MIN_LOG_MEL
    hz[above] = _MEL_MIN_LOG_HZ * np.exp(_MEL_LOGSTEP * (mels[above] - _MEL_MIN_LOG_MEL))
    return hz


@cache
def _mel_filters_numpy(n_mels: int, sr: int, n_fft: int) -> np.ndarray:
    # Band edges are n_mels + 2 points evenly spaced in mel between 0 Hz and Nyquist.
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2), n_mels + 2))
    bin_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    widths = np.diff(edges_hz)
    offsets = edges_hz[:, None] - bin_hz[None, :]

    # librosa fills a float32 matrix row by row from float64 triangles, then scales it in
    # place by float64 slaney areas: two roundings to float32, in that order.
    bank = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for band in range(n_mels):
        rising = -offsets[band] / widths[band]
        falling = offsets[band + 2] / widths[band + 1]
        bank[band] = np.maximum(0, np.minimum(rising, falling))
    area_norm = 2.0 / (edges_hz[2 : n_mels + 2] - edges_hz[:n_mels])
    bank *= area_norm[:, None]
    bank.setflags(write=False)
    return bank


def mel_filters(n_mels: int) -> mx.array:
    """The `(n_mels, N_FFT // 2 + 1)` float32 slaney Mel filter bank (librosa's, bit for bit)."""
    if n_mels <= 0:
        raise ValueError(f"n_mels must be positive, got {n_mels}")
    return mx.array(_mel_filters_numpy(n_mels, SAMPLE_RATE, N_FFT))


# --------------------------------------------------------------------------- spectrogram


@cache
def _hanning_numpy(size: int) -> np.ndarray:
    return np.hanning(size + 1)[:-1]  # periodic Hann: the symmetric one of size + 1, minus its last point


def hanning(size: int) -> mx.array:
    """The periodic Hann window of `size` points, float32 (rounded from numpy's float64)."""
    return mx.array(_hanning_numpy(size))


def _reflect_pad(x: mx.array, padding: int) -> mx.array:
    head = x[1 : padding + 1][::-1]
    tail = x[-(padding + 1) : -1][::-1]
    return mx.concatenate([head, x, tail])


def stft(x: mx.array, window: mx.array, n_fft: int = N_FFT, hop_length: int = HOP_LENGTH) -> mx.array:
    """Centered STFT of a 1-D signal: `(n_frames, n_fft // 2 + 1)` complex64, reflect-padded."""
    x = _reflect_pad(x, n_fft // 2)
    n_frames = (x.size - n_fft + hop_length) // hop_length
    frames = mx.as_strided(x, shape=[n_frames, n_fft], strides=[hop_length, 1])
    return mx.fft.rfft(frames * window)


def log_mel_spectrogram(audio: str | Path | np.ndarray | mx.array, n_mels: int = 80, padding: int = 0) -> mx.array:
    """The `(n_frames, n_mels)` float32 log-Mel spectrogram of a 16 kHz waveform (or audio file).

    `padding` zero samples are appended first (transcription pads a whole window so the
    last real frames see zeros, not reflections).
    """
    if isinstance(audio, str | Path):
        audio = load_audio(audio)
    elif not isinstance(audio, mx.array):
        audio = mx.array(audio)
    if padding > 0:
        audio = mx.pad(audio, (0, padding))

    spectrum = stft(audio, hanning(N_FFT))
    power = spectrum[:-1, :].abs().square()  # the last frame is dropped, as Whisper always has
    log_mel = log10_mel(power, n_mels)
    return floored(log_mel, log_mel.max())


def log10_mel(power: mx.array, n_mels: int) -> mx.array:
    """`log10` of the clamped Mel energies of power-spectrum frames (before the floor)."""
    mel = power @ mel_filters(n_mels).T
    return mx.maximum(mel, 1e-10).log10()


def floored(log_mel: mx.array, top: mx.array) -> mx.array:
    """Whisper's 8-decade floor below the clip's loudest value `top`, then `(x + 4) / 4`.

    Elementwise: any slice of frames, floored with the same `top`, gives the same bits."""
    log_mel = mx.maximum(log_mel, top - 8.0)
    return (log_mel + 4.0) / 4.0


def log10_mel_frames(signal: mx.array, start: int, stop: int, n_mels: int) -> mx.array:
    """Frames `[start, stop)` of `log10_mel` over the centered STFT of `signal`, computed from
    only the samples they cover (`signal` must reach sample `(stop - 1) * HOP_LENGTH + N_FFT // 2`).

    The same ops as `log_mel_spectrogram` on the frames' own samples: frame i covers samples
    `[i * HOP_LENGTH - N_FFT // 2, i * HOP_LENGTH + N_FFT // 2)`, the first frames reach into the
    reflected head. Callers take at least two frames at once: a one-row Mel product is a
    matrix-vector product, whose sums round differently.
    """
    half = N_FFT // 2
    lo, hi = start * HOP_LENGTH - half, (stop - 1) * HOP_LENGTH + half
    if hi > signal.size:
        raise ValueError(f"frames up to {stop} need {hi} samples, the signal has {signal.size}")
    if lo < 0:
        piece = mx.concatenate([signal[1 : half + 1][::-1][lo:], signal[:hi]])  # the reflected head's tail
    else:
        piece = signal[lo:hi]
    frames = mx.as_strided(piece, shape=[stop - start, N_FFT], strides=[HOP_LENGTH, 1])
    power = mx.fft.rfft(frames * hanning(N_FFT)).abs().square()
    return log10_mel(power, n_mels)
