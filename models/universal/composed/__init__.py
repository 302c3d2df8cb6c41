"""L2: the universal Llama composed with mlx-optiq's runtime paths, bit-exact with optiq 0.7.7 over mlx-lm 0.32.2.

One entry point, `composed_steps(model, prompt_ids, n_tokens, composition)`, runs a
composition (a JSON-able dict, see spec.py) and yields one `ComposedStep` per emitted token:

- "mixed_kv", "streaming_kv", "fused_sdpa", "rotating_quantized_kv": kv_paths.py (mlx-lm's
  generate_step loop with optiq's caches, conversions and attention kernel);
- "ngram_draft": ngram.py (optiq's prompt-lookup drafting, adaptive=False).

The default (L1) model and caches are untouched: the only hook is that a cache may carry its
own quantized attention kernel, which only the fused SDPA caches here do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from models.universal.composed.caches import FusedQuantizedKVCache, RotatingQuantizedKVCache, cache_digest
from models.universal.composed.fused_sdpa import fused_quantized_attention
from models.universal.composed.kv_paths import kv_path_steps
from models.universal.composed.ngram import NgramIndex, ngram_steps
from models.universal.composed.spec import (
    KINDS,
    Composition,
    CompositionError,
    FusedSDPA,
    LayerKV,
    MixedKV,
    NgramDraft,
    RotatingQuantizedKV,
    StreamingKV,
    check_against_model,
    parse_composition,
)
from models.universal.composed.steps import ComposedRun, ComposedStep
from models.universal.model import UniversalLlama

__all__ = [
    "KINDS",
    "ComposedStep",
    "Composition",
    "CompositionError",
    "FusedQuantizedKVCache",
    "FusedSDPA",
    "LayerKV",
    "MixedKV",
    "NgramDraft",
    "NgramIndex",
    "RotatingQuantizedKV",
    "RotatingQuantizedKVCache",
    "StreamingKV",
    "cache_digest",
    "composed_steps",
    "fused_quantized_attention",
    "parse_composition",
]


def _token_list(name: str, tokens: object, vocab_size: int) -> list[int]:
    if not isinstance(tokens, (list, tuple)):
        raise CompositionError(f"{name}: expected a list of token ids, got {type(tokens).__name__}")
    bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise CompositionError(f"{name}: expected token ids (ints in [0, {vocab_size})), got {bad[:5]}")
    return list(tokens)


def composed_steps(
    model: UniversalLlama,
    prompt_ids: list[int],
    n_tokens: int,
    composition: dict[str, Any] | Composition,
    *,
    prefill_step_size: int = 2048,
    forced_tokens: list[int] | None = None,
    forced_prefix: list[int] | None = None,
) -> Iterator[ComposedStep]:
    """Yield `n_tokens` steps of greedy decoding through the composition.

    Teacher-forced (`forced_tokens`), step i > 0 follows forced_tokens[i-1]; for drafting,
    the forced token replaces the sampled one wherever the drafting loop reads it (see
    ngram.py), so a run whose logits match optiq's follows optiq's free-running schedule.
    `forced_prefix` is mlx-lm's forcing logits processor, as the oracle installs it.
    The composition is validated before anything runs (CompositionError names the key).
    """
    parsed = parse_composition(composition)
    config = model.config
    check_against_model(parsed, config.num_hidden_layers, config.attention_head_dim)
    if not prompt_ids:
        raise ValueError("prompt_ids: need at least one token")
    if isinstance(prefill_step_size, bool) or not isinstance(prefill_step_size, int) or prefill_step_size < 1:
        raise ValueError(f"prefill_step_size: expected a positive int, got {prefill_step_size!r}")
    prefix = _token_list("forced_prefix", forced_prefix, config.vocab_size) if forced_prefix else []
    if forced_tokens is not None:
        forced_tokens = _token_list("forced_tokens", forced_tokens, config.vocab_size)
        if len(forced_tokens) < n_tokens - 1:
            raise ValueError(f"forced_tokens: {len(forced_tokens)} given, {n_tokens - 1} needed for {n_tokens} steps")
    if n_tokens <= 0:
        return iter(())
    run = ComposedRun(model, list(prompt_ids), n_tokens, parsed, prefill_step_size, forced_tokens, prefix)
    return ngram_steps(run) if isinstance(parsed, NgramDraft) else kv_path_steps(run)
