"""mlx-lm speed probe: runs inside the oracle's own venv, never imports the harness.

Times mlx-lm's own `generate_step` (greedy, one prefill chunk) on the prompt ids the harness
gives it, the same way `python -m harness bench` times the in-tree `greedy_steps`: one warm-up run, then
`repeats` timed runs, each with a fresh cache. Prefill = call to first token (prompt in, step 0
out); decode = first token to last token. Prints one JSON object on stdout.

Usage: python -I bench.py --job JOB.json --out DIR [--serve]
  (job: {"model_dir", "prompt_ids", "steps", "repeats"}; without --serve: DIR/result.json)

With `--serve` it is one side of harness.tools.bench_paired's rounds instead: after loading and the
warm-up it prints a `ready` line (with the warm-up's tokens), then answers every `run` line on
stdin with one timed run (one JSON line), until stdin closes.
"""

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402


def timed_run(model, prompt_ids, steps):
    """One greedy generation of steps + 1 tokens: (prefill seconds, decode seconds)."""
    mx.synchronize()
    mx.reset_peak_memory()
    started = time.perf_counter()
    stamps = []
    for _token, _logprobs in generate_step(mx.array(prompt_ids), model, max_tokens=steps + 1):
        stamps.append(time.perf_counter())  # generate_step has already called .item(): the token is computed
    mx.synchronize()  # generate_step leaves one look-ahead step queued; keep it out of the next run
    return stamps[0] - started, stamps[-1] - stamps[0], mx.get_peak_memory()


def serve(model, job):
    """The paired-rounds protocol: a ready line, then one timed run per `run` line on stdin."""
    tokens = [t for t, _ in generate_step(mx.array(job["prompt_ids"]), model, max_tokens=job["steps"] + 1)]
    mx.synchronize()
    environment = {**base.versions("mlx", "mlx-lm"), "device": str(mx.default_device())}
    emit({"status": "ready", "side": "mlx_lm", "tokens": [int(t) for t in tokens], **environment})
    for line in sys.stdin:
        if line.strip() != "run":
            raise SystemExit(f"bench.py --serve: expected 'run' on stdin, got {line.strip()!r}")
        prefill_s, decode_s, peak = timed_run(model, job["prompt_ids"], job["steps"])
        emit({"prefill_s": prefill_s, "decode_s": decode_s, "peak_bytes": peak})


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    args = base.parser("mlx-lm timed greedy decode", serve=True).parse_args()
    job, out = base.read_job(args)
    model, _tokenizer = load(job["model_dir"])
    if args.serve:
        serve(model, job)
        return
    timed_run(model, job["prompt_ids"], job["steps"])  # warm-up
    runs = [timed_run(model, job["prompt_ids"], job["steps"]) for _ in range(job["repeats"])]
    result = {
        "prefill_s": [r[0] for r in runs],
        "decode_s": [r[1] for r in runs],
        "peak_bytes": [r[2] for r in runs],
        **base.versions("mlx", "mlx-lm"),
        "device": str(mx.default_device()),
        "blas_libraries": base.loaded_libraries(),
    }
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
