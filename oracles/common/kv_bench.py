"""What the oracles' KV benchmark sides share (oracles/mlx-lm/bench_kv.py, oracles/mlx-optiq/bench_kv.py).

Standard library and mlx only; loaded by file path, since the oracle venvs do not have this
repository on sys.path. The protocol is harness.tools.bench_paired's: a `ready` line after
the warm-up, then one JSON line per `run` line on stdin. A run is one greedy generation of
steps + 1 tokens (prefill = call to step 0, decode = step 0 to the last step) on a fresh cache,
measured alike on the in-tree side, whose harness.tools.bench_kv_worker loads this file by path
(harness.oracle.sources.load_common):

- peak_bytes: mx.get_peak_memory() over the run, after mx.reset_peak_memory() (weights included);
- active_before_bytes: mx.get_active_memory() at the start (the weights and what else stays);
- rss_peak_bytes: the process's peak resident set so far (VmHWM; ru_maxrss where there is no /proc);
- kv: the cache once the run has ended: nbytes of every stored array (the whole buffers, what
  the cache holds in memory), the tokens attention can see (offset, at most max_size), classes.
"""

import gc
import json
import resource
import sys
import time


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def rss_peak_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _arrays(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def cache_bytes(cache):
    """The cache's stored bytes and the tokens it holds (layer 0's; every layer holds as many)."""
    first = cache[0]
    keys = _arrays(first.keys)
    window = getattr(first, "max_size", None)
    kv_dtype = None
    if keys:
        kv_dtype = str(keys[1].dtype if len(keys) == 3 else keys[0].dtype)  # a quantized triple: the scales'
    types = {}
    for c in cache:
        types[type(c).__name__] = types.get(type(c).__name__, 0) + 1
    return {
        "nbytes": sum(a.nbytes for c in cache for a in _arrays(c.keys) + _arrays(c.values)),
        "offset": int(first.offset),
        "tokens_held": int(first.offset if window is None else min(first.offset, window)),
        "types": types,
        "dtype": kv_dtype,
    }


def greedy_tokens(mx, generate_step, model, cache, prompt_ids, steps, prefill_step_size, options):
    """mlx-lm's `generate_step` (greedy, chunked prefill) for steps + 1 tokens on `cache`: the token
    iterator and the cache, as `timed_run`'s `start_run` returns them."""
    tokens = generate_step(
        mx.array(prompt_ids),
        model,
        max_tokens=steps + 1,
        prompt_cache=cache,
        prefill_step_size=prefill_step_size,
        **options,
    )
    return (token for token, _logprobs in tokens), cache


def timed_run(mx, start_run):
    """`start_run()` -> (iterator of steps + 1 tokens, the cache list it fills), timed."""
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    active_before = mx.get_active_memory()
    mx.reset_peak_memory()
    started = time.perf_counter()
    tokens, cache = start_run()
    stamps, out = [], []
    for token in tokens:
        stamps.append(time.perf_counter())  # the token is computed: generate_step has called .item()
        out.append(int(token))
    mx.synchronize()  # generate_step leaves one look-ahead step queued; keep it in this run
    return {
        "prefill_s": stamps[0] - started,
        "decode_s": stamps[-1] - stamps[0],
        "peak_bytes": mx.get_peak_memory(),
        "active_before_bytes": active_before,
        "rss_peak_bytes": rss_peak_bytes(),
        "kv": cache_bytes(cache),
        "tokens": out,
    }


def serve(mx, start_run, job, environment):
    """Warm-up (job's short prompt), `ready`, then one timed run of the job's prompt per `run` line."""
    warm = timed_run(mx, lambda: start_run(job["warmup_ids"], job["warmup_steps"]))
    emit({"status": "ready", "warmup": warm, **environment})
    for line in sys.stdin:
        if line.strip() != "run":
            raise SystemExit(f"bench_kv: expected 'run' on stdin, got {line.strip()!r}")
        emit(timed_run(mx, lambda: start_run(job["prompt_ids"], job["steps"])))
