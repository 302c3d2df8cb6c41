"""The in-tree side of `bench-kv`: one KV configuration in a process of its own (fresh peak memory).

    python -m harness bench-kv-worker --model-dir DIR --job job.json

Speaks harness.tools.bench_paired's protocol, measuring as oracles/common/kv_bench.py measures
the oracles: a warm-up on the job's short prompt, a `ready` line, then per `run` line one timed
greedy run of steps + 1 tokens on a fresh cache, answered with prefill and decode seconds, the
run's mx peak memory, the process's peak RSS and the final cache's stored bytes.

L1 configurations run `greedy_steps` on a kept cache (`model.make_cache(max_kv_size)`, as
mlx-lm's generate_step runs on its prompt_cache, the look-ahead call included); L2 ones run
`composed_steps`, whose starting cache list is recorded here (`CacheRecorder`): the loop's
conversions replace its items in place, so the list ends as the final caches.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import resource
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

L1_OPTIONS = ("kv_bits", "kv_group_size", "quantized_kv_start")


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def rss_peak_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _arrays(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def cache_bytes(cache: list[Any]) -> dict[str, Any]:
    """Stored bytes of every layer's buffers, and the tokens attention can see (layer 0's)."""
    first = cache[0]
    keys = _arrays(first.keys)
    window = getattr(first, "max_size", None)
    types: dict[str, int] = {}
    for c in cache:
        types[type(c).__name__] = types.get(type(c).__name__, 0) + 1
    return {
        "nbytes": sum(a.nbytes for c in cache for a in _arrays(c.keys) + _arrays(c.values)),
        "offset": int(first.offset),
        "tokens_held": int(first.offset if window is None else min(first.offset, window)),
        "types": types,
        "dtype": None if not keys else str(keys[1].dtype if len(keys) == 3 else keys[0].dtype),
    }


class CacheRecorder:
    """Keeps the cache list each composed run starts from (kv_paths.initial_caches, wrapped)."""

    def __init__(self) -> None:
        from models.universal.composed import kv_paths

        self.caches: list[Any] | None = None
        self._initial = kv_paths.initial_caches
        kv_paths.initial_caches = self._record  # this process runs nothing else

    def _record(self, model: Any, composition: Any) -> list[Any]:
        self.caches = self._initial(model, composition)
        return self.caches


def run_starter(model: Any, config: dict[str, Any], prefill_step_size: int) -> Callable[..., Any]:
    """start_run(prompt_ids, steps) -> (iterator of tokens, the cache list it fills)."""
    from models.universal import greedy_steps
    from models.universal.composed import composed_steps

    if config.get("composition") is not None:
        recorder = CacheRecorder()

        def start_composed(prompt_ids: list[int], steps: int) -> tuple[Iterator[int], Any]:
            run = composed_steps(
                model, prompt_ids, steps + 1, config["composition"], prefill_step_size=prefill_step_size
            )
            first = next(run)  # the loop has made its caches by the first step
            caches, recorder.caches = recorder.caches, None  # held by this run only: freed with it
            return (s.token for s in itertools.chain([first], run)), caches  # lazily: timed step by step

        return start_composed

    options = config["options"]
    unknown = sorted(set(options) - {*L1_OPTIONS, "max_kv_size"})
    if unknown:
        raise SystemExit(f"bench_kv_worker: unknown option(s) {unknown} in configuration {config['name']!r}")

    def start_plain(prompt_ids: list[int], steps: int) -> tuple[Iterator[int], Any]:
        cache = model.make_cache(max_kv_size=options.get("max_kv_size"))
        kwargs = {k: options[k] for k in L1_OPTIONS if k in options}
        run = greedy_steps(model, prompt_ids, steps + 1, prefill_step_size=prefill_step_size, cache=cache, **kwargs)
        return (s.token for s in run), cache

    return start_plain


def timed_run(start_run: Callable[..., Any], prompt_ids: list[int], steps: int) -> dict[str, Any]:
    import mlx.core as mx

    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    active_before = mx.get_active_memory()
    mx.reset_peak_memory()
    started = time.perf_counter()
    stamps, tokens = [], []
    run, cache = start_run(prompt_ids, steps)  # a composed run has taken its first step by now
    for token in run:
        stamps.append(time.perf_counter())  # greedy_steps has .item()'d the token: it is computed
        tokens.append(int(token))
    mx.synchronize()
    return {
        "prefill_s": stamps[0] - started,
        "decode_s": stamps[-1] - stamps[0],
        "peak_bytes": mx.get_peak_memory(),
        "active_before_bytes": active_before,
        "rss_peak_bytes": rss_peak_bytes(),
        "kv": cache_bytes(cache),
        "tokens": tokens,
    }


def run(args: argparse.Namespace) -> int:
    job = json.loads(args.job.read_text())

    import mlx.core as mx

    from models.universal import load_model

    model, _config = load_model(args.model_dir)
    start_run = run_starter(model, job["config"], job["prefill_step_size"])
    warm = timed_run(start_run, job["warmup_ids"], job["warmup_steps"])
    emit({"status": "ready", "side": "in-tree", "warmup": warm, "device": str(mx.default_device())})
    for line in sys.stdin:
        if line.strip() != "run":
            raise SystemExit(f"bench_kv_worker: expected 'run' on stdin, got {line.strip()!r}")
        emit(timed_run(start_run, job["prompt_ids"], job["steps"]))
    return 0
