"""mlx-lm's side of `python -m harness bench-kv`: runs inside the oracle's own venv, never imports the harness.

One KV configuration per process (fresh peak memory): mlx-lm's own `generate_step` (greedy,
chunked prefill) on a `make_prompt_cache(model)` cache, with the configuration's kv_bits /
kv_group_size / quantized_kv_start. With max_kv_size, the RotatingKVCache(max_size, keep=4)
layers that make_prompt_cache builds for models without `make_cache` (for llama it ignores
max_kv_size, as oracles/mlx-lm/generate.py notes: generate_step(max_kv_size=...) would run
unbounded). Speaks harness.tools.bench_paired's protocol
through oracles/common/kv_bench.py: a warm-up on the job's short prompt, a `ready` line, then
one timed run (time, peak memory, the cache's bytes) per `run` line on stdin.

An L2 composition (mixed, streaming, rotating quantized) is not mlx-lm's: its `bench_kv.py` is
oracles/mlx-optiq's. mlx-lm 0.32.2 itself raises NotImplementedError for max_kv_size with kv_bits.

Usage: python -I bench_kv.py --job JOB.json --out DIR --serve   (job: {"model_dir", "config", ...})
"""

import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import kv_bench  # noqa: E402
import oracle_base as base  # noqa: E402

QUANTIZATION_OPTIONS = ("kv_bits", "kv_group_size", "quantized_kv_start")


def main():
    job, _out = base.read_job(base.parser(f"{__doc__.splitlines()[0]}", serve=True).parse_args())
    config = job["config"]
    if config.get("composition") is not None:
        raise SystemExit(f"bench_kv.py (mlx-lm): {config['name']!r} is an L2 composition; mlx-optiq runs it")
    options = config["options"]
    unknown = sorted(set(options) - {*QUANTIZATION_OPTIONS, "max_kv_size"})
    if unknown:
        raise SystemExit(f"bench_kv.py (mlx-lm): unknown option(s) {unknown} in configuration {config['name']!r}")
    model, _tokenizer = load(job["model_dir"])
    step_options = {k: options[k] for k in QUANTIZATION_OPTIONS if k in options}

    def start_run(prompt_ids, steps):
        if options.get("max_kv_size") is None:
            cache = make_prompt_cache(model)
        else:
            cache = [RotatingKVCache(max_size=options["max_kv_size"], keep=4) for _ in model.layers]
        return kv_bench.greedy_tokens(
            mx, generate_step, model, cache, prompt_ids, steps, job["prefill_step_size"], step_options
        )

    environment = {"side": "mlx-lm", **base.mlx_environment("mlx", "mlx-lm")}
    kv_bench.serve(mx, start_run, job, environment)


if __name__ == "__main__":
    main()
