"""Gate the in-tree Silero VAD against the silero-vad package on every fixture, printed per
fixture, and measure its speed (`python -m harness vad [--update] [--fixtures ...] [--bench]`;
docs/vad.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.artifacts.vad import resolve_vad_weights
from harness.checks.vad import FixtureVerdict, segments_coverage, walked_segments
from harness.errors import (
    HarnessError,
)
from harness.paths import FIXTURES_DIR
from harness.profile.vad import VadProfile, load_vad_profile
from harness.runners.vad import float64_probabilities, run_oracle, streaming_probabilities
from harness.vad_session import VadRun


def bench(profile: VadProfile, model: Any, weights_dir: Path, fixtures: list[str], repeat: int = 3) -> list[dict]:
    """Chunks per second: MLX batch, MLX streaming (one 512-sample chunk per call), the package."""
    from models.vad import read_wav

    rows = []
    with tempfile.TemporaryDirectory(prefix="silero-vad-bench-") as tmp:
        run_oracle(profile.oracle, Path(tmp), [FIXTURES_DIR / f for f in fixtures], {"default": {}}, repeat=repeat)
        for fixture in fixtures:
            audio = read_wav(FIXTURES_DIR / fixture)
            record = json.loads((Path(tmp) / f"{Path(fixture).stem}.json").read_text())
            package_s = min(record["seconds"]["default"])
            model.probabilities(audio)  # warm-up
            batch_s = min(_timed(model.probabilities, audio) for _ in range(repeat))
            stream_s = min(_timed(streaming_probabilities, model, audio) for _ in range(repeat))
            probs = np.asarray(model.probabilities(audio), np.float64)
            ref = float64_probabilities(weights_dir, audio)
            oracle = np.load(Path(tmp) / f"{Path(fixture).stem}.probs.npy").astype(np.float64)
            chunks = probs.shape[0]
            rows.append(
                {
                    "fixture": fixture,
                    "audio_s": audio.shape[0] / 16000,
                    "chunks": chunks,
                    "mlx_batch_chunks_per_s": chunks / batch_s,
                    "mlx_stream_chunks_per_s": chunks / stream_s,
                    "package_chunks_per_s": chunks / package_s,
                    "max_abs_mlx_vs_package": float(np.abs(probs - oracle).max()),
                    "max_abs_mlx_vs_float64": float(np.abs(probs - ref).max()),
                    "max_abs_package_vs_float64": float(np.abs(oracle - ref).max()),
                }
            )
    return rows


def _timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def run_gate(fixtures: list[str] | None = None, update: bool = False) -> list[FixtureVerdict]:
    profile = load_vad_profile()
    run = VadRun(profile, list(fixtures or profile.fixtures), update=update)
    return [run.verdict(f) for f in run.fixtures]


def run(args: argparse.Namespace) -> int:
    try:
        verdicts = run_gate(args.fixtures, update=args.update)
        for v in verdicts:
            print(f"{'PASS' if v.passed else 'FAIL'} {v.fixture}: {v.chunks} chunks, max |d| {v.max_abs_diff:.3g}")
            for c in v.checks:
                print(f"    {'ok  ' if c.passed else 'ERROR' if c.nothing_exercised else 'FAIL'} {c.name}: {c.detail}")
        profile = load_vad_profile()
        coverage = segments_coverage(profile, walked_segments(verdicts, profile))
        print(coverage.line)
        if args.bench:
            from models.vad import load_model

            weights = resolve_vad_weights(profile)
            for row in bench(profile, load_model(weights), weights, args.fixtures or profile.fixtures):
                print(json.dumps(row))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if all(v.passed for v in verdicts) and coverage.row is None else 1
