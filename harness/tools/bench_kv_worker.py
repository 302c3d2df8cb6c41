"""The in-tree side of `bench-kv`: one KV configuration in a process of its own (fresh peak memory).

    python -m harness bench-kv-worker --model-dir DIR --job job.json

Speaks harness.tools.bench_paired's protocol through oracles/common/kv_bench.py, loaded by path
(the oracles' sides measure with the same code): a warm-up on the job's short prompt, a `ready`
line, then per `run` line one timed greedy run of steps + 1 tokens on a fresh cache, answered
with prefill and decode seconds, the run's mx peak memory, the process's peak RSS and the final cache's stored bytes.

L1 configurations run `greedy_steps` on a kept cache (`model.make_cache(max_kv_size)`, as
mlx-lm's generate_step runs on its prompt_cache, the look-ahead call included); L2 ones run
`composed_steps`, whose starting cache list is recorded here (`CacheRecorder`): the loop's
conversions replace its items in place, so the list ends as the final caches.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

from harness.oracle.sources import load_common

L1_OPTIONS = ("kv_bits", "kv_group_size", "quantized_kv_start")


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
    """One run of `start_run(prompt_ids, steps)`, timed and measured by oracles/common/kv_bench.py."""
    import mlx.core as mx

    return load_common("kv_bench").timed_run(mx, lambda: start_run(prompt_ids, steps))


def run(args: argparse.Namespace) -> int:
    job = json.loads(args.job.read_text())

    import mlx.core as mx

    from models.universal import load_model

    model, _config = load_model(args.model_dir)
    start_run = run_starter(model, job["config"], job["prefill_step_size"])
    load_common("kv_bench").serve(mx, start_run, job, {"side": "in-tree", "device": str(mx.default_device())})
    return 0
