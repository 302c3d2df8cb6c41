"""mlx-optiq (L2) oracle generator: runs inside the oracle's own venv, never imports the harness.

Same spec and output format as oracles/mlx-lm/generate.py, with whose generator it shares
oracles/common/lm_steps.py (prompt encoding, logit tap, forcing, the tapped generate_step run)
and oracles/common/oracle_base.py (command line, environment block), both loaded by file path
so the two cannot drift. Every scenario carries a "composition":

- mixed_kv: `optiq.serve._load_kv_config` on the kv_config (written to a kv_config.json),
  `optiq.serve.install_mixed_kv(configs, quantized_kv_start)`, then mlx-lm's generate_step
  with the non-None kv_bits optiq's server injects (the largest configured bits);
- streaming_kv: `optiq.runtime.streaming_kv_quant.install()`, generate_step with kv_bits;
- fused_sdpa: `optiq.runtime.fused_quant_sdpa.install(n_chunk=...)` plus the streaming
  conversion (optiq serve turns both on for a quantized KV cache), generate_step with kv_bits;
- rotating_quantized_kv: `optiq.runtime.kv.patch_rotating_to_quantized()`; with
  quantized_kv_start, RotatingKVCache(max_kv_size, keep) layers converted by the streaming
  conversion, without it RotatingQuantizedKVCache(max_kv_size, keep, group_size, bits) layers;
- ngram_draft: `optiq.runtime.ngram_spec.ngram_generate_step(..., adaptive=False)`.

Parameters a composition leaves out take optiq's / mlx-lm's own defaults. The patches are
process-global, so each scenario runs in a fresh subprocess of this interpreter, twice (the
determinism self-check: exit 3 when the two runs differ). Per step the record holds:

- logits: for the generate_step paths the model's raw last-position logits (tapped, as the
  mlx-lm oracle does); for ngram_draft the logprobs the generator yields with each token;
- step_info: for ngram_draft how much NgramStats.drafted / .accepted grew since the previous
  token; on the last step of every path "final_cache", the cache after the generator ended
  (per layer: class, offset, bits/group size, sha256 of the stored keys and values).

Usage: python -I generate.py --job JOB.json --out DIR   (job: {"model_dir", "scenarios"})
"""

import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402


def _given(composition, *names):
    return {name: composition[name] for name in names if composition.get(name) is not None}


# ---- the child: one scenario, in a fresh process ----


def install_and_make_cache(model, composition, workdir):
    """Install the composition's optiq patches; return (prompt cache, generate_step options)."""
    import optiq.runtime.fused_quant_sdpa as fused_quant_sdpa
    import optiq.runtime.streaming_kv_quant as streaming_kv_quant
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache
    from optiq.runtime.kv import RotatingQuantizedKVCache, patch_rotating_to_quantized

    kind = composition["kind"]
    kv_options = _given(composition, "kv_bits", "kv_group_size", "quantized_kv_start")
    if kind == "mixed_kv":
        from optiq.serve import _load_kv_config, install_mixed_kv

        path = Path(workdir) / "kv_config.json"
        path.write_text(json.dumps(composition["kv_config"]))
        configs = _load_kv_config(str(path))
        start = composition.get("quantized_kv_start")
        if start is None:
            from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START as start
        install_mixed_kv(configs, start)
        # What optiq's patched server stream_generate passes to mlx-lm (the hook ignores it).
        options = {"kv_bits": max(c.bits for c in configs), "kv_group_size": 64, "quantized_kv_start": start}
        return make_prompt_cache(model), options
    if kind == "streaming_kv":
        streaming_kv_quant.install()
        return make_prompt_cache(model), kv_options
    if kind == "fused_sdpa":
        fused_quant_sdpa.install(**_given(composition, "n_chunk"))
        streaming_kv_quant.install()
        return make_prompt_cache(model), kv_options
    if kind == "rotating_quantized_kv":
        patch_rotating_to_quantized()
        size, keep = composition["max_kv_size"], composition["keep"]
        if composition.get("quantized_kv_start") is None:
            quant = {
                "bits": composition["kv_bits"],
                **_given({"group_size": composition.get("kv_group_size")}, "group_size"),
            }
            return [RotatingQuantizedKVCache(size, keep, **quant) for _ in model.layers], {}
        streaming_kv_quant.install()
        return [RotatingKVCache(max_size=size, keep=keep) for _ in model.layers], kv_options
    raise ValueError(f"composition.kind: unknown kind {kind!r}")


def _array_bytes(x):
    import mlx.core as mx

    return np.array(mx.contiguous(x).view(mx.uint8)).tobytes()


def cache_digest(cache):
    """Per layer: class, offset, bits/group size and sha256 over the stored keys and values
    (the first `offset` positions of an unbounded cache; the whole ring of a rotating one)."""
    from mlx_lm.models.cache import RotatingKVCache

    out = []
    for c in cache:
        entry = {"type": type(c).__name__, "offset": int(c.offset)}
        if hasattr(c, "bits"):
            entry["bits"], entry["group_size"] = int(c.bits), int(c.group_size)
        if c.keys is None:
            entry["sha256"] = None
        else:
            keys = list(c.keys) if isinstance(c.keys, (list, tuple)) else [c.keys]
            values = list(c.values) if isinstance(c.values, (list, tuple)) else [c.values]
            if isinstance(c, RotatingKVCache):
                entry["idx"] = int(c._idx)
                arrays = keys + values
            else:
                arrays = [x[..., : c.offset, :] for x in keys + values]
            digest = hashlib.sha256()
            for x in arrays:
                digest.update(repr(tuple(x.shape)).encode())
                digest.update(_array_bytes(x))
            entry["sha256"] = digest.hexdigest()
        out.append(entry)
    return out


def run_generate_step_path(shared, model, scenario, prompt_ids, workdir):
    cache, options = install_and_make_cache(model, scenario["composition"], workdir)
    if scenario.get("forced_prefix"):
        options["logits_processors"] = [shared.force_prefix(scenario["forced_prefix"], len(prompt_ids))]
    tokens, rows, prefill_calls = shared.tapped_steps(
        model, prompt_ids, scenario["n_tokens"], cache, scenario["prefill_step_size"], options
    )
    step_info = [{} for _ in tokens]
    step_info[-1] = {"final_cache": cache_digest(cache)}
    return tokens, rows, step_info, {"prefill_calls": prefill_calls, "cache": cache}


def run_ngram_path(shared, model, scenario, prompt_ids):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from optiq.runtime.ngram_spec import NgramStats, ngram_generate_step

    composition = scenario["composition"]
    options = _given(
        composition, "num_draft_tokens", "ngram_min", "ngram_max", "kv_bits", "kv_group_size", "quantized_kv_start"
    )
    if scenario.get("forced_prefix"):
        options["logits_processors"] = [shared.force_prefix(scenario["forced_prefix"], len(prompt_ids))]
    stats = NgramStats()
    cache = make_prompt_cache(model)
    tokens, rows, step_info = [], [], []
    seen = (0, 0)
    for token, logprobs in ngram_generate_step(
        mx.array(prompt_ids),
        model,
        max_tokens=scenario["n_tokens"],
        prompt_cache=cache,
        prefill_step_size=scenario["prefill_step_size"],
        stats=stats,
        adaptive=False,
        **options,
    ):
        tokens.append(int(token))
        rows.append(logprobs)
        step_info.append({"drafted": stats.drafted - seen[0], "accepted": stats.accepted - seen[1]})
        seen = (stats.drafted, stats.accepted)
    # The generator has ended: its `finally` rolled the cache back to what was yielded.
    step_info[-1]["final_cache"] = cache_digest(cache)
    stats_summary = {k: getattr(stats, k) for k in ("verify_steps", "plain_steps", "drafted", "accepted", "tokens")}
    return tokens, rows, step_info, {"ngram_stats": stats_summary, "cache": cache}


def environment():
    return base.mlx_environment("mlx", "mlx-lm", "mlx-optiq", "transformers", missing_ok=True)


def run_child(spec, scenario_id, out):
    scenario = next(s for s in spec["scenarios"] if s["id"] == scenario_id)
    if not isinstance(scenario.get("composition"), dict) or "kind" not in scenario["composition"]:
        meta = {"error": f"scenario {scenario_id}: an mlx-optiq scenario needs a 'composition' with a 'kind'"}
        (Path(out) / "meta.json").write_text(json.dumps(meta))
        return
    import optiq  # noqa: F401  # optiq's import-time patches (model types, nn.quantize), as its CLI has them
    from mlx_lm import load

    shared = importlib.import_module("lm_steps")  # after optiq's patches, as before this file shared it
    try:
        model, tokenizer = load(spec["model_dir"])
        rendered, prompt_ids = shared.encode_prompt(tokenizer, scenario)
        if scenario["composition"]["kind"] == "ngram_draft":
            tokens, rows, step_info, extra = run_ngram_path(shared, model, scenario, prompt_ids)
        else:
            tokens, rows, step_info, extra = run_generate_step_path(shared, model, scenario, prompt_ids, out)
    except Exception as e:  # one scenario optiq cannot run must not hide the others
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        meta = {"error": f"{type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno} in {where.name})"}
        (Path(out) / "meta.json").write_text(json.dumps(meta))
        return
    cache = extra.pop("cache")
    np.save(Path(out) / "logits.npy", shared.stack_rows(rows), allow_pickle=False)
    meta = shared.step_record(rendered, prompt_ids, tokens, tokenizer, rows) | {
        "cache_types": sorted({type(c).__name__ for c in cache}),
        "composition": scenario["composition"],
        "step_info": step_info,
        **extra,
        "environment": environment(),
    }
    meta |= importlib.import_module("lm_text").stream_text(tokenizer, meta)  # the detokenize check
    (Path(out) / "meta.json").write_text(json.dumps(meta))


# ---- the parent: a fresh process per scenario run ----


def run_fresh(spec, scenario_id, workdir):
    """One run of one scenario in a new interpreter (the job with `child_scenario` named);
    returns (meta, logits or None)."""
    # The child runs as this process was started: isolated in the oracle venv (-I), or on the
    # PYTHONPATH of a prepared interpreter (-s, machines without a package index).
    isolation = "-I" if sys.flags.isolated else "-s"
    child_job = Path(workdir) / "job.json"
    child_job.write_text(json.dumps(spec | {"child_scenario": scenario_id}))
    cmd = [sys.executable, isolation, str(Path(__file__).resolve()), "--job", str(child_job), "--out", str(workdir)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    meta_path = Path(workdir) / "meta.json"
    if done.returncode != 0 or not meta_path.exists():
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"error": f"oracle process exited {done.returncode}: {tail}"}, None
    meta = json.loads(meta_path.read_text())
    if "error" in meta:
        return meta, None
    return meta, np.load(Path(workdir) / "logits.npy", allow_pickle=False)


def main():
    spec, out = base.job_and_out("mlx-optiq oracle: goldens of the composed scenarios")
    if "child_scenario" in spec:
        run_child(spec, spec["child_scenario"], out)
        return
    result = {"scenarios": {}}
    env = None
    for scenario in spec["scenarios"]:
        sid = scenario["id"]
        with tempfile.TemporaryDirectory() as first_dir, tempfile.TemporaryDirectory() as second_dir:
            meta, logits = run_fresh(spec, sid, first_dir)
            if logits is None:
                result["scenarios"][sid] = {"error": meta["error"]}
                print(f"oracle: {sid}: FAILED: {meta['error']}", file=sys.stderr, flush=True)
                continue
            # Determinism self-check: a second fresh process must give the same bits.
            again_meta, again = run_fresh(spec, sid, second_dir)
        same = (
            again is not None
            and again_meta["tokens"] == meta["tokens"]
            and again_meta["step_info"] == meta["step_info"]
            and again.tobytes() == logits.tobytes()
        )
        if not same:
            differing = (
                [] if again is None else [i for i in range(len(logits)) if again[i].tobytes() != logits[i].tobytes()]
            )
            print(
                f"oracle is not deterministic on scenario {sid}: two runs differ (logits at steps {differing[:8]}, "
                f"tokens equal: {again_meta.get('tokens') == meta['tokens']}, step_info equal: "
                f"{again_meta.get('step_info') == meta['step_info']}); no golden written",
                file=sys.stderr,
            )
            sys.exit(3)
        env = env or meta.pop("environment")
        meta.pop("environment", None)
        np.save(out / f"{sid}.logits.npy", logits, allow_pickle=False)
        result["scenarios"][sid] = meta
        print(f"oracle: {sid}: {len(meta['tokens'])} steps", file=sys.stderr, flush=True)
    result["environment"] = env or environment_without_runs()
    (out / "result.json").write_text(json.dumps(result, indent=2))


def environment_without_runs():
    """When every scenario failed: the versions still identify the oracle."""
    import mlx.core  # noqa: F401  # loads the BLAS the runs would have used

    return environment()


if __name__ == "__main__":
    main()
