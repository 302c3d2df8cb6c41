"""Quantization quality as the mlx-lm (and mlx-optiq) oracles measure it: a control and a
candidate fed the same corpus windows teacher-forced, per-token KL(control || candidate), each
side's NLL and its argmax. Runs inside an oracle venv only; oracles/<oracle>/quality.py loads
this file by path and hands it the candidate's cache (the one thing the two venvs differ in).

- Windows: the corpus tokens (tokenizer.encode, no special tokens) cut every `stride` tokens
  into windows of `context`; the model is fed window[:-1], its targets are window[1:], as
  mlx-lm's perplexity.eval_ppl feeds a batch row.
- Schedule: with `chunk`, both sides are fed the window's inputs `chunk` tokens per model call
  on one cache per window (the first call fills it, the later ones attend to it, as decode
  does); without, one call per window. One model call per chunk per side, no per-token host
  round trip. After every call the side's `after_call(cache)` runs (mlx-lm's KV conversion).
- Metrics, from float32 logits: mlx_lm.tuner.losses.kl_div_loss(candidate, control), which is
  KL(control || candidate) (its first argument is the distribution whose log-probabilities are
  subtracted); nn.losses.cross_entropy (eval_ppl's per-token loss); mx.argmax per side.
- `quantized`: per position, whether its model call read a quantized cache in some layer.

Writes into `out`: kl / control_nll / candidate_nll (float32), control_top1 / candidate_top1
(int32), quantized (bool), targets (int32), each a (windows, context - 1) .npy; result.json with
the windows, each window's sha256 of both sides' raw logits, the forward seconds per side and
the environment block.
"""

import hashlib
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tuner.losses import kl_div_loss

ARRAYS = ("kl", "control_nll", "candidate_nll", "control_top1", "candidate_top1", "quantized", "targets")


def windows(ids, context, stride, max_windows):
    starts = list(range(0, len(ids) - context + 1, stride))
    return starts[:max_windows] if max_windows else starts


def logits_sha256(x):
    return hashlib.sha256(np.array(mx.contiguous(x).view(mx.uint8)).tobytes()).hexdigest()


def is_quantized(cache):
    return any("Quantized" in type(c).__name__ for c in cache)


def forward(model, inputs, chunk, make_cache, after_call):
    """The side's logits over one window's inputs: (raw logits (1, n, V), quantized mask (n,))."""
    cache = make_cache(model)
    step = chunk or len(inputs)
    pieces, quantized = [], []
    for start in range(0, len(inputs), step):
        piece = inputs[start : start + step]
        quantized += [is_quantized(cache)] * len(piece)
        logits = model(mx.array(piece)[None], cache=cache)
        after_call(cache)
        mx.eval([logits] + [c.state for c in cache])
        pieces.append(logits)
    return (pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=1)), quantized


def token_metrics(control, candidate, targets):
    """Per position: KL(control || candidate), each side's NLL and argmax (float32 logits in)."""
    kl = kl_div_loss(candidate, control)
    control_nll = nn.losses.cross_entropy(control, targets, reduction="none")
    candidate_nll = nn.losses.cross_entropy(candidate, targets, reduction="none")
    control_top1 = mx.argmax(control, axis=-1)
    candidate_top1 = mx.argmax(candidate, axis=-1)
    out = [kl, control_nll, candidate_nll, control_top1, candidate_top1]
    mx.eval(out)
    return out


def plain_cache(model):
    return make_prompt_cache(model)


def no_conversion(cache):
    return None


def run(job, out, candidate_cache, environment):
    """Measure the job's pair; `candidate_cache` is (make_cache, after_call) for its KV setting."""
    control_model, tokenizer = load(job["control_dir"])
    if job["candidate_dir"] == job["control_dir"]:
        candidate_model, candidate_tokenizer = control_model, tokenizer
    else:
        candidate_model, candidate_tokenizer = load(job["candidate_dir"])
    text = Path(job["corpus_path"]).read_text(encoding="utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if candidate_tokenizer.encode(text, add_special_tokens=False) != ids:
        raise SystemExit("quality: the candidate's tokenizer encodes the corpus differently from the control's")
    context, chunk = job["context"], job["chunk"]
    starts = windows(ids, context, job["stride"], job.get("max_windows"))
    if not starts:
        raise SystemExit(f"quality: the corpus is {len(ids)} tokens, shorter than one window of {context}")
    make_candidate_cache, after_candidate_call = candidate_cache
    per_window = {name: [] for name in ARRAYS}
    digests, seconds = [], {"control": 0.0, "candidate": 0.0}
    for w, start in enumerate(starts):
        window = ids[start : start + context]
        inputs, targets = window[:-1], mx.array(window[1:])[None]
        began = time.perf_counter()
        control, _ = forward(control_model, inputs, chunk, plain_cache, no_conversion)
        seconds["control"] += time.perf_counter() - began
        began = time.perf_counter()
        candidate, quantized = forward(candidate_model, inputs, chunk, make_candidate_cache, after_candidate_call)
        seconds["candidate"] += time.perf_counter() - began
        digests.append({"control": logits_sha256(control), "candidate": logits_sha256(candidate)})
        dtypes = {"control": str(control.dtype), "candidate": str(candidate.dtype)}
        values = token_metrics(control.astype(mx.float32), candidate.astype(mx.float32), targets)
        for name, value in zip(ARRAYS[:5], values, strict=True):
            per_window[name].append(np.array(value).reshape(-1))
        per_window["quantized"].append(np.array(quantized, dtype=bool))
        per_window["targets"].append(np.array(window[1:], dtype=np.int32))
        del control, candidate
        mx.clear_cache()
        print(f"quality: window {w + 1}/{len(starts)}", file=sys.stderr, flush=True)
    for name in ARRAYS:
        array = np.stack(per_window[name])
        np.save(out / f"{name}.npy", array.astype(np.int32) if "top1" in name else array, allow_pickle=False)
    result = {
        "n_corpus_tokens": len(ids),
        "corpus_ids_sha256": hashlib.sha256(np.array(ids, dtype=np.int32).tobytes()).hexdigest(),
        "window_starts": starts,
        "logits_sha256": digests,
        "logits_dtype": dtypes,
        "forward_seconds": seconds,
        "environment": environment,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
