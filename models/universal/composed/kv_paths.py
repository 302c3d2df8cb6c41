"""The cache compositions (mixed_kv, streaming_kv, fused_sdpa, rotating_quantized_kv) as one decode loop.

The loop is mlx-lm's generate_step (0.32.2) step for step: the prompt prefilled in chunks
but its last token, the cache converted after every model call, the next step queued before
the current one is handed out, and one look-ahead step past the last (which feeds the last
token, so the final cache holds prompt + every token, as mlx-lm's does). What each
composition changes is which caches the layers start with and how they are converted:

- mixed_kv (optiq.serve.install_mixed_kv): after every call, each layer listed in the
  kv_config, in layer order, whose float cache holds `quantized_kv_start` positions or more,
  becomes a QuantizedKVCache with that layer's bits and group size. Unlisted layers stay float.
- streaming_kv (optiq.runtime.streaming_kv_quant): every layer, one at a time, with the
  uniform bits: the values are those of mlx-lm's conversion.
- fused_sdpa (optiq.runtime.fused_quant_sdpa): the same conversion into caches whose
  attention is the tiled online-softmax kernel.
- rotating_quantized_kv (optiq.runtime.kv): RotatingQuantizedKVCache(max_kv_size, keep)
  from the start, or float RotatingKVCache windows converted at `quantized_kv_start`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from models.universal.cache import KVCache
from models.universal.composed.caches import QUANTIZED, RotatingQuantizedKVCache, cache_digest, quantize_layer
from models.universal.composed.spec import Composition, FusedSDPA, MixedKV, RotatingQuantizedKV
from models.universal.composed.steps import ComposedRun, ComposedStep, force_row, generation_stream
from models.universal.generate import prefill_prompt
from models.universal.model import UniversalLlama
from models.universal.rotating_cache import RotatingKVCache

Convert = Callable[[list[Any]], None]


def initial_caches(model: UniversalLlama, composition: Composition) -> list[Any]:
    if isinstance(composition, RotatingQuantizedKV):
        c = composition
        if c.quantized_kv_start is None:
            return [
                RotatingQuantizedKVCache(c.max_kv_size, c.keep, group_size=c.kv_group_size, bits=c.kv_bits)
                for _ in model.layers
            ]
        return [RotatingKVCache(max_size=c.max_kv_size, keep=c.keep) for _ in model.layers]
    return [KVCache() for _ in model.layers]


def converter(composition: Composition) -> Convert:
    """The per-call cache conversion the composition installs."""
    if isinstance(composition, MixedKV):
        bit_map = composition.bit_map()
        start = composition.quantized_kv_start

        def convert(caches: list[Any]) -> None:
            for i, cache in enumerate(caches):
                if i not in bit_map or isinstance(cache, QUANTIZED):
                    continue
                if cache.offset < start or cache.keys is None:
                    continue
                bits, group_size = bit_map[i]
                caches[i] = quantize_layer(cache, bits, group_size)

        return convert

    if isinstance(composition, RotatingQuantizedKV) and composition.quantized_kv_start is None:
        return lambda caches: None  # quantized from the first token: nothing to convert

    bits, group_size = composition.kv_bits, composition.kv_group_size
    start = composition.quantized_kv_start
    n_chunk = composition.n_chunk if isinstance(composition, FusedSDPA) else None

    def convert_all(caches: list[Any]) -> None:
        for i, cache in enumerate(caches):
            if isinstance(cache, QUANTIZED) or cache.offset < start or cache.keys is None:
                continue
            caches[i] = quantize_layer(cache, bits, group_size, n_chunk=n_chunk)

    return convert_all


def kv_path_steps(run: ComposedRun) -> Iterator[ComposedStep]:
    model, composition, forced_tokens, forced_prefix = run.model, run.composition, run.forced_tokens, run.forced_prefix
    caches = initial_caches(model, composition)
    convert = converter(composition)

    def step(tokens: mx.array, index: int) -> tuple[mx.array, mx.array]:
        with mx.stream(generation_stream):
            logits = model(tokens[None], cache=caches)[:, -1, :]
            processed = force_row(logits, forced_prefix, index)
            convert(caches)
            logprobs = processed - mx.logsumexp(processed, keepdims=True)
            return logits, mx.argmax(logprobs, axis=-1)

    prompt = prefill_prompt(model, caches, mx.array(run.prompt_ids), run.prefill_step_size, lambda: convert(caches))

    logits, token = step(prompt, 0)
    mx.async_eval(logits, token)
    for index in range(run.n_tokens):
        # Like mlx-lm, the next step (past the last one too) is queued before this one is
        # handed out; teacher-forced, it is fed the forced token instead of the model's.
        if forced_tokens is not None and index < len(forced_tokens):
            fed = mx.array([forced_tokens[index]])
        else:
            fed = token
        next_logits, next_token = step(fed, index + 1)
        mx.async_eval(next_logits, next_token)
        info = {"final_cache": cache_digest(caches)} if index == run.n_tokens - 1 else {}
        yield ComposedStep(index=index, logits=logits[0], token=token.item(), info=info)
        if index % 256 == 0:
            mx.clear_cache()
        logits, token = next_logits, next_token
