"""batch_greedy_steps: several prompts decoded together, as mlx-lm's BatchGenerator does.

What BatchGenerator (mlx-lm 0.32.2, the engine of `batch_generate`) computes for prompts
inserted together, each decoding a fixed number of tokens with the greedy sampler:

- Each prompt's last token is held back; the rest is prefilled in rounds. A round takes
  up to `prefill_step_size` tokens of every row, pads the shorter chunks on the *right*
  with token 0 and runs them as one (B, width) model call into a BatchKVCache per layer,
  then rolls every row's keys and values right by its padding, so the padding ends up
  on the left (masked out; each row's RoPE offset is its own length).
- Moving to decoding, the cache is filtered to the rows (a gather) and any padding all
  rows share is dropped.
- Each decode call feeds every row's current token as a (B, 1) batch; the logits are
  normalised per row (`logits - logsumexp(axis=-1)`) and the token is the argmax, as
  the greedy sampler picks it.

So a row's logits are not, in general, those of decoding it alone: the padding changes
the mask, the attention shapes and the matmul shapes. What is mirrored is the batch.

Scope: the rows must be admitted together and finish prefilling in the same round (at
most `prefill_batch_size` prompts; all with the same number of rounds,
ceil((len - 1) / prefill_step_size)). Otherwise BatchGenerator starts decoding some rows
while others still prefill, and joins them later; that schedule is refused with a
ValueError rather than approximated.
"""

from __future__ import annotations

import mlx.core as mx

from models.universal.cache import BatchKVCache
from models.universal.generate import Step, generation_stream
from models.universal.model import UniversalLlama

# BatchGenerator's defaults (mlx-lm 0.32.2).
DEFAULT_PREFILL_BATCH_SIZE = 8
DEFAULT_COMPLETION_BATCH_SIZE = 32
# The token right-padded prompt chunks are filled with.
PAD_TOKEN = 0


def batch_greedy_steps(
    model: UniversalLlama,
    prompts: list[list[int]],
    n_tokens: int,
    *,
    prefill_step_size: int = 2048,
    forced_tokens: list[list[int]] | None = None,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH_SIZE,
    completion_batch_size: int = DEFAULT_COMPLETION_BATCH_SIZE,
) -> list[list[Step]]:
    """The `n_tokens` greedy steps of every prompt, decoded as one batch; one list per row.

    Free-running, row r's step i > 0 follows its own token of step i-1; teacher-forced,
    it follows forced_tokens[r][i-1] (n_tokens - 1 ids per row are needed). No row stops
    early: EOS is not special here.
    """
    _check_arguments(model, prompts, n_tokens, prefill_step_size, forced_tokens, prefill_batch_size)
    completion_batch_size = max(completion_batch_size, prefill_batch_size)  # as BatchGenerator does
    n_rows = len(prompts)
    with mx.stream(generation_stream):
        cache = [BatchKVCache([0] * n_rows) for _ in model.layers]
        pending = [list(p[:-1]) for p in prompts]
        while any(pending):
            _prefill_round(model, cache, [p[:prefill_step_size] for p in pending])
            pending = [p[prefill_step_size:] for p in pending]
        for layer_cache in cache:
            layer_cache.filter(list(range(n_rows)))

        steps: list[list[Step]] = [[] for _ in prompts]
        inputs = mx.array([p[-1] for p in prompts])
        for index in range(n_tokens):
            logits, tokens = _decode_call(model, cache, inputs)
            for row, token in enumerate(tokens.tolist()):
                steps[row].append(Step(index=index, logits=logits[row], token=token))
            if index + 1 < n_tokens:
                inputs = tokens if forced_tokens is None else mx.array([f[index] for f in forced_tokens])
            if index % 512 == 0:
                mx.clear_cache()
    return steps


def _prefill_round(model: UniversalLlama, cache: list[BatchKVCache], chunks: list[list[int]]) -> None:
    """One prompt round: the chunks right-padded to one width, one model call, then the
    padding moved to the left of each row."""
    width = max(len(c) for c in chunks)
    padding = [width - len(c) for c in chunks]
    padded = max(padding) > 0
    if padded:
        for layer_cache in cache:
            layer_cache.prepare(right_padding=padding)
    tokens = mx.array([c + [PAD_TOKEN] * p for c, p in zip(chunks, padding, strict=True)])
    model(tokens, cache=cache)
    mx.eval([c.state for c in cache])
    mx.clear_cache()
    if padded:
        for layer_cache in cache:
            layer_cache.finalize()
        mx.eval([c.state for c in cache])
        mx.clear_cache()


def _decode_call(model: UniversalLlama, cache: list[BatchKVCache], inputs: mx.array) -> tuple[mx.array, mx.array]:
    logits = model(inputs[:, None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tokens = mx.argmax(logprobs, axis=-1)
    mx.eval(logits, tokens)
    return logits, tokens


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_arguments(
    model: UniversalLlama,
    prompts: list[list[int]],
    n_tokens: int,
    prefill_step_size: int,
    forced_tokens: list[list[int]] | None,
    prefill_batch_size: int,
) -> None:
    """Errors name the argument; the scheduler limits say why they exist."""
    vocab_size = model.config.vocab_size
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: need a non-empty list of token-id lists")
    for r, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError(f"prompts[{r}]: need a non-empty list of token ids")
        bad = [t for t in prompt if not _is_int(t) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompts[{r}]: token ids must be ints in [0, {vocab_size}), got {bad[:5]}")
    if not _is_int(n_tokens) or n_tokens < 1:
        raise ValueError(f"n_tokens: must be a positive int (BatchGenerator needs max_tokens > 0), got {n_tokens!r}")
    if not _is_int(prefill_step_size) or prefill_step_size < 1:
        raise ValueError(f"prefill_step_size: must be a positive int, got {prefill_step_size!r}")
    if not _is_int(prefill_batch_size) or prefill_batch_size < 1:
        raise ValueError(f"prefill_batch_size: must be a positive int, got {prefill_batch_size!r}")
    if len(prompts) > prefill_batch_size:
        raise ValueError(
            f"prefill_batch_size: {prefill_batch_size} admits fewer than the {len(prompts)} prompts; "
            "BatchGenerator would prefill them in groups, a schedule batch_greedy_steps does not mirror"
        )
    rounds = [-(-(len(p) - 1) // prefill_step_size) for p in prompts]
    if len(set(rounds)) > 1:
        raise ValueError(
            f"prompts: with prefill_step_size {prefill_step_size} the rows need {rounds} prefill rounds; "
            "BatchGenerator would start decoding the shorter ones first, a schedule batch_greedy_steps "
            "does not mirror"
        )
    if forced_tokens is not None:
        if not isinstance(forced_tokens, (list, tuple)) or len(forced_tokens) != len(prompts):
            raise ValueError(f"forced_tokens: need one list per prompt ({len(prompts)})")
        for r, forced in enumerate(forced_tokens):
            if len(forced) < n_tokens - 1:
                raise ValueError(f"forced_tokens[{r}]: {len(forced)} given, {n_tokens - 1} needed for {n_tokens} steps")
            bad = [t for t in forced[: n_tokens - 1] if not _is_int(t) or not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"forced_tokens[{r}]: token ids must be ints in [0, {vocab_size}), got {bad[:5]}")
