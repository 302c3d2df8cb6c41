"""The universal Llama: one config-driven decoder for every Llama-shaped checkpoint.

Module names match the checkpoint tensor names (model.layers.N.self_attn.q_proj, ...)
so weights load without renaming. Each `__call__` uses the MLX ops mlx-lm's llama.py
uses, in the same order: the parity harness compares logits bit for bit.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn

from models.universal.cache import KVCache
from models.universal.config import LlamaConfig
from models.universal.prompt_cache import Cache
from models.universal.quantized_cache import QuantizedArrays
from models.universal.rope import make_rope
from models.universal.rotating_cache import ROTATING_KEEP, RotatingKVCache


@partial(mx.compile, shapeless=True)
def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    # Compiled like mlx-lm's: the fused kernel rounds differently from eager ops.
    return nn.silu(gate) * up


def quantized_scaled_dot_product_attention(
    queries: mx.array,
    q_keys: QuantizedArrays,
    q_values: QuantizedArrays,
    scale: float,
    mask: mx.array | str | None,
    group_size: int,
    bits: int,
) -> mx.array:
    """Attention over a QuantizedKVCache, op for op as mlx-lm's: scaled queries, grouped
    query heads, quantized_matmul scores, mask, precise softmax, quantized_matmul."""
    batch, n_q_heads, length, head_dim = queries.shape
    n_kv_heads = q_keys[0].shape[-3]
    n_repeats = n_q_heads // n_kv_heads
    queries = queries * scale
    if n_repeats > 1:
        # (B, kv_heads, repeats, L, D) against keys (B, kv_heads, 1, S, D): no key repeat.
        queries = mx.reshape(queries, (batch, n_kv_heads, n_repeats, length, head_dim))
        q_keys = [mx.expand_dims(x, axis=-3) for x in q_keys]
        q_values = [mx.expand_dims(x, axis=-3) for x in q_values]
    scores = mx.quantized_matmul(queries, *q_keys, transpose=True, group_size=group_size, bits=bits)
    if mask is not None:
        if isinstance(mask, str):
            # "causal", aligned to the end of the keys.
            n_queries, n_keys = scores.shape[-2:]
            mask = mx.arange(n_keys - n_queries, n_keys)[:, None] >= mx.arange(n_keys)[None]
        if n_repeats > 1 and mask.ndim > 3:
            mask = mx.expand_dims(mask, -3)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    scores = mx.softmax(scores, axis=-1, precise=True)
    out = mx.quantized_matmul(scores, *q_values, transpose=False, group_size=group_size, bits=bits)
    if n_repeats > 1:
        out = mx.reshape(out, (batch, n_q_heads, length, head_dim))
    return out


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.n_kv_heads
        head_dim = config.attention_head_dim
        self.scale = head_dim**-0.5
        dim, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(dim, self.n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * head_dim, dim, bias=bias)
        self.rope = make_rope(config)

    def __call__(self, x: mx.array, mask: mx.array | str | None, cache: Cache | None) -> mx.array:
        batch, length, _ = x.shape
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # (B, L, heads * head_dim) -> (B, heads, L, head_dim)
        queries = queries.reshape(batch, length, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

        if cache is not None:
            queries = self.rope(queries, offset=cache.offset)
            keys = self.rope(keys, offset=cache.offset)
            keys, values = cache.update_and_fetch(keys, values)
        else:
            queries = self.rope(queries)
            keys = self.rope(keys)

        if hasattr(cache, "bits"):
            # mlx-lm dispatches on the same attribute: a QuantizedKVCache. A composed (L2)
            # cache may carry its own kernel over its quantized storage; the caches of
            # models.universal.quantized_cache do not, so L1 always runs the stock one.
            attend = getattr(cache, "quantized_attention", quantized_scaled_dot_product_attention)
            out = attend(
                queries, keys, values, scale=self.scale, mask=mask, group_size=cache.group_size, bits=cache.bits
            )
        else:
            # GQA needs no repeat: the fused SDPA broadcasts kv heads over query heads.
            out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(batch, length, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        dim, hidden, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array | str | None, cache: Cache | None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaBody(nn.Module):
    """Embedding, the blocks and the final norm: token ids -> final hidden states."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = [Block(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, inputs: mx.array, cache: list[Cache] | None = None) -> mx.array:
        h = self.embed_tokens(inputs)
        length = h.shape[1]
        if cache is None:
            cache = [None] * len(self.layers)
            mask = "causal" if length > 1 else None
        else:
            # mlx-lm asks the first (full-attention) layer's cache: "causal"/None for the
            # unbounded caches, a boolean array once a rotating cache's window is exceeded.
            mask = cache[0].make_mask(length)
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            h = layer(h, mask, layer_cache)
        return self.norm(h)


class UniversalLlama(nn.Module):
    """The body plus the LM head (tied to the embedding or a separate lm_head)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache: list[Cache] | None = None) -> mx.array:
        """Token ids (B, L) -> logits (B, L, vocab); `cache` is updated in place."""
        h = self.model(inputs, cache)
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)

    @property
    def layers(self) -> list[Block]:
        return self.model.layers

    def make_cache(self, max_kv_size: int | None = None) -> list[KVCache] | list[RotatingKVCache]:
        """One KVCache per layer; with `max_kv_size`, RotatingKVCache(max_kv_size, keep=4)
        (what mlx-lm's make_prompt_cache builds for a model without make_cache)."""
        if max_kv_size is not None:
            return [RotatingKVCache(max_size=max_kv_size, keep=ROTATING_KEEP) for _ in self.layers]
        return [KVCache() for _ in self.layers]
