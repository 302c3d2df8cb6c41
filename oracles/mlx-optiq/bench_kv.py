"""mlx-optiq's side of `python -m harness bench-kv`: runs inside the oracle's own venv, never imports the harness.

One L2 composition per process (fresh peak memory; optiq's patches are process-global): the
patches are installed once, by this directory's generate.py (`install_and_make_cache`, the very
setup its goldens run), then every run is mlx-lm's `generate_step` with the options that setup
returns, on a fresh cache of the kind it builds. Speaks harness.tools.bench_paired's protocol
through oracles/common/kv_bench.py: a warm-up on the job's short prompt, a `ready` line, then
one timed run (time, peak memory, the cache's bytes) per `run` line on stdin.

Usage: python -I bench_kv.py --job JOB.json --out DIR --serve   (job: {"model_dir", "config", ...})
"""

import importlib.util
import sys
import tempfile
from pathlib import Path

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import kv_bench  # noqa: E402
import oracle_base as base  # noqa: E402


def load_generator():
    """This directory's generate.py as a module (the oracle's own composition setup)."""
    spec = importlib.util.spec_from_file_location("optiq_generate", Path(__file__).with_name("generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cache_factory(model, composition, first_cache):
    """Makes new caches of the kind generate.py's install_and_make_cache built (without installing
    again); it keeps only their parameters, not `first_cache`, whose memory goes with its run."""
    from mlx_lm.models.cache import make_prompt_cache

    if composition["kind"] != "rotating_quantized_kv":
        return lambda: make_prompt_cache(model)
    layer = first_cache[0]
    kind, size, keep = type(layer), layer.max_size, layer.keep
    if composition.get("quantized_kv_start") is None:  # RotatingQuantizedKVCache from the first token
        group_size, bits = layer.group_size, layer.bits
        return lambda: [kind(size, keep, group_size=group_size, bits=bits) for _ in model.layers]
    return lambda: [kind(max_size=size, keep=keep) for _ in model.layers]


def main():
    job, _out = base.read_job(base.parser(f"{__doc__.splitlines()[0]}", serve=True).parse_args())
    config = job["config"]
    composition = config.get("composition")
    if composition is None:
        raise SystemExit(f"bench_kv.py (mlx-optiq): {config['name']!r} has no composition; mlx-lm runs L1 options")
    import mlx.core as mx
    import optiq  # noqa: F401  # optiq's import-time patches, as generate.py has them
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    generator = load_generator()
    model, _tokenizer = load(job["model_dir"])
    with tempfile.TemporaryDirectory(prefix="bench-kv-optiq-") as workdir:
        first_cache, options = generator.install_and_make_cache(model, composition, workdir)
    make_cache = cache_factory(model, composition, first_cache)
    caches = [first_cache]  # the first run (the warm-up) uses the one the setup built
    del first_cache

    def start_run(prompt_ids, steps):
        cache = caches.pop() if caches else make_cache()
        return kv_bench.greedy_tokens(
            mx, generate_step, model, cache, prompt_ids, steps, job["prefill_step_size"], options
        )

    environment = {"side": "mlx-optiq", **generator.environment()}
    kv_bench.serve(mx, start_run, job, environment)


if __name__ == "__main__":
    main()
