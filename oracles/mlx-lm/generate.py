"""mlx-lm oracle generator: runs inside the oracle's own venv, never imports the harness.

Reads a scenario spec (JSON), runs mlx-lm exactly as its `generate` does (chat template or
plain encode, chunked prefill, `generate_step` with the greedy sampler), and writes, per
scenario, the full logit vector of every step (`<id>.logits.npy`) plus `result.json`.

Logits are captured by wrapping the model object at run time (a proxy whose call records
`out[:, -1, :]`); the installed mlx-lm package is never edited.

Usage: python -I generate.py --spec spec.json --out DIR
"""

import argparse
import importlib.metadata
import json
import platform
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache


class LogitTap:
    """Stands in for the model inside generate_step and keeps each call's last-position logits."""

    def __init__(self, model):
        self._model = model
        self.rows = []

    def __call__(self, *args, **kwargs):
        out = self._model(*args, **kwargs)
        self.rows.append(out[:, -1, :])
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def encode_prompt(tokenizer, scenario):
    """What mlx-lm's generate does with a prompt: template for chats, plain encode otherwise."""
    if scenario["kind"] == "chat":
        rendered = tokenizer.apply_chat_template(
            scenario["messages"],
            tokenize=False,
            add_generation_prompt=True,
            **scenario.get("template_kwargs", {}),
        )
        return rendered, tokenizer.encode(rendered, add_special_tokens=False)
    return None, tokenizer.encode(scenario["prompt"], add_special_tokens=True)


def force_prefix(forced, prompt_length):
    """A logits processor (mlx-lm's own hook) that makes the first sampled tokens `forced`.

    Only the processed logits change: the tap has already recorded the model's raw ones.
    """

    def processor(tokens, logits):
        index = tokens.size - prompt_length
        if index >= len(forced):
            return logits
        keep = mx.arange(logits.shape[-1]) == forced[index]
        return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))

    return processor


def make_cache(model, scenario):
    """mlx-lm's cache for the scenario.

    `max_kv_size` builds the RotatingKVCache(max_size, keep=4) that make_prompt_cache builds
    for models without `make_cache`: for llama, make_prompt_cache ignores max_kv_size, since
    the model's own make_cache wins (mlx-lm 0.32.2).
    """
    if scenario.get("max_kv_size") is not None:
        return [RotatingKVCache(max_size=scenario["max_kv_size"], keep=4) for _ in model.layers]
    return make_prompt_cache(model)


def run_scenario(model, tokenizer, scenario):
    rendered, prompt_ids = encode_prompt(tokenizer, scenario)
    n_tokens = scenario["n_tokens"]
    tap = LogitTap(model)
    cache = make_cache(model, scenario)
    prompt = mx.array(prompt_ids)
    options = {
        k: scenario[k] for k in ("kv_bits", "kv_group_size", "quantized_kv_start") if scenario.get(k) is not None
    }
    if scenario.get("forced_prefix"):
        options["logits_processors"] = [force_prefix(scenario["forced_prefix"], len(prompt_ids))]
    tokens = []
    # Greedy, no stop on EOS: the logits of every step are compared, EOS is judged separately.
    for token, _logprobs in generate_step(
        prompt,
        tap,
        max_tokens=n_tokens,
        prompt_cache=cache,
        prefill_step_size=scenario["prefill_step_size"],
        **options,
    ):
        tokens.append(int(token))
    # Calls are: the prefill chunks (their logits are unused), then one per produced token,
    # plus the look-ahead step generate_step computes before it stops.
    n_chunks = len(tap.rows) - (n_tokens + 1)
    rows = tap.rows[n_chunks : n_chunks + n_tokens]
    logits = np.stack([np.array(r.astype(mx.float32)).reshape(-1) for r in rows])
    return {
        "rendered_prompt": rendered,
        "prompt_ids": [int(t) for t in prompt_ids],
        "tokens": tokens,
        "eos_ids": sorted(int(t) for t in tokenizer.eos_token_ids),
        "logits_dtype": str(rows[0].dtype),
        "prefill_calls": n_chunks + 1,
        "cache_types": sorted({type(c).__name__ for c in cache}),
    }, logits


def loaded_libraries():
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "blas" in line.lower()})
    except OSError:
        return []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    model, tokenizer = load(spec["model_dir"])
    result = {"scenarios": {}}
    for scenario in spec["scenarios"]:
        try:
            meta, logits = run_scenario(model, tokenizer, scenario)
        except Exception as e:  # one scenario the oracle cannot run must not hide the others
            result["scenarios"][scenario["id"]] = {"error": f"{type(e).__name__}: {e}"}
            print(f"oracle: {scenario['id']}: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        # Determinism self-check: a second run must give the same bits, or the golden means nothing.
        again_meta, again = run_scenario(model, tokenizer, scenario)
        if again_meta["tokens"] != meta["tokens"] or again.tobytes() != logits.tobytes():
            differing = [i for i in range(len(logits)) if again[i].tobytes() != logits[i].tobytes()]
            print(
                f"oracle is not deterministic on scenario {scenario['id']}: two runs differ at steps "
                f"{differing[:8]}; no golden written",
                file=sys.stderr,
            )
            sys.exit(3)
        np.save(args.out / f"{scenario['id']}.logits.npy", logits, allow_pickle=False)
        result["scenarios"][scenario["id"]] = meta
        print(f"oracle: {scenario['id']}: {len(meta['tokens'])} steps", file=sys.stderr, flush=True)
    result["environment"] = {
        "mlx": importlib.metadata.version("mlx"),
        "mlx-lm": importlib.metadata.version("mlx-lm"),
        "transformers": importlib.metadata.version("transformers"),
        "device": str(mx.default_device()),
        "python": platform.python_version(),
        "blas_libraries": loaded_libraries(),
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
