"""Silero VAD oracle: the silero-vad package's own model and `get_speech_timestamps` on WAVs.

Runs inside the silero-vad oracle venv (oracles/silero-vad/requirements.txt) and imports only
that venv's packages, the standard library and oracles/common/oracle_base.py (its command
line). For each WAV (16 kHz mono 16-bit PCM, read with `wave`, samples / 32768 as float32, as
torchaudio loads PCM16) it writes:

- `<stem>.probs.npy`: float32, one speech probability per 512-sample chunk, exactly the values
  the package's `get_speech_timestamps` thresholded (the model is wrapped so every call it
  makes is recorded; nothing is recomputed beside it).
- `<stem>.json`: per named option set, the speech segments (integer sample offsets); the
  sample sha256, the package's wall time, and an environment block (versions, threads).

Usage: python -I generate.py --job JOB.json --out DIR, the job
  {"wavs": ["a.wav", ...], "options": {"default": {}, "name": {"threshold": 0.6}}, "repeat": N}
Every option set re-runs the package's `get_speech_timestamps` (model included); the
probabilities must come out the same each time (the model is deterministic), else it fails.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import platform
import sys
import time
import wave
from pathlib import Path

import numpy as np
import torch
from silero_vad import get_speech_timestamps, load_silero_vad

# oracles/common by path: the venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402


class RecordingModel:
    """The package's model, unchanged, with every probability it returns written down."""

    def __init__(self, model):
        self.model = model
        self.probs: list[np.ndarray] = []

    def reset_states(self) -> None:
        self.probs = []
        self.model.reset_states()

    def __call__(self, chunk, sr):
        out = self.model(chunk, sr)
        self.probs.append(out.detach().numpy().astype(np.float32, copy=True).reshape(-1))
        return out


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        if (w.getnchannels(), w.getsampwidth(), w.getframerate()) != (1, 2, 16000):
            raise SystemExit(
                f"{path}: expected 16 kHz mono 16-bit PCM, got {w.getframerate()} Hz, "
                f"{w.getnchannels()} channels, {8 * w.getsampwidth()}-bit"
            )
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / np.float32(32768.0)).astype(np.float32)


def environment() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "silero_vad": metadata.version("silero-vad"),
        "numpy": np.__version__,
    }


def main() -> None:
    """The job: {"wavs": [paths], "options": {name: get_speech_timestamps keyword arguments},
    "repeat": timed repetitions (the first result is kept)}."""
    job, out = base.job_and_out("silero-vad oracle: probabilities and segments per WAV")
    option_sets = job.get("options", {"default": {}})
    repeat = int(job.get("repeat", 1))
    wavs = [Path(w) for w in job["wavs"]]

    model = RecordingModel(load_silero_vad())  # the TorchScript model; the package sets 1 thread
    for path in wavs:
        samples = read_wav(path)
        audio = torch.from_numpy(samples)
        times: dict[str, list[float]] = {}
        segments: dict[str, list[dict[str, int]]] = {}
        probs = None
        for name, options in option_sets.items():
            for _ in range(max(1, repeat)):
                start = time.perf_counter()
                result = get_speech_timestamps(audio, model, sampling_rate=16000, **options)
                times.setdefault(name, []).append(time.perf_counter() - start)
                got = np.concatenate(model.probs) if model.probs else np.zeros((0,), np.float32)
                if probs is None:
                    probs = got
                elif got.tobytes() != probs.tobytes():
                    raise SystemExit(f"{path}: the package's probabilities changed between runs")
                segments.setdefault(name, [{"start": int(s["start"]), "end": int(s["end"])} for s in result])
        np.save(out / f"{path.stem}.probs.npy", probs.astype(np.float32), allow_pickle=False)
        record = {
            "wav": path.name,
            "samples": int(samples.shape[0]),
            "samples_sha256": hashlib.sha256(samples.tobytes()).hexdigest(),
            "chunks": int(probs.shape[0]),
            "segments": segments,
            "options": option_sets,
            "seconds": times,
            "environment": environment(),
        }
        (out / f"{path.stem}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
