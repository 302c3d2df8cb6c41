"""VAD runs: the silero-vad package in its oracle venv, and the in-tree model fed in uneven
streaming pieces; a float64 numpy yardstick for the tolerance (not a gate).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from harness.oracle.process import OracleProcess

STREAM_PIECES = (1000, 37, 512, 1500, 300)  # samples per feed() call, cycled


def run_oracle(oracle: str, out: Path, wavs: list[Path], option_sets: dict[str, Any], repeat: int = 1) -> None:
    """The silero-vad package on `wavs` (its generate.py in the oracle venv): `<stem>.json` and
    `<stem>.probs.npy` per WAV into `out`."""
    job = {"wavs": [str(w) for w in wavs], "options": option_sets, "repeat": repeat}
    with OracleProcess(oracle).run("generate.py", job, task=f"silero-vad oracle on {len(wavs)} fixture(s)") as written:
        shutil.copytree(written, out, dirs_exist_ok=True)


def _stream_pieces(n: int) -> list[int]:
    """Uneven piece sizes (so pieces straddle chunk boundaries) covering n samples."""
    sizes, done, i = [], 0, 0
    while done < n:
        sizes.append(min(STREAM_PIECES[i % len(STREAM_PIECES)], n - done))
        done += sizes[-1]
        i += 1
    return sizes


def streaming_probabilities(model: Any, audio: np.ndarray) -> np.ndarray:
    from models.vad import VADStream

    stream, out, start = VADStream(model), [], 0
    for size in _stream_pieces(audio.shape[0]):
        out += stream.feed(audio[start : start + size])
        start += size
    out += stream.flush()
    return np.array(out, dtype=np.float32)


def float64_probabilities(weights_dir: Path, audio: np.ndarray) -> np.ndarray:
    """The same graph in float64 numpy: the yardstick for how far float32 rounding alone moves
    each side (the tolerance's justification), not a gate."""
    import mlx.core as mx

    w = {k: np.array(v, dtype=np.float64) for k, v in mx.load(str(Path(weights_dir) / "weights.safetensors")).items()}

    def conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: int, pad: int) -> np.ndarray:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
        k = weight.shape[2]
        cols = np.stack([x[:, :, i * stride : i * stride + k] for i in range((x.shape[2] - k) // stride + 1)], 1)
        y = np.einsum("nlck,ock->nol", cols, weight)
        return y if bias is None else y + bias[None, :, None]

    def sigmoid(z: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-z))

    n = -(-audio.shape[0] // 512)
    padded = np.concatenate([np.zeros(64), audio.astype(np.float64), np.zeros(n * 512 - audio.shape[0])])
    frames = np.stack([padded[k * 512 : k * 512 + 576] for k in range(n)])
    frames = np.concatenate([frames, frames[:, 574:510:-1]], axis=1)
    spec = conv(frames[:, None, :], w["stft_basis"], None, 128, 0)
    x = np.sqrt(spec[:, :129] ** 2 + spec[:, 129:] ** 2)
    for i, stride in ((1, 1), (2, 2), (3, 2), (4, 1)):
        x = np.maximum(conv(x, w[f"conv{i}.weight"], w[f"conv{i}.bias"], stride, 1), 0)
    x = x[:, :, 0]
    h, c, out = np.zeros(128), np.zeros(128), []
    for k in range(n):
        gates = x[k] @ w["lstm.weight_ih"].T + w["lstm.bias_ih"] + h @ w["lstm.weight_hh"].T + w["lstm.bias_hh"]
        i, f, g, o = np.split(gates, 4)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        out.append(sigmoid(np.maximum(h, 0) @ w["head.weight"][0, :, 0] + w["head.bias"][0]))
    return np.array(out)
