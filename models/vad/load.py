"""Load Silero VAD weights: the package's .jit (what the gates load, read without torch) or a
safetensors file of the same tensors.

Strict: every tensor the graph reads must be present with its exact shape and float32,
and nothing unknown may be left over (a misnamed tensor is an error, never a silently
random weight).
"""

from __future__ import annotations

import wave
from pathlib import Path

import mlx.core as mx
import numpy as np

from models.vad.convert import EXPECTED_SHAPES_16K, convert_silero_jit
from models.vad.model import SAMPLE_RATE, SileroVAD

WEIGHTS_FILE = "weights.safetensors"


def check_weights(weights: dict[str, mx.array], source: Path) -> None:
    problems = []
    for name, shape in sorted(EXPECTED_SHAPES_16K.items()):
        if name not in weights:
            problems.append(f"missing tensor {name} (expected shape {list(shape)})")
        elif tuple(weights[name].shape) != shape or weights[name].dtype != mx.float32:
            problems.append(
                f"tensor {name} is {weights[name].dtype} {list(weights[name].shape)}, expected float32 {list(shape)}"
            )
    unknown = sorted(set(weights) - set(EXPECTED_SHAPES_16K))
    if unknown:
        problems.append(f"unknown tensors {unknown}")
    if problems:
        raise ValueError(f"{source}: not Silero VAD v6 16 kHz weights:\n  " + "\n  ".join(problems))


def load_model(path: str | Path) -> SileroVAD:
    """A SileroVAD from a converted directory (weights.safetensors), that file, or a .jit."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"missing Silero VAD weights: {path} does not exist")
    if path.suffix == ".jit":
        weights = {k: mx.array(v) for k, v in convert_silero_jit(path).items()}
    else:
        weights = mx.load(str(path))
    check_weights(weights, path)
    return SileroVAD(weights)


def read_wav(path: str | Path) -> np.ndarray:
    """A 16 kHz mono 16-bit PCM WAV as float32 samples (pcm / 32768, torchaudio's scaling)."""
    path = Path(path)
    with wave.open(str(path), "rb") as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        if (rate, channels, width) != (SAMPLE_RATE, 1, 2):
            raise ValueError(
                f"{path}: Silero VAD needs 16 kHz mono 16-bit PCM, got {rate} Hz, {channels} channel(s), "
                f"{8 * width}-bit (resample / down-mix first)"
            )
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / np.float32(32768.0)).astype(np.float32)
