"""The compiled decode step of compiled_greedy_steps (compiled.py), in its variants: the eager
model's ops as functions of explicit arrays, traced per variant (`CompiledDecoder`) and kept per
model and weight set (`compiled_decoder`).

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
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import mlx.core as mx
from mlx.utils import tree_flatten

from models.universal.cache import KVCache
from models.universal.compiled_kv import KVArrays, grow_to_fit
from models.universal.model import Block, UniversalLlama

VARIANTS = ("auto", "whole", "split", "masked", "blocks")


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
