"""Draft-model speculative decoding, greedy, call for call as mlx-lm's speculative_generate_step.

Both models prefill the prompt but its last token (the draft first; chunks of
`prefill_step_size`). Then each verify step:

1. the draft proposes `d = min(num_draft_tokens, tokens left)` tokens, one model call each,
   each the argmax of the log-softmax of its last position; the first call is fed the
   current token, or, when the previous step accepted every draft, the last draft and the
   current token (the draft never saw its own last proposal);
2. the target is called once on [current token, drafts] (d + 1 positions); every row is
   log-softmaxed (all rows together, as one (d + 1, vocab) array) and argmaxed;
3. drafts are accepted while they equal the target's choice at their position
   (`accepted_count`); the accepted drafts are yielded, then the target's choice after them
   (unless `n_tokens` ran out first), which becomes the current token;
4. the caches are rewound: the target's by d - accepted positions, the draft's by
   max(d - accepted - 1, 0) (its last proposal was never fed to it).

The result keeps, per yielded token, the raw target logits row that decided it, every
verify call's raw rows, and per verify step the drafted / accepted counts and both caches'
state after the rewind (the draft's per layer: offset and sha256 up to it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from models.universal.composed.caches import cache_digest, trim
from models.universal.generate import generation_stream, prefill_prompt
from models.universal.model import UniversalLlama


@dataclass
class SpeculativeRun:
    tokens: list[int] = field(default_factory=list)
    rows: list[mx.array] = field(default_factory=list)  # per token: the target row that decided it
    verify_rows: list[mx.array] = field(default_factory=list)  # every verify call's rows, in order
    step_info: list[dict[str, Any]] = field(default_factory=list)  # per token, as the oracle records


def accepted_count(target_tokens: list[int], draft_tokens: list[int]) -> int:
    """How many drafts are accepted: the leading ones equal to the target's choice there."""
    n = 0
    while n < len(draft_tokens) and target_tokens[n] == draft_tokens[n]:
        n += 1
    return n


def _greedy(logits: mx.array) -> mx.array:
    """mlx-lm's greedy sampling of (rows, vocab) logits: argmax of the log-softmax."""
    return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)


def speculative_generate(
    target: UniversalLlama,
    draft: UniversalLlama,
    prompt_ids: list[int],
    n_tokens: int,
    num_draft_tokens: int,
    *,
    prefill_step_size: int = 512,
) -> SpeculativeRun:
    if not prompt_ids:
        raise ValueError("prompt_ids: need at least one token")
    for name, value in (
        ("n_tokens", n_tokens),
        ("num_draft_tokens", num_draft_tokens),
        ("prefill_step_size", prefill_step_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: must be a positive int, got {value!r}")
    if draft.config.vocab_size > target.config.vocab_size:
        raise ValueError(
            f"draft: its vocabulary ({draft.config.vocab_size}) is larger than the target's "
            f"({target.config.vocab_size}); a draft must share the target's tokenizer"
        )
    target_cache, draft_cache = target.make_cache(), draft.make_cache()
    run = SpeculativeRun()
    with mx.stream(generation_stream):
        prompt = mx.array(prompt_ids).astype(mx.uint32)
        draft_y = prefill_prompt(draft, draft_cache, prompt, prefill_step_size, lambda: None)
        y = prefill_prompt(target, target_cache, prompt, prefill_step_size, lambda: None)
        step = 0
        while len(run.tokens) < n_tokens:
            n_draft = min(n_tokens - len(run.tokens), num_draft_tokens)
            drafts = []
            for _ in range(n_draft):
                draft_y = _greedy(draft(draft_y[None], cache=draft_cache)[0, -1:, :])
                drafts.append(draft_y)
            fed = mx.concatenate([y, *drafts]) if drafts else y
            logits = target(fed[None], cache=target_cache)[0]
            chosen = _greedy(logits)
            mx.eval(chosen, *drafts)
            target_tokens = [int(t) for t in chosen.tolist()]
            draft_tokens = [int(d.item()) for d in drafts]
            n = accepted_count(target_tokens, draft_tokens)
            emitted = min(n + 1, n_tokens - len(run.tokens))
            for position in range(emitted):
                run.tokens.append(target_tokens[position])
                run.rows.append(logits[position])
                run.step_info.append({"from_draft": position < n})
            run.verify_rows.extend(logits[p] for p in range(logits.shape[0]))
            for layer in target_cache:
                trim(layer, n_draft - n)
            for layer in draft_cache:
                trim(layer, max(n_draft - n - 1, 0))
            run.step_info[-1] |= {
                "verify_step": step,
                "drafted": n_draft,
                "accepted": min(n, emitted),
                "target_offset": int(target_cache[0].offset),
                "draft_cache": cache_digest(draft_cache),
            }
            y = mx.array([target_tokens[n]], mx.uint32)
            draft_y = y
            if n == n_draft and drafts:
                draft_y = mx.concatenate([mx.array(draft_tokens[-1:], mx.uint32), y])
            step += 1
    return run
