"""Draft-model speculative decoding as mlx-lm's `speculative_generate_step` runs it, tapped.

Imports mlx and mlx_lm: for the mlx-lm oracle venv only (loaded by path, like lm_steps).

The run is mlx-lm's own generator, greedy, over a prompt cache that is the target's layer
caches followed by the draft's (as the function slices it). Two taps, neither edits the
installed package:

- the target is wrapped in a proxy that keeps every call's full logits (all positions):
  the last `len(verify steps)` calls are the verify calls, one row per verified position
  (the current token plus the drafts), in order;
- `mlx_lm.generate.trim_prompt_cache` is wrapped for the run: `_rewind_cache` calls it once
  for the target's caches and once for the draft's after every verify step (the last one in
  the generator's `finally`), so the draft cache's state after each rewind is recorded there
  (per layer: offset and sha256 of the keys and values up to it) with the target's offset.

Record: `tokens` the yielded tokens; `logits` per yielded token the raw verify row that
decided it; array `verify_logits` every verify row; `step_info` per token {"from_draft"},
and on the last token of verify step j also {"verify_step", "drafted", "accepted",
"target_offset", "draft_cache"} (accepted counted from the yields: the from_draft tokens
of the step, which must equal the drafted count minus the target's trim).
"""

import hashlib
import sys

import mlx.core as mx
import mlx_lm.generate  # noqa: F401  (the module; `mlx_lm.generate` the attribute is the function)
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

mlx_generate = sys.modules["mlx_lm.generate"]

_DRAFTS = {}  # draft model dir -> loaded model (the determinism rerun reuses it)


class FullLogitTap:
    """Stands in for the target inside speculative_generate_step; keeps every call's logits."""

    def __init__(self, model):
        self._model = model
        self.calls = []

    def __call__(self, *args, **kwargs):
        out = self._model(*args, **kwargs)
        self.calls.append(out[0])
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def cache_state(caches):
    """Per layer: class, offset and sha256 over shape and raw bytes of keys/values[:offset]."""
    out = []
    for c in caches:
        entry = {"type": type(c).__name__, "offset": int(c.offset)}
        if c.keys is None:
            entry["sha256"] = None
        else:
            digest = hashlib.sha256()
            for x in (c.keys[..., : c.offset, :], c.values[..., : c.offset, :]):
                digest.update(repr(tuple(x.shape)).encode())
                digest.update(np.array(mx.contiguous(x).view(mx.uint8)).tobytes())
            entry["sha256"] = digest.hexdigest()
        out.append(entry)
    return out


def draft_model_of(scenario, target, load):
    """The target itself (`artifact: target`) or the model at the spec's draft model_dir."""
    draft = scenario["draft"]
    if draft.get("artifact") == "target":
        return target
    path = draft["model_dir"]
    if path not in _DRAFTS:
        _DRAFTS[path] = load(path)[0]
    return _DRAFTS[path]


def run_speculative(model, prompt_ids, scenario, load):
    """(tokens, per-token rows, verify rows, step_info, prefill_calls) of one greedy run."""
    draft_model = draft_model_of(scenario, model, load)
    tap = FullLogitTap(model)
    target_cache, draft_cache = make_prompt_cache(model), make_prompt_cache(draft_model)
    rewinds = []
    original = mlx_generate.trim_prompt_cache

    def traced_trim(cache, n):
        trimmed = original(cache, n)
        if cache and cache[0] is draft_cache[0]:
            rewinds.append({"target_offset": int(target_cache[0].offset), "draft_cache": cache_state(draft_cache)})
        return trimmed

    tokens, from_draft = [], []
    mlx_generate.trim_prompt_cache = traced_trim
    try:
        for token, _logprobs, drafted in mlx_generate.speculative_generate_step(
            mx.array(prompt_ids),
            tap,
            draft_model,
            num_draft_tokens=scenario["draft"]["num_draft_tokens"],
            max_tokens=scenario["n_tokens"],
            prompt_cache=target_cache + draft_cache,
            prefill_step_size=scenario["prefill_step_size"],
        ):
            tokens.append(int(token))
            from_draft.append(bool(drafted))
    finally:
        mlx_generate.trim_prompt_cache = original
    verify = tap.calls[len(tap.calls) - len(rewinds) :]
    groups = _groups(from_draft)
    if len(groups) != len(rewinds):
        raise RuntimeError(f"{len(groups)} groups of yields but {len(rewinds)} cache rewinds")
    rows, step_info, flat = [], [], []
    for j, ((start, end), rewind, call) in enumerate(zip(groups, rewinds, verify, strict=True)):
        drafted, accepted = int(call.shape[0]) - 1, sum(from_draft[start:end])
        for position in range(end - start):
            rows.append(call[position])
            step_info.append({"from_draft": from_draft[start + position]})
        step_info[-1] |= {"verify_step": j, "drafted": drafted, "accepted": accepted} | rewind
        flat.extend(call[p] for p in range(call.shape[0]))
    return tokens, rows, flat, step_info, len(tap.calls) - len(verify)


def _groups(from_draft):
    """(start, end) of each verify step's yields: its accepted drafts, then the target's token
    (absent when max_tokens ran out inside the accepted drafts)."""
    groups, start = [], 0
    for i, drafted in enumerate(from_draft):
        if not drafted:
            groups.append((start, i + 1))
            start = i + 1
    if start < len(from_draft):
        groups.append((start, len(from_draft)))
    return groups
