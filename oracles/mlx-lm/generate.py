"""mlx-lm oracle generator: runs inside the oracle's own venv, never imports the harness.

Reads a scenario spec (JSON), runs mlx-lm exactly as its `generate` does (chat template or
plain encode, chunked prefill, `generate_step` with the greedy sampler), and writes, per
scenario, the full logit vector of every step (`<id>.logits.npy`) plus `result.json`.

Logits are captured by wrapping the model object at run time (a proxy whose call records
`out[:, -1, :]`); the installed mlx-lm package is never edited.

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
from mlx_lm.generate import BatchGenerator, generate_step, stream_generate
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
    if scenario["kind"] == "batch":
        return run_batch(model, tokenizer, scenario)
    if scenario["kind"] == "chat" and "turns" in scenario:
        return run_chat_turns(model, tokenizer, scenario)
    rendered, prompt_ids = encode_prompt(tokenizer, scenario)
    n_tokens = scenario["n_tokens"]
    tap = LogitTap(model)
    cache = make_cache(model, scenario)
    prompt = mx.array(prompt_ids)
    options = _generation_options(scenario, len(prompt_ids))
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
    meta = {
        "rendered_prompt": rendered,
        "prompt_ids": [int(t) for t in prompt_ids],
        "tokens": tokens,
        "eos_ids": sorted(int(t) for t in tokenizer.eos_token_ids),
        "logits_dtype": str(rows[0].dtype),
        "prefill_calls": n_chunks + 1,
        "cache_types": sorted({type(c).__name__ for c in cache}),
    }
    if scenario.get("stop") == "eos":
        return stop_as_stream_generate(model, tokenizer, scenario, prompt_ids, meta, logits)
    return meta, logits


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
        options["logits_processors"] = [force_prefix(scenario["forced_prefix"], prompt_length)]
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
        tap = LogitTap(model)
        turn_tokens = []
        for token, _logprobs in generate_step(
            mx.array(prompt_ids),
            tap,
            max_tokens=n_tokens,
            prompt_cache=cache,
            prefill_step_size=scenario["prefill_step_size"],
            **_generation_options(scenario, len(prompt_ids)),
        ):
            turn_tokens.append(int(token))
        n_chunks = len(tap.rows) - (n_tokens + 1)
        turns.append(
            {
                "rendered_prompt": rendered,
                "prompt_ids": [int(t) for t in prompt_ids],
                "n_steps": n_tokens,
                "row_offset": len(rows),
                "prefill_calls": n_chunks + 1,
                "cache_offset_after": int(cache[0].offset),
            }
        )
        rows.extend(tap.rows[n_chunks : n_chunks + n_tokens])
        tokens.extend(turn_tokens)
    logits = np.stack([np.array(r.astype(mx.float32)).reshape(-1) for r in rows])
    return {
        "rendered_prompt": turns[0]["rendered_prompt"],
        "prompt_ids": turns[0]["prompt_ids"],
        "tokens": tokens,
        "eos_ids": sorted(int(t) for t in tokenizer.eos_token_ids),
        "logits_dtype": str(rows[0].dtype),
        "cache_types": sorted({type(c).__name__ for c in cache}),
        "turns": turns,
    }, logits


class BatchLogitTap(LogitTap):
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
    logits = np.stack([np.array(r.astype(mx.float32)).reshape(-1) for r in rows])
    return {
        "rendered_prompt": row_meta[0]["rendered_prompt"],
        "prompt_ids": row_meta[0]["prompt_ids"],
        "tokens": tokens,
        "eos_ids": sorted(int(t) for t in tokenizer.eos_token_ids),
        "logits_dtype": str(rows[0].dtype),
        "prefill_calls": n_prefill,
        "prefill_input_shapes": [list(s) for s in tap.input_shapes[:n_prefill]],
        "cache_types": sorted(cache_types),
        "rows": row_meta,
    }, logits


def _batch_row_scenario(scenario, row):
    """A batch row as a single-prompt scenario, for encode_prompt: a chat or a plain prompt."""
    if "messages" in row:
        kwargs = row.get("template_kwargs", scenario.get("template_kwargs", {}))
        return {"kind": "chat", "messages": row["messages"], "template_kwargs": kwargs}
    return {"kind": "prompt", "prompt": row["prompt"]}


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
