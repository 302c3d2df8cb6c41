"""What both sides of a paired speed benchmark time and print alike: the oracle's bench scripts
(oracles/mlx-whisper/bench.py) and the harness's in-tree workers (harness.tools.bench_whisper_worker,
which loads this file by path through harness.oracle.sources.load_common).

Standard library and mlx only; loaded by file path, since the oracle venvs do not have this
repository on sys.path. No golden depends on it: no oracle's generate.py loads it.
"""

import json
import sys
import time

import mlx.core as mx


def emit(obj):
    """One JSON line on stdout, flushed: the paired-rounds protocol's unit."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def best_of(stage, repeats):
    """The fastest of `repeats` timed runs of `stage`, after one untimed run, device work included."""
    stage()
    mx.synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        stage()
        mx.synchronize()
        times.append(time.perf_counter() - started)
    return min(times)
