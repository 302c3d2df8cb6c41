"""compiled_greedy_steps: greedy_steps with each single-token decode step `mx.compile`d.

Same signature, same steps and same bits as `generate.greedy_steps` (itself gated bit-exact
against mlx-lm): the prompt is prefilled by the eager path (`prefill_prompt`, mlx-lm's
chunked loop over `KVCache`s); from step 0 on, every model call is a compiled function of
explicit arrays (the fed token, the RoPE offset, every layer's keys and values) that returns
the logits, the greedy token and the new keys and values. Nothing in the trace reads Python
state, so one trace serves every step.

This module is the loop: whether a run can be compiled (else it is `greedy_steps` itself), the
loop over the compiled step, and the `DecodeReport` of what ran. The compiled step in its
variants is compiled_step.py; the cache state in and out of its explicit arrays compiled_kv.py.

What stays eager: the prefill, the forcing processor of `forced_prefix` (applied to the
compiled step's raw logits with the very ops greedy_steps uses), and every cache kind other
than the plain KVCache: with `kv_bits` or `max_kv_size`, or a kept cache that is not a list of
KVCache, the run is `greedy_steps` itself (`DecodeReport.compiled` says which ran). A kept
`cache` gets back exactly the buffers the eager loop would leave (256-position blocks, zero
tail), so chat turns can alternate between the two loops.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from models.universal.cache import KVCache
from models.universal.compiled_kv import exact_arrays, store_back
from models.universal.compiled_step import VARIANTS, CompiledDecoder, compiled_decoder
from models.universal.generate import (
    Step,
    _check_arguments,
    force_row,
    generation_stream,
    greedy_steps,
    prefill_prompt,
)
from models.universal.model import UniversalLlama
from models.universal.prompt_cache import Cache


@dataclass
class DecodeReport:
    """What a compiled_greedy_steps run did (filled as it runs)."""

    compiled: bool = False  # False: the run was greedy_steps itself (a cache kind not compiled)
    variant: str | None = None  # the variant that ran ("split" where "auto" fell back)
    reasons: list[str] = field(default_factory=list)


def compiled_greedy_steps(
    model: UniversalLlama,
    prompt_ids: list[int],
    n_tokens: int,
    *,
    variant: str = "auto",
    report: DecodeReport | None = None,
    **options: Any,
) -> Iterator[Step]:
    """`greedy_steps` (same arguments, same Steps) with compiled decode steps; see the module
    docstring. `variant` picks the compiled form ("masked" is not bit-exact); `report`, if
    given, is filled with what ran."""
    report = report if report is not None else DecodeReport()
    options = greedy_options(model, prompt_ids, n_tokens, options)
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    reasons = eager_only_reasons(options["kv_bits"], options["max_kv_size"], options["cache"])
    if reasons:
        report.reasons = reasons
        yield from greedy_steps(model, prompt_ids, n_tokens, **options)
        return
    _check_arguments(model, prompt_ids, n_tokens, **options)
    report.compiled, report.variant = True, variant
    if n_tokens > 0:
        yield from _compiled_steps(model, prompt_ids, n_tokens, options, compiled_decoder(model, variant), report)


def greedy_options(model: UniversalLlama, prompt_ids: list[int], n_tokens: int, options: dict) -> dict[str, Any]:
    """greedy_steps' keyword options as a call with `options` gets them: its defaults filled
    in, a TypeError for a name it does not take."""
    bound = inspect.signature(greedy_steps).bind(model, prompt_ids, n_tokens, **options)
    bound.apply_defaults()
    params = bound.signature.parameters
    return {name: value for name, value in bound.arguments.items() if params[name].kind is params[name].KEYWORD_ONLY}


def eager_only_reasons(kv_bits: int | None, max_kv_size: int | None, cache: list[Cache] | None) -> list[str]:
    reasons = []
    if kv_bits is not None:
        reasons.append("kv_bits: the quantized KV cache decodes eagerly")
    if max_kv_size is not None and cache is None:
        reasons.append("max_kv_size: the rotating KV cache decodes eagerly")
    if cache is not None and not all(type(c) is KVCache for c in cache):
        reasons.append("cache: a kept cache other than plain KVCaches decodes eagerly")
    return reasons


def _compiled_steps(
    model: UniversalLlama,
    prompt_ids: list[int],
    n_tokens: int,
    options: dict,
    decoder: CompiledDecoder,
    report: DecodeReport,
) -> Iterator[Step]:
    """greedy_steps' loop (queue the next step, then hand out the current one) over the
    compiled step; comments there say why each piece is as it is."""
    keep_cache = options["cache"] is not None
    forced_tokens, prefix = options["forced_tokens"], list(options["forced_prefix"] or [])
    cache = options["cache"] if keep_cache else model.make_cache()

    prompt = prefill_prompt(model, cache, mx.array(prompt_ids), options["prefill_step_size"], lambda: None)
    offset = cache[0].offset
    in_cache = decoder.variant == "blocks"  # the KV stays in `cache`, written in place
    if not in_cache:
        dtype = model.model.embed_tokens(mx.array([[0]])).dtype if cache[0].keys is None else cache[0].keys.dtype
        kv = exact_arrays(model, cache, dtype)

    def step(tokens: mx.array, index: int) -> tuple[mx.array, mx.array]:
        nonlocal kv, offset
        with mx.stream(generation_stream):
            if in_cache:
                logits, token = decoder.step_in_cache(tokens, cache)
            else:
                logits, token, kv = decoder.step(tokens, offset, kv)
            offset += 1
            if index < len(prefix):  # greedy_steps' processor, eager, on the same raw logits
                processed = force_row(logits, prefix, index)
                token = mx.argmax(processed - mx.logsumexp(processed, keepdims=True), axis=-1)
            return logits, token

    logits, token = step(prompt, 0)
    mx.async_eval(logits, token)
    report.variant = decoder.variant
    for index in range(n_tokens):
        if index + 1 < n_tokens or keep_cache:
            fed = token if forced_tokens is None else mx.array([forced_tokens[index]])
            next_logits, next_token = step(fed, index + 1)
            mx.async_eval(next_logits, next_token)
        report.variant = decoder.variant
        yield Step(index=index, logits=logits[0], token=token.item())
        if index % 256 == 0:
            mx.clear_cache()
        if index + 1 < n_tokens:
            logits, token = next_logits, next_token
    if keep_cache and not in_cache:
        if decoder.variant == "masked":
            kv = [b[..., :offset, :] for b in kv]
        store_back(cache, kv, offset)
