"""One in-tree side of `bench-compiled` in a process of its own (harness.tools.bench_paired's protocol).

    python -m harness bench-worker --model-dir DIR --job job.json --side eager|compiled [--variant V]

Loads the model once (models.universal.load_model, as the runner does), runs one warm-up
generation (the compiled side makes its traces there, as a server would once), prints a
`ready` line with the warm-up's logits digest (sha256 of the float32 bits of every step's row)
and tokens, then answers every `run` line on stdin with one timed run. Timing as
oracles/mlx-lm/bench.py times mlx-lm: prefill = call to step 0, decode = step 0 to the last
step, each token `.item()`'d (computed) when its step is handed out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any


def steps_function(side: str, variant: str) -> tuple[Callable[..., Iterator[Any]], Any]:
    from models.universal import greedy_steps
    from models.universal.compiled import DecodeReport, compiled_greedy_steps
    from models.universal.compiled_step import VARIANTS

    if side == "eager":
        return greedy_steps, None
    if side != "compiled":
        raise SystemExit(f"bench_worker: --side: expected eager or compiled, got {side!r}")
    if variant not in VARIANTS:
        raise SystemExit(f"bench_worker: --variant: expected one of {VARIANTS}, got {variant!r}")
    report = DecodeReport()

    def compiled(model: Any, ids: list[int], n: int) -> Iterator[Any]:
        return compiled_greedy_steps(model, ids, n, variant=variant, report=report)

    return compiled, report


def timed_run(steps_fn: Callable[..., Iterator[Any]], model: Any, prompt_ids: list[int], steps: int, keep: bool):
    """One greedy run of steps + 1 tokens: (prefill s, decode s, peak bytes, rows or None, tokens)."""
    import mlx.core as mx

    mx.synchronize()
    mx.reset_peak_memory()
    started = time.perf_counter()
    stamps, rows, tokens = [], [], []
    for step in steps_fn(model, prompt_ids, steps + 1):
        stamps.append(time.perf_counter())
        tokens.append(step.token)
        if keep:
            rows.append(step.logits)
    mx.synchronize()
    return stamps[0] - started, stamps[-1] - stamps[0], mx.get_peak_memory(), rows, tokens


def digest(rows: list[Any]) -> str:
    import mlx.core as mx
    import numpy as np

    bits = np.stack([np.array(r.astype(mx.float32)).view(np.uint32) for r in rows])
    return hashlib.sha256(bits.tobytes()).hexdigest()


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    job = json.loads(args.job.read_text())
    steps_fn, report = steps_function(args.side, args.variant)

    import mlx.core as mx

    from models.universal import load_model

    model, _config = load_model(args.model_dir)
    started = time.perf_counter()
    *_, rows, tokens = timed_run(steps_fn, model, job["prompt_ids"], job["steps"], keep=True)
    ready = {"status": "ready", "side": args.side, "warmup_run_s": time.perf_counter() - started}
    ready |= {"logits_sha256": digest(rows), "tokens": tokens, "device": str(mx.default_device())}
    if report is not None:
        ready |= {"variant": report.variant, "compiled": report.compiled, "reasons": report.reasons}
    emit(ready)
    for line in sys.stdin:
        if line.strip() != "run":
            raise SystemExit(f"bench_worker: expected 'run' on stdin, got {line.strip()!r}")
        prefill_s, decode_s, peak, _rows, _tokens = timed_run(steps_fn, model, job["prompt_ids"], job["steps"], False)
        emit({"prefill_s": prefill_s, "decode_s": decode_s, "peak_bytes": peak})
    return 0
