"""mlx-optiq quality measurement: runs inside the oracle's own venv, never imports the harness.

The candidates mlx-lm alone cannot keep, on mlx-lm with optiq's runtime (as
oracles/mlx-optiq/generate.py installs them for the L2 gates):

- rotating_quantized_kv: `optiq.runtime.kv.patch_rotating_to_quantized()`, then
  RotatingQuantizedKVCache(max_kv_size, keep, group_size, bits) layers, quantized from the first
  token (nothing to convert after a call);
- mixed_kv: `optiq.serve._load_kv_config` on the kv_config (written to a kv_config.json),
  `optiq.serve.install_mixed_kv(configs, quantized_kv_start)`, then mlx-lm's prompt cache with
  mlx_lm.generate.maybe_quantize_kv_cache after every call, looked up at call time (optiq's hook
  replaces it) and given the non-None bits optiq's server passes (the largest configured).

optiq's patches are process-global: the harness runs one process per pair. The control runs
in the same process on mlx-lm's plain cache. Windows, schedule and metrics are
oracles/common/lm_quality.py (loaded by file path).

Usage: python -I quality.py --job JOB.json --out DIR
"""

import importlib
import json
import sys
from pathlib import Path

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402


def candidate_cache(kv, workdir):
    """(make_cache, after_call) for an optiq KV setting, its patches installed."""
    from mlx_lm.models.cache import make_prompt_cache

    if kv["kind"] == "rotating_quantized_kv":
        from optiq.runtime.kv import RotatingQuantizedKVCache, patch_rotating_to_quantized

        patch_rotating_to_quantized()

        def make_cache(model):
            return [
                RotatingQuantizedKVCache(kv["max_kv_size"], kv["keep"], group_size=kv["group_size"], bits=kv["bits"])
                for _ in model.layers
            ]

        return make_cache, lambda cache: None
    if kv["kind"] == "mixed_kv":
        from optiq.serve import _load_kv_config, install_mixed_kv

        path = Path(workdir) / "kv_config.json"
        path.write_text(json.dumps(kv["kv_config"]))
        configs = _load_kv_config(str(path))
        start = kv["quantized_kv_start"]
        install_mixed_kv(configs, start)
        bits = max(c.bits for c in configs)

        def convert(cache):
            sys.modules["mlx_lm.generate"].maybe_quantize_kv_cache(cache, start, 64, bits)

        return make_prompt_cache, convert
    raise SystemExit(f"quality: mlx-optiq measures rotating_quantized_kv and mixed_kv, not {kv['kind']!r}")


def main():
    job, out = base.job_and_out()
    import optiq  # noqa: F401  # optiq's import-time patches, as its CLI (and generate.py) has them

    lm_quality = importlib.import_module("lm_quality")  # after optiq's patches, as generate.py loads lm_steps

    environment = base.mlx_environment("mlx", "mlx-lm", "mlx-optiq", "transformers", missing_ok=True)
    lm_quality.run(job, out, candidate_cache(job["candidate_kv"], out), environment)


if __name__ == "__main__":
    main()
