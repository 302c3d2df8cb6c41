"""greedy_steps: the decode loop, step for step the one mlx-lm's generate_step runs.

The prompt is prefilled in chunks of `prefill_step_size` except its last token, with
only the cache evaluated; the last token then runs alone and yields step 0. Every later
step feeds one token. The logits a step reports are `logits[:, -1, :]` of that model
call, and its token is the argmax of the log-softmax, exactly as mlx-lm's greedy sampler
picks it (the argmax of logprobs can differ from that of logits only in ties, but we
copy the computation rather than reason about ties).

The options mirror generate_step's (mlx-lm 0.32.2), with its names and defaults:

- `kv_bits` / `kv_group_size` / `quantized_kv_start`: after every model call (prefill
  chunks included) each KVCache holding `quantized_kv_start` positions or more becomes a
  QuantizedKVCache, and the attention then runs on the quantized keys and values.
- `max_kv_size`: a RotatingKVCache(max_kv_size, keep=4) per layer instead of a KVCache.
  With `kv_bits` too, the conversion raises NotImplementedError, as mlx-lm's does.
- `forced_prefix`: mlx-lm's logits-processor hook with a processor that, for the first
  len(forced_prefix) steps, masks every logit but the forced token's to -inf before the
  log-softmax and argmax. Step.logits stay the model's raw logits.
- `cache`: a cache the caller keeps (from `model.make_cache`), as generate_step's
  `prompt_cache`; it is updated in place, so turn after turn can run on it (mlx_lm.chat's
  prompt-cache reuse, see `chat_turn_steps`). generate_step queues the step fed with each
  token before handing that token out, so a run of n steps leaves the prompt and all n
  tokens in the cache; with a kept cache greedy_steps runs that last call too (without a
  kept cache its result would be unobservable, so it is skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx

from models.universal.model import UniversalLlama
from models.universal.prompt_cache import Cache, maybe_quantize_kv_cache
from models.universal.quantized_cache import KV_BITS, KV_GROUP_SIZES
from models.universal.rotating_cache import ROTATING_KEEP

# mlx-lm's DEFAULT_QUANTIZED_KV_START: generate_step's default for quantized_kv_start.
DEFAULT_QUANTIZED_KV_START = 5000

# mlx-lm runs generation on its own stream; do the same so scheduling cannot differ.
generation_stream = mx.new_thread_local_stream(mx.default_device())


def force_row(logits: mx.array, forced_prefix: list[int], index: int) -> mx.array:
    """mlx-lm's forcing processor (the one the oracles install): for the first
    len(forced_prefix) steps every logit but the forced token's becomes -inf."""
    if index >= len(forced_prefix):
        return logits
    keep = mx.arange(logits.shape[-1]) == forced_prefix[index]
    return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))


def prefill_prompt(
    model: UniversalLlama, cache: list, prompt: mx.array, prefill_step_size: int, after_call: Callable[[], None]
) -> mx.array:
    """generate_step's prefill: the prompt but its last token in chunks, `after_call` (the KV
    conversion) after each, only the cache evaluated. Returns what is left (the last token)."""
    with mx.stream(generation_stream):
        while prompt.size > 1:
            chunk = min(prefill_step_size, prompt.size - 1)
            model(prompt[:chunk][None], cache=cache)
            after_call()
            mx.eval([c.state for c in cache if getattr(c, "keys", True) is not None])
            prompt = prompt[chunk:]
            mx.clear_cache()
    return prompt


@dataclass(frozen=True)
class Step:
    """One model prediction: `index` 0 follows the prompt, i > 0 follows fed token i-1."""

    index: int
    logits: mx.array  # (vocab,), the model's output dtype
    token: int  # the model's greedy choice at this step


def greedy_steps(
    model: UniversalLlama,
    prompt_ids: list[int],
    n_tokens: int,
    *,
    prefill_step_size: int = 2048,
    forced_tokens: list[int] | None = None,
    forced_prefix: list[int] | None = None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START,
    max_kv_size: int | None = None,
    cache: list[Cache] | None = None,
) -> Iterator[Step]:
    """Yield `n_tokens` steps of greedy decoding from `prompt_ids`.

    Free-running (forced_tokens None), step i > 0 follows the model's own token of step
    i-1; teacher-forced, it follows forced_tokens[i-1] (so n_tokens - 1 are needed, and
    n_tokens with a kept `cache`, whose last fed token is forced_tokens[n_tokens - 1]).
    With `forced_prefix`, Step.token of step i < len(forced_prefix) is forced_prefix[i]
    (the argmax after the forcing processor) in both modes, so free-running feeds it next.
    With `cache` (see the module docstring), the caller must consume every step: the
    last token is fed when the last step is taken. `max_kv_size` is then unused, as
    generate_step ignores it given a prompt_cache. See the module docstring for the
    other cache options.
    """
    _check_arguments(
        model,
        prompt_ids,
        n_tokens,
        prefill_step_size,
        forced_tokens,
        forced_prefix,
        kv_bits,
        kv_group_size,
        quantized_kv_start,
        max_kv_size,
        cache,
    )
    if n_tokens <= 0:
        return
    keep_cache = cache is not None

    if cache is None:
        cache = model.make_cache(max_kv_size=max_kv_size)
    prefix = list(forced_prefix or [])  # mlx-lm installs no processor for an empty prefix

    def quantize_cache() -> None:
        maybe_quantize_kv_cache(cache, quantized_kv_start, kv_group_size, kv_bits)

    def step(tokens: mx.array, index: int) -> tuple[mx.array, mx.array]:
        with mx.stream(generation_stream):
            logits = model(tokens[None], cache=cache)[:, -1, :]
            processed = force_row(logits, prefix, index)
            quantize_cache()
            logprobs = processed - mx.logsumexp(processed, keepdims=True)
            return logits, mx.argmax(logprobs, axis=-1)

    prompt = prefill_prompt(model, cache, mx.array(prompt_ids), prefill_step_size, quantize_cache)

    # Like mlx-lm, queue the next step before handing out the current one, so the
    # device works while the caller reads; this changes timing, never values.
    logits, token = step(prompt, 0)
    mx.async_eval(logits, token)
    for index in range(n_tokens):
        if index + 1 < n_tokens or keep_cache:
            fed = token if forced_tokens is None else mx.array([forced_tokens[index]])
            next_logits, next_token = step(fed, index + 1)
            mx.async_eval(next_logits, next_token)
        yield Step(index=index, logits=logits[0], token=token.item())
        if index % 256 == 0:
            mx.clear_cache()
        if index + 1 < n_tokens:
            logits, token = next_logits, next_token


def chat_turn_steps(
    model: UniversalLlama,
    turn_prompts: list[list[int]],
    n_tokens: int,
    *,
    prefill_step_size: int = 2048,
    forced_tokens: list[list[int]] | None = None,
    max_kv_size: int | None = None,
    decode: Callable[..., Iterator[Step]] | None = None,
    **options: object,
) -> list[list[Step]]:
    """mlx_lm.chat's prompt-cache reuse: one cache for the conversation, each turn's new
    prompt ids (its own messages, templated with the generation prompt) decoded on it.

    Returns the `n_tokens` steps of each turn. `forced_tokens[t]` teacher-forces turn t
    (n_tokens ids: the last one is fed into the cache before the next turn). The other
    options are greedy_steps' (forced_prefix, kv_bits, ...) and apply to every turn.
    `decode` is the loop each turn runs (greedy_steps' signature; default greedy_steps),
    e.g. compiled.compiled_greedy_steps, which must leave the kept cache as greedy_steps does.
    """
    if not isinstance(turn_prompts, (list, tuple)) or not turn_prompts:
        raise ValueError("turn_prompts: need a non-empty list of per-turn prompt ids")
    if forced_tokens is not None and len(forced_tokens) != len(turn_prompts):
        raise ValueError(f"forced_tokens: {len(forced_tokens)} turns given, {len(turn_prompts)} expected")
    if not _is_int(n_tokens) or n_tokens < 1:
        raise ValueError(f"n_tokens: must be a positive int, got {n_tokens!r}")
    _check_max_kv_size(max_kv_size)
    cache = model.make_cache(max_kv_size=max_kv_size)
    turns = []
    loop = greedy_steps if decode is None else decode
    for t, prompt_ids in enumerate(turn_prompts):
        forced = None if forced_tokens is None else forced_tokens[t]
        steps = loop(
            model,
            prompt_ids,
            n_tokens,
            prefill_step_size=prefill_step_size,
            forced_tokens=forced,
            cache=cache,
            **options,
        )
        turns.append(list(steps))
    return turns


def _check_arguments(
    model: UniversalLlama,
    prompt_ids: list[int],
    n_tokens: int,
    prefill_step_size: int,
    forced_tokens: list[int] | None,
    forced_prefix: list[int] | None,
    kv_bits: int | None,
    kv_group_size: int,
    quantized_kv_start: int,
    max_kv_size: int | None,
    cache: list[Cache] | None,
) -> None:
    """greedy_steps' argument checks; the parameters carry its names, so its options pass by keyword."""
    if not prompt_ids:
        raise ValueError("prompt_ids: need at least one token")
    if prefill_step_size < 1:
        raise ValueError(f"prefill_step_size: must be positive, got {prefill_step_size}")
    keep_cache = cache is not None
    if keep_cache:
        _check_kept_cache(model, cache, n_tokens)
    needed = n_tokens if keep_cache else n_tokens - 1
    if forced_tokens is not None and len(forced_tokens) < needed:
        raise ValueError(f"forced_tokens: {len(forced_tokens)} given, {needed} needed for {n_tokens} steps")
    vocab_size = model.config.vocab_size
    _check_options(model, vocab_size, forced_prefix, kv_bits, kv_group_size, quantized_kv_start, max_kv_size)


def _check_kept_cache(model: UniversalLlama, cache: object, n_tokens: int) -> None:
    if not isinstance(cache, list) or len(cache) != len(model.layers):
        raise ValueError(f"cache: expected a list of {len(model.layers)} layer caches from model.make_cache()")
    if not _is_int(n_tokens) or n_tokens < 1:
        raise ValueError(f"n_tokens: must be a positive int with a kept cache, got {n_tokens!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_options(
    model: UniversalLlama,
    vocab_size: int,
    forced_prefix: list[int] | None,
    kv_bits: int | None,
    kv_group_size: int,
    quantized_kv_start: int,
    max_kv_size: int | None,
) -> None:
    """Reject values mlx-lm would crash on (or silently misread) with an error naming them."""
    if forced_prefix is not None:
        if not isinstance(forced_prefix, (list, tuple)):
            raise ValueError(f"forced_prefix: expected a list of token ids, got {type(forced_prefix).__name__}")
        bad = [t for t in forced_prefix if not _is_int(t) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"forced_prefix: token ids must be ints in [0, {vocab_size}), got {bad[:5]}")
    if kv_bits is not None and (not _is_int(kv_bits) or kv_bits not in KV_BITS):
        raise ValueError(f"kv_bits: must be None or one of {KV_BITS}, got {kv_bits!r}")
    if not _is_int(kv_group_size) or kv_group_size not in KV_GROUP_SIZES:
        raise ValueError(f"kv_group_size: must be one of {KV_GROUP_SIZES}, got {kv_group_size!r}")
    if not _is_int(quantized_kv_start) or quantized_kv_start < 0:
        raise ValueError(f"quantized_kv_start: must be a non-negative int, got {quantized_kv_start!r}")
    if kv_bits is not None and model.config.attention_head_dim % kv_group_size:
        raise ValueError(
            f"kv_group_size: {kv_group_size} does not divide the head dim {model.config.attention_head_dim}, "
            "so the keys cannot be quantized"
        )
    _check_max_kv_size(max_kv_size)


def _check_max_kv_size(max_kv_size: int | None) -> None:
    if max_kv_size is not None and (not _is_int(max_kv_size) or max_kv_size <= ROTATING_KEEP):
        raise ValueError(
            f"max_kv_size: must be None or an int above the {ROTATING_KEEP} always-kept positions, got {max_kv_size!r}"
        )
