"""greedy_steps: the decode loop, step for step the one mlx-lm's generate_step runs.

The prompt is prefilled in chunks of `prefill_step_size` except its last token, with
only the cache evaluated; the last token then runs alone and yields step 0. Every later
step feeds one token. The logits a step reports are `logits[:, -1, :]` of that model
call, and its token is the argmax of the log-softmax, exactly as mlx-lm's greedy sampler
picks it (the argmax of logprobs can differ from that of logits only in ties, but we
copy the computation rather than reason about ties).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

from models.universal.model import UniversalLlama

# mlx-lm runs generation on its own stream; do the same so scheduling cannot differ.
generation_stream = mx.new_thread_local_stream(mx.default_device())


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
) -> Iterator[Step]:
    """Yield `n_tokens` steps of greedy decoding from `prompt_ids`.

    Free-running (forced_tokens None), step i > 0 follows the model's own token of step
    i-1; teacher-forced, it follows forced_tokens[i-1] (so n_tokens - 1 are needed).
    """
    if not prompt_ids:
        raise ValueError("prompt_ids: need at least one token")
    if prefill_step_size < 1:
        raise ValueError(f"prefill_step_size: must be positive, got {prefill_step_size}")
    if forced_tokens is not None and len(forced_tokens) < n_tokens - 1:
        raise ValueError(f"forced_tokens: {len(forced_tokens)} given, {n_tokens - 1} needed for {n_tokens} steps")
    if n_tokens <= 0:
        return

    cache = model.make_cache()

    def step(tokens: mx.array) -> tuple[mx.array, mx.array]:
        with mx.stream(generation_stream):
            logits = model(tokens[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return logits, mx.argmax(logprobs, axis=-1)

    with mx.stream(generation_stream):
        prompt = mx.array(prompt_ids)
        while prompt.size > 1:
            chunk = min(prefill_step_size, prompt.size - 1)
            model(prompt[:chunk][None], cache=cache)
            mx.eval([c.state for c in cache])
            prompt = prompt[chunk:]
            mx.clear_cache()

    # Like mlx-lm, queue the next step before handing out the current one, so the
    # device works while the caller reads; this changes timing, never values.
    logits, token = step(prompt)
    mx.async_eval(logits, token)
    for index in range(n_tokens):
        if index + 1 < n_tokens:
            fed = token if forced_tokens is None else mx.array([forced_tokens[index]])
            next_logits, next_token = step(fed)
            mx.async_eval(next_logits, next_token)
        yield Step(index=index, logits=logits[0], token=token.item())
        if index % 256 == 0:
            mx.clear_cache()
        if index + 1 < n_tokens:
            logits, token = next_logits, next_token
