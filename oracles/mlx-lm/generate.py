"""mlx-lm oracle generator: runs inside the oracle's own venv, never imports the harness.

Reads a scenario spec (JSON), runs mlx-lm exactly as its `generate` does (chat template or
plain encode, chunked prefill, `generate_step` with the greedy sampler), and writes, per
scenario, the full logit vector of every step (`<id>.logits.npy`) plus `result.json`.

Logits are captured by wrapping the model object at run time (a proxy whose call records
`out[:, -1, :]`); the installed mlx-lm package is never edited. The prompt encoding, the tap,
the forcing and the tapped generate_step run are oracles/common/lm_steps.py (shared with the
mlx-optiq oracle), the command line and environment block oracles/common/oracle_base.py; both
are loaded by file path.

Besides single-prompt scenarios, two kinds run several segments of steps, stacked in order
in the logits file and described in result.json:

- a chat with `turns` (mlx_lm.chat's prompt-cache reuse): one cache kept across turns,
  each turn templating only its new messages and running `generate_step` on that cache;
  segments are listed under "turns";
- `kind: batch` (mlx_lm.generate's BatchGenerator): several prompts decoded together,
  the full logit vector of each row sliced from the batched model call; row-major
  segments are listed under "rows".

A scenario with `stop: eos` ends where mlx-lm's `stream_generate` (and so `generate`) ends
it: at the first EOS id, the EOS token included, or after n_tokens. Its tokens are
`stream_generate`'s own, checked against the logits run's, and `finish_reason` is recorded.

Usage: python -I generate.py --job JOB.json --out DIR   (job: {"model_dir", "scenarios"})
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.generate import BatchGenerator, stream_generate
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import lm_response  # noqa: E402
import lm_speculative as speculative  # noqa: E402
import lm_steps as steps  # noqa: E402
import lm_text  # noqa: E402
import oracle_base as base  # noqa: E402

encode_prompt = steps.encode_prompt


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
    if scenario["kind"] == "batch":
        return run_batch(model, tokenizer, scenario)
    if scenario["kind"] == "chat" and "turns" in scenario:
        return run_chat_turns(model, tokenizer, scenario)
    if scenario.get("draft"):
        return run_draft(model, tokenizer, scenario)
    rendered, prompt_ids = encode_prompt(tokenizer, scenario)
    cache = make_cache(model, scenario)
    # Greedy, no stop on EOS: the logits of every step are compared, EOS is judged separately.
    tokens, rows, prefill_calls = steps.tapped_steps(
        model,
        prompt_ids,
        scenario["n_tokens"],
        cache,
        scenario["prefill_step_size"],
        _generation_options(scenario, len(prompt_ids)),
    )
    logits = steps.stack_rows(rows)
    meta = steps.step_record(rendered, prompt_ids, tokens, tokenizer, rows) | {
        "prefill_calls": prefill_calls,
        "cache_types": sorted({type(c).__name__ for c in cache}),
    }
    if scenario.get("stop") == "eos":
        meta, logits = stop_as_stream_generate(model, tokenizer, scenario, prompt_ids, meta, logits)
    if scenario.get("response") is not None:  # the `response` check: mlx-lm's server over these tokens
        meta["server_response"] = lm_response.response_record(model, tokenizer, scenario, prompt_ids, meta["tokens"])
    return meta, logits


def run_draft(model, tokenizer, scenario):
    """speculative_generate_step with a draft model (oracles/common/lm_speculative.py)."""
    rendered, prompt_ids = encode_prompt(tokenizer, scenario)
    tokens, rows, verify, step_info, prefill_calls = speculative.run_speculative(model, prompt_ids, scenario, load)
    return steps.step_record(rendered, prompt_ids, tokens, tokenizer, rows) | {
        "prefill_calls": prefill_calls,
        "step_info": step_info,
        "arrays": ["verify_logits"],
        "_arrays": {"verify_logits": steps.stack_rows(verify)},
    }, steps.stack_rows(rows)


def stop_as_stream_generate(model, tokenizer, scenario, prompt_ids, meta, logits):
    """Where stream_generate stops, with its tokens: the logits run above computed the same
    steps (generate_step underneath both), so its rows are cut to stream_generate's length."""
    responses = list(
        stream_generate(
            model,
            tokenizer,
            mx.array(prompt_ids),
            max_tokens=scenario["n_tokens"],
            prompt_cache=make_cache(model, scenario),
            prefill_step_size=scenario["prefill_step_size"],
            **_generation_options(scenario, len(prompt_ids)),
        )
    )
    tokens = [int(r.token) for r in responses]
    if tokens != meta["tokens"][: len(tokens)]:
        raise RuntimeError(f"stream_generate chose {tokens}, generate_step {meta['tokens'][: len(tokens)]}")
    return meta | {"tokens": tokens, "finish_reason": responses[-1].finish_reason}, logits[: len(tokens)]


def _generation_options(scenario, prompt_length):
    options = {
        k: scenario[k] for k in ("kv_bits", "kv_group_size", "quantized_kv_start") if scenario.get(k) is not None
    }
    if scenario.get("forced_prefix"):
        options["logits_processors"] = [steps.force_prefix(scenario["forced_prefix"], prompt_length)]
    return options


def run_chat_turns(model, tokenizer, scenario):
    """mlx_lm.chat's loop: one prompt cache for the whole conversation, each turn templating
    only its own new messages (add_generation_prompt) and decoding on that cache.

    generate_step feeds every token it yields (it queues the next step before yielding), so
    after a turn of n steps the cache holds that turn's prompt and all n tokens; the next
    turn's prompt follows them. forced_prefix (if any) applies to every turn.
    """
    n_tokens = scenario["n_tokens"]
    cache = make_cache(model, scenario)
    turns, tokens, rows = [], [], []
    for messages in scenario["turns"]:
        rendered, prompt_ids = encode_prompt(tokenizer, {**scenario, "messages": messages})
        turn_tokens, turn_rows, prefill_calls = steps.tapped_steps(
            model,
            prompt_ids,
            n_tokens,
            cache,
            scenario["prefill_step_size"],
            _generation_options(scenario, len(prompt_ids)),
        )
        turns.append(
            {
                "rendered_prompt": rendered,
                "prompt_ids": [int(t) for t in prompt_ids],
                "n_steps": n_tokens,
                "row_offset": len(rows),
                "prefill_calls": prefill_calls,
                "cache_offset_after": int(cache[0].offset),
            }
        )
        rows.extend(turn_rows)
        tokens.extend(turn_tokens)
    first = turns[0]
    return steps.step_record(first["rendered_prompt"], first["prompt_ids"], tokens, tokenizer, rows) | {
        "cache_types": sorted({type(c).__name__ for c in cache}),
        "turns": turns,
    }, steps.stack_rows(rows)


class BatchLogitTap(steps.LogitTap):
    """A LogitTap that also keeps each call's input shape (to tell prefill from decode)."""

    def __init__(self, model):
        super().__init__(model)
        self.input_shapes = []

    def __call__(self, inputs, *args, **kwargs):
        self.input_shapes.append(tuple(inputs.shape))
        return super().__call__(inputs, *args, **kwargs)


BATCH_OPTIONS = ("prefill_batch_size", "completion_batch_size")


def run_batch(model, tokenizer, scenario):
    """mlx_lm's BatchGenerator (what batch_generate drives) over the scenario's prompts.

    Every row decodes exactly n_tokens: no stop tokens are given (the EOS ids are still
    recorded), and each row's max_tokens is n_tokens. Row b of a batched model call is the
    sequence at position b of the generation batch's uids; that is checked, not assumed:
    each response's logprobs must equal, bit for bit, the log-softmax of the tapped row.
    """
    n_tokens = scenario["n_tokens"]
    encoded = [encode_prompt(tokenizer, _batch_row_scenario(scenario, row)) for row in scenario["batch"]]
    tap = BatchLogitTap(model)
    options = {k: scenario[k] for k in BATCH_OPTIONS if scenario.get(k) is not None}
    generator = BatchGenerator(
        tap, max_tokens=n_tokens, stop_tokens=None, prefill_step_size=scenario["prefill_step_size"], **options
    )
    try:
        uids = generator.insert([ids for _, ids in encoded], max_tokens=[n_tokens] * len(encoded))
        responses_by_step = []
        cache_types = set()
        while responses := generator.next_generated():
            responses_by_step.append(responses)
            cache_types |= {type(c).__name__ for c in generator._generation_batch.prompt_cache}
    finally:
        generator.close()
    # The decode calls are the last n_tokens + 1 (the final one is the look-ahead).
    n_prefill = len(tap.rows) - (n_tokens + 1)
    decode_rows = tap.rows[n_prefill : n_prefill + n_tokens]
    if len(responses_by_step) != n_tokens:
        raise RuntimeError(f"BatchGenerator produced {len(responses_by_step)} steps, expected {n_tokens}")
    per_uid = {uid: ([], []) for uid in uids}
    for step, (responses, batch_logits) in enumerate(zip(responses_by_step, decode_rows, strict=True)):
        if [r.uid for r in responses] != uids or batch_logits.shape[0] != len(uids):
            raise RuntimeError(f"step {step}: batch order {[r.uid for r in responses]} is not the insertion order")
        logprobs = batch_logits - mx.logsumexp(batch_logits, axis=-1, keepdims=True)
        for b, response in enumerate(responses):
            if not mx.array_equal(response.logprobs, logprobs[b]).item():
                raise RuntimeError(f"step {step}: uid {response.uid}'s logprobs are not row {b} of the model call")
            per_uid[response.uid][0].append(batch_logits[b])
            per_uid[response.uid][1].append(int(response.token))
    rows, tokens, row_meta = [], [], []
    for (rendered, prompt_ids), uid in zip(encoded, uids, strict=True):
        row_logits, row_tokens = per_uid[uid]
        row_meta.append(
            {
                "rendered_prompt": rendered,
                "prompt_ids": [int(t) for t in prompt_ids],
                "n_steps": len(row_tokens),
                "row_offset": len(rows),
            }
        )
        rows.extend(row_logits)
        tokens.extend(row_tokens)
    first = row_meta[0]
    return steps.step_record(first["rendered_prompt"], first["prompt_ids"], tokens, tokenizer, rows) | {
        "prefill_calls": n_prefill,
        "prefill_input_shapes": [list(s) for s in tap.input_shapes[:n_prefill]],
        "cache_types": sorted(cache_types),
        "rows": row_meta,
    }, steps.stack_rows(rows)


def _batch_row_scenario(scenario, row):
    """A batch row as a single-prompt scenario, for encode_prompt: a chat or a plain prompt."""
    if "messages" in row:
        kwargs = row.get("template_kwargs", scenario.get("template_kwargs", {}))
        return {"kind": "chat", "messages": row["messages"], "template_kwargs": kwargs}
    return {"kind": "prompt", "prompt": row["prompt"]}


def main():
    spec, out = base.job_and_out("mlx-lm oracle: goldens of the scenarios")
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
        arrays, again_arrays = meta.pop("_arrays", {}), again_meta.pop("_arrays", {})
        differs = any(again_arrays[k].tobytes() != a.tobytes() for k, a in arrays.items())
        if differs or (arrays and again_meta != meta):
            print(f"oracle is not deterministic on {scenario['id']}: arrays or step info differ", file=sys.stderr)
            sys.exit(3)
        if again_meta["tokens"] != meta["tokens"] or again.tobytes() != logits.tobytes():
            differing = [i for i in range(len(logits)) if again[i].tobytes() != logits[i].tobytes()]
            print(
                f"oracle is not deterministic on scenario {scenario['id']}: two runs differ at steps "
                f"{differing[:8]}; no golden written",
                file=sys.stderr,
            )
            sys.exit(3)
        np.save(out / f"{scenario['id']}.logits.npy", logits, allow_pickle=False)
        for name, array in arrays.items():
            np.save(out / f"{scenario['id']}.{name}.npy", array, allow_pickle=False)
        # What stream_generate streams as text for these tokens, per segment (the detokenize check).
        stop = tokenizer.eos_token_ids if scenario.get("stop") == "eos" else ()
        result["scenarios"][scenario["id"]] = meta | lm_text.stream_text(tokenizer, meta, stop)
        print(f"oracle: {scenario['id']}: {len(meta['tokens'])} steps", file=sys.stderr, flush=True)
    result["environment"] = base.mlx_environment("mlx", "mlx-lm", "transformers")
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
