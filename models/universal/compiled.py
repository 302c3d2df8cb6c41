"""compiled_greedy_steps: greedy_steps with each single-token decode step `mx.compile`d.

Same signature, same steps and same bits as `generate.greedy_steps` (itself gated bit-exact
against mlx-lm): the prompt is prefilled by the eager path (`prefill_prompt`, mlx-lm's
chunked loop over `KVCache`s); from step 0 on, every model call is a compiled function of
explicit arrays (the fed token, the RoPE offset, every layer's keys and values) that returns
the logits, the greedy token and the new keys and values. Nothing in the trace reads Python
state, so one trace serves every step.

Why the keys and values are exact-length arrays, not a fixed buffer. mlx-lm's attention runs
on `keys[..., :offset, :]`: exactly the positions so far, with no mask for one query. A
compiled step over a fixed-capacity buffer (the "masked" variant, traced once per 256-position
block) must attend over the whole buffer with a mask: other ops (an array mask; on the GPU it
also changes which SDPA kernel runs) reducing over a longer row, so its bits match only where
the backend happens to sum the masked zeros in without reordering. On this CPU they did in
every measurement (docs/compiled-decode.md), but nothing guarantees it, so it is not the
default. Here each layer's keys and values are concatenated with the new position and the step
is compiled `shapeless=True`: the attention always sees exactly `offset + 1` positions with no
mask, and a longer cache needs no new trace.

Why two forms. Shapeless tracing needs every op to infer its output shape from its inputs.
On the GPU `mx.fast.rope` is one primitive and the whole step is one trace ("whole"). On the
CPU backend rope falls back to slices of the head dim, which shapeless tracing refuses, so
there each layer is two compiled calls ("split"): rope on the fixed-shape (one position)
queries and keys, traced with shapes, and the rest of the layer (the cache concatenation,
attention, MLP, and the next layer's projections) traced shapeless. "auto" tries "whole" and
falls back to "split" when the trace is refused.

"blocks" keeps the KV where mlx-lm keeps it: in the KVCache's 256-position blocks, written in
place by its own `update_and_fetch`, the SDPA run eagerly on that slice exactly as the eager
Attention runs it; what lies between two attentions (output projection, residuals, MLP, the next
layer's norm, projections and rope, or the head) is one trace of fixed one-position shapes per
layer, so it traces on every backend and needs no per-step concatenation or store-back.

What stays eager: the prefill, the forcing processor of `forced_prefix` (applied to the
compiled step's raw logits with the very ops greedy_steps uses), and every cache kind other
than the plain KVCache: with `kv_bits` or `max_kv_size`, or a kept cache that is not a list of
KVCache, the run is `greedy_steps` itself (`DecodeReport.compiled` says which ran). A kept
`cache` gets back exactly the buffers the eager loop would leave (256-position blocks, zero
tail), so chat turns can alternate between the two loops.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from models.universal.cache import Cache, KVCache
from models.universal.generate import (
    Step,
    _check_arguments,
    force_row,
    generation_stream,
    greedy_steps,
    prefill_prompt,
)
from models.universal.model import Block, UniversalLlama

VARIANTS = ("auto", "whole", "split", "masked", "blocks")

KVArrays = list[mx.array]  # keys_0, values_0, keys_1, values_1, ... one pair per layer


# -- the forward pieces, each the eager model's ops in the eager model's order --------------


def project_qkv(layer: Block, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """Input norm and q/k/v projections of one position, heads split out: (B, heads, 1, head_dim)."""
    attn = layer.self_attn
    batch, length, _ = x.shape
    h = layer.input_layernorm(x)
    queries, keys, values = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    queries = queries.reshape(batch, length, attn.n_heads, -1).transpose(0, 2, 1, 3)
    keys = keys.reshape(batch, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    values = values.reshape(batch, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    return queries, keys, values


def apply_rope(layer: Block, queries: mx.array, keys: mx.array, offset: mx.array) -> tuple[mx.array, mx.array]:
    rope = layer.self_attn.rope
    return rope(queries, offset=offset), rope(keys, offset=offset)


def attend(layer: Block, queries: mx.array, keys: mx.array, values: mx.array, mask: mx.array | None) -> mx.array:
    """The fused SDPA as the eager Attention calls it (GQA broadcast inside the kernel)."""
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=layer.self_attn.scale, mask=mask)


def finish_layer(layer: Block, x: mx.array, attn_out: mx.array) -> mx.array:
    """Output projection, both residuals and the MLP: Block.__call__ after the attention."""
    batch, length = x.shape[:2]
    attn_out = attn_out.transpose(0, 2, 1, 3).reshape(batch, length, -1)
    h = x + layer.self_attn.o_proj(attn_out)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def head(model: UniversalLlama, h: mx.array) -> tuple[mx.array, mx.array]:
    """Final norm, LM head, and greedy_steps' token: argmax of the log-softmax.

    (B, 1, vocab) is squeezed rather than sliced with [:, -1, :]: the same values, and a
    slice cannot be traced shapeless."""
    h = model.model.norm(h)
    logits = model.model.embed_tokens.as_linear(h) if model.config.tie_word_embeddings else model.lm_head(h)
    logits = logits.squeeze(1)
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    return logits, mx.argmax(logprobs, axis=-1)


def append(cached: mx.array, new: mx.array) -> mx.array:
    return mx.concatenate([cached, new], axis=2)


# -- the compiled step in its variants --------------------------------------------------------


class RopeNotShapeless(RuntimeError):
    """The backend's rope cannot be traced shapeless (the CPU fallback slices the head dim)."""


class CompiledDecoder:
    """One model's compiled decode step: `step(token, offset, kv) -> (logits, token, kv)`.

    `token` is (1,) int, `offset` the number of cached positions, `kv` the per-layer keys and
    values: exact-length arrays (B, kv_heads, offset, head_dim) for the bit-exact variants,
    256-position-block buffers for "masked". Traces are made on first use and kept.
    """

    def __init__(self, model: UniversalLlama, variant: str = "auto"):
        if variant not in VARIANTS:
            raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
        self.model = model
        self.requested = variant
        self.variant = "whole" if variant == "auto" else variant
        self.weights = weight_identity(model)
        layers = model.layers
        self._whole = mx.compile(self._whole_step, shapeless=True)
        self._masked = mx.compile(self._masked_step)
        # "split": rope per layer traced with shapes; embedding + layer 0's projections, each
        # layer's remainder (+ the next layer's projections, or the head) traced shapeless.
        self._embed_qkv = mx.compile(self._embed_qkv_step, shapeless=True)
        self._ropes = [mx.compile(self._rope_fn(layer)) for layer in layers]
        self._rests = [mx.compile(self._rest_fn(i), shapeless=True) for i in range(len(layers))]
        # "blocks": every trace has one position's fixed shapes; the KV write and the SDPA run
        # eagerly on the KVCache itself (mlx-lm's in-place writes into 256-position blocks).
        self._block_first = mx.compile(self._block_first_step)
        self._block_nexts = [mx.compile(self._block_next_fn(i)) for i in range(len(layers))]

    # whole
    def _whole_step(self, token: mx.array, offset: mx.array, *kv: mx.array) -> tuple[mx.array, ...]:
        h = self.model.model.embed_tokens(token[None])
        new_kv = []
        for i, layer in enumerate(self.model.layers):
            queries, keys, values = project_qkv(layer, h)
            queries, keys = apply_rope(layer, queries, keys, offset)
            keys, values = append(kv[2 * i], keys), append(kv[2 * i + 1], values)
            h = finish_layer(layer, h, attend(layer, queries, keys, values, None))
            new_kv += [keys, values]
        return (*head(self.model, h), *new_kv)

    # split
    def _embed_qkv_step(self, token: mx.array) -> tuple[mx.array, ...]:
        h = self.model.model.embed_tokens(token[None])
        return (h, *project_qkv(self.model.layers[0], h))

    def _rope_fn(self, layer: Block) -> Callable[..., tuple[mx.array, mx.array]]:
        return lambda queries, keys, offset: apply_rope(layer, queries, keys, offset)

    def _rest_fn(self, i: int) -> Callable[..., tuple[mx.array, ...]]:
        layers = self.model.layers

        def rest(h, queries, keys, values, cached_keys, cached_values):
            keys, values = append(cached_keys, keys), append(cached_values, values)
            h = finish_layer(layers[i], h, attend(layers[i], queries, keys, values, None))
            following = head(self.model, h) if i + 1 == len(layers) else (h, *project_qkv(layers[i + 1], h))
            return (*following, keys, values)

        return rest

    def _split_step(self, token: mx.array, offset: mx.array, kv: KVArrays) -> tuple[mx.array, mx.array, KVArrays]:
        h, queries, keys, values = self._embed_qkv(token)
        new_kv: KVArrays = []
        for i in range(len(self.model.layers)):
            queries, keys = self._ropes[i](queries, keys, offset)
            *following, cached_keys, cached_values = self._rests[i](h, queries, keys, values, kv[2 * i], kv[2 * i + 1])
            new_kv += [cached_keys, cached_values]
            if i + 1 < len(self.model.layers):
                h, queries, keys, values = following
        logits, token = following
        return logits, token, new_kv

    # blocks
    def _block_first_step(self, token: mx.array, offset: mx.array) -> tuple[mx.array, ...]:
        h = self.model.model.embed_tokens(token[None])
        layer = self.model.layers[0]
        queries, keys, values = project_qkv(layer, h)
        return (h, *apply_rope(layer, queries, keys, offset), values)

    def _block_next_fn(self, i: int) -> Callable[..., tuple[mx.array, ...]]:
        layers = self.model.layers

        def following(h: mx.array, attn_out: mx.array, offset: mx.array) -> tuple[mx.array, ...]:
            h = finish_layer(layers[i], h, attn_out)
            if i + 1 == len(layers):
                return head(self.model, h)
            queries, keys, values = project_qkv(layers[i + 1], h)
            return (h, *apply_rope(layers[i + 1], queries, keys, offset), values)

        return following

    def step_in_cache(self, token: mx.array, cache: list[KVCache]) -> tuple[mx.array, mx.array]:
        """The "blocks" step: (logits, token); `cache` (plain KVCaches) is updated in place,
        with the very `update_and_fetch` and SDPA call of the eager Attention."""
        offset = mx.array(cache[0].offset, dtype=mx.int32)
        h, queries, keys, values = self._block_first(token, offset)
        for i, layer in enumerate(self.model.layers):
            keys, values = cache[i].update_and_fetch(keys, values)
            following = self._block_nexts[i](h, attend(layer, queries, keys, values, None), offset)
            if i + 1 < len(self.model.layers):
                h, queries, keys, values = following
        logits, token = following
        return logits, token

    # masked (not bit-exact by construction: measured and documented, never the default)
    def _masked_step(self, token: mx.array, offset: mx.array, *buffers: mx.array) -> tuple[mx.array, ...]:
        h = self.model.model.embed_tokens(token[None])
        capacity = buffers[0].shape[2]
        visible = mx.arange(capacity) <= offset
        new_buffers = []
        for i, layer in enumerate(self.model.layers):
            queries, keys, values = project_qkv(layer, h)
            queries, keys = apply_rope(layer, queries, keys, offset)
            key_buffer = mx.slice_update(buffers[2 * i], keys, offset[None], axes=(2,))
            value_buffer = mx.slice_update(buffers[2 * i + 1], values, offset[None], axes=(2,))
            h = finish_layer(layer, h, attend(layer, queries, key_buffer, value_buffer, visible))
            new_buffers += [key_buffer, value_buffer]
        return (*head(self.model, h), *new_buffers)

    def step(self, token: mx.array, offset: int, kv: KVArrays) -> tuple[mx.array, mx.array, KVArrays]:
        position = mx.array(offset, dtype=mx.int32)
        if self.variant == "masked":
            kv = grow_to_fit(kv, offset + 1)
            logits, token, *kv = self._masked(token, position, *kv)
            return logits, token, kv
        if self.variant == "whole":
            try:
                logits, token, *kv = self._whole(token, position, *kv)
                return logits, token, kv
            except ValueError as e:
                if self.requested != "auto" or "cannot infer output shapes" not in str(e):
                    raise
                self.variant = "split"  # the CPU backend's rope: see the module docstring
        return self._split_step(token, position, kv)


def weight_identity(model: UniversalLlama) -> tuple[int, ...]:
    """Which arrays the model holds: traces capture them, so new weights need new traces."""
    return tuple(id(array) for _, array in tree_flatten(model.parameters()))


# id(model) -> its decoders; a module is a dict (unhashable), so the entry goes with the model.
_decoders: dict[int, dict[str, CompiledDecoder]] = {}


def compiled_decoder(model: UniversalLlama, variant: str = "auto") -> CompiledDecoder:
    """The model's decoder of that variant, traced once per model (and per weight set)."""
    key = id(model)
    if key not in _decoders:
        _decoders[key] = {}
        weakref.finalize(model, _decoders.pop, key, None)
    per_model = _decoders[key]
    decoder = per_model.get(variant)
    if decoder is None or decoder.weights != weight_identity(model):
        decoder = per_model[variant] = CompiledDecoder(model, variant)
    return decoder


# -- cache state in and out of the explicit arrays -------------------------------------------


def grow_to_fit(buffers: KVArrays, needed: int) -> KVArrays:
    """The "masked" variant's buffers, grown like KVCache's (a 256 block of zeros) when full."""
    if buffers[0].shape[2] >= needed:
        return buffers
    return [mx.concatenate([b, mx.zeros((*b.shape[:2], KVCache.step, b.shape[3]), b.dtype)], axis=2) for b in buffers]


def exact_arrays(model: UniversalLlama, cache: list[KVCache], prefill_dtype: mx.Dtype) -> KVArrays:
    """Each layer's cached keys and values, exactly `offset` positions long."""
    arrays: KVArrays = []
    config = model.config
    for c in cache:
        if c.keys is None:  # a one-token prompt: nothing prefilled
            shape = (1, config.n_kv_heads, 0, config.attention_head_dim)
            arrays += [mx.zeros(shape, prefill_dtype), mx.zeros(shape, prefill_dtype)]
        else:
            arrays += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
    return arrays


def block_buffers(arrays: KVArrays, used_capacity: int, offset: int) -> KVArrays:
    """Exact-length arrays as KVCache buffers of `used_capacity` positions, zero tail."""
    tail = used_capacity - offset
    if tail == 0:
        return list(arrays)
    return [mx.concatenate([a, mx.zeros((*a.shape[:2], tail, a.shape[3]), a.dtype)], axis=2) for a in arrays]


def capacity_after(capacity: int, offset: int, n_new: int) -> int:
    """KVCache's buffer size after `n_new` single-position updates from (capacity, offset):
    whenever full it keeps the used positions and appends one 256-position block of zeros."""
    for _ in range(n_new):
        if offset + 1 > capacity:
            capacity = offset + KVCache.step
        offset += 1
    return capacity


def store_back(cache: list[KVCache], kv: KVArrays, offset: int) -> None:
    """Leave the kept cache as the eager loop would: same offset, same buffer sizes and zeros."""
    for i, c in enumerate(cache):
        capacity = capacity_after(0 if c.keys is None else c.keys.shape[2], c.offset, offset - c.offset)
        c.keys, c.values = block_buffers(kv[2 * i : 2 * i + 2], capacity, offset)
        c.offset = offset


# -- the loop ---------------------------------------------------------------------------------


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
