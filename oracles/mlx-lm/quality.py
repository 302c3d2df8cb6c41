"""mlx-lm quality measurement: runs inside the oracle's own venv, never imports the harness.

The pair's control on mlx-lm's plain prompt cache; the candidate on the cache its KV setting
names, kept as mlx_lm.generate.generate_step keeps it: make_prompt_cache and, after every model
call, maybe_quantize_kv_cache(cache, quantized_kv_start, group_size, bits) (QuantizedKVCache);
or RotatingKVCache(max_kv_size, keep) layers (mlx-lm's own rotating cache, unquantized: its
to_quantized raises NotImplementedError, so rotating quantized KV is mlx-optiq's). The windows,
the schedule and the metrics are oracles/common/lm_quality.py (loaded by file path).

Usage: python -I quality.py --job JOB.json --out DIR
"""

import sys
from pathlib import Path

from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import lm_quality  # noqa: E402
import oracle_base as base  # noqa: E402


def candidate_cache(kv):
    """(make_cache, after_call) for the candidate's KV setting (None: the plain cache)."""
    if kv is None:
        return lm_quality.plain_cache, lm_quality.no_conversion
    if kv["kind"] == "quantized":

        def convert(cache):
            maybe_quantize_kv_cache(cache, kv["quantized_kv_start"], kv["group_size"], kv["bits"])

        return make_prompt_cache, convert
    if kv["kind"] == "rotating":
        return (
            lambda model: [RotatingKVCache(max_size=kv["max_kv_size"], keep=kv["keep"]) for _ in model.layers],
            lm_quality.no_conversion,
        )
    raise SystemExit(f"quality: mlx-lm cannot run a {kv['kind']!r} KV setting (mlx-optiq's quality.py does)")


def main():
    job, out = base.job_and_out()
    environment = base.mlx_environment("mlx", "mlx-lm", "transformers")
    lm_quality.run(job, out, candidate_cache(job.get("candidate_kv")), environment)


if __name__ == "__main__":
    main()
