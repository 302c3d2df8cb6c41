"""Prompt-lookup (n-gram) drafting, pass for pass as optiq 0.7.7's ngram_generate_step with adaptive=False.

The index remembers, for every n-gram (ngram_min..ngram_max tokens) of prompt + output, the
last 4 positions it ended at. A draft is what followed the current suffix's longest n-gram
earlier, taken from the occurrence whose preceding tokens agree longest with the current
ones (at most 48 compared; ties go to the later occurrence), at most `num_draft_tokens` and
at most what is left to generate minus one.

A pass feeds the current token plus the draft in one model call, log-softmaxes every row
together and takes each row's argmax; the draft is accepted up to the first disagreement,
and the row after the accepted ones gives the next current token. Rejected positions are
trimmed off the cache. A pass with nothing drafted (and no proposal) launches the next
single-token pass before its token is read ("run ahead", as mlx-lm's generate_step does),
and that pass never drafts. A token is yielded once it has been fed, so the current token
is handed out only after the next pass has run; with the accepted drafts, the logprobs of
their own rows.

Forcing: `forced_prefix` is mlx-lm's logits processor, applied as optiq applies processors
(row by row, each log-softmaxed alone, and no run-ahead); the yielded logprobs are the
processed ones. `forced_tokens` (teacher forcing) replaces the sampled token of each row by
the forced one before acceptance, the next current token and run-ahead are decided, so the
logprobs stay the model's and, when they match optiq's, so does the whole schedule.

Step info: "drafted" and "accepted" are how much optiq's NgramStats counters grew since the
previous yield (they grow once a pass is verified, which for the current token is after it
is yielded); the last step also carries "final_cache" (after the last rollback).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx

from models.universal.cache import KVCache
from models.universal.composed.caches import cache_digest, trim
from models.universal.composed.spec import NgramDraft
from models.universal.composed.steps import ComposedRun, ComposedStep, force_row, generation_stream
from models.universal.generate import prefill_prompt
from models.universal.prompt_cache import maybe_quantize_kv_cache


class NgramIndex:
    """Where each n-gram of the token stream ended (the last KEEP times), and the draft to copy."""

    KEEP = 4
    MAX_BACK = 48

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(int(t))

    def append(self, token: int) -> None:
        self.tokens.append(token)
        n = len(self.tokens)
        for size in range(self.min_n, min(self.max_n, n) + 1):
            ends = self._ends.setdefault((size, *self.tokens[n - size :]), [])
            ends.append(n)
            if len(ends) > self.KEEP:
                del ends[0]

    def _agreement(self, end: int) -> int:
        """How many tokens before `end` equal the tokens before the stream's end."""
        tokens, n = self.tokens, len(self.tokens)
        i = 0
        while i < self.MAX_BACK and end - 1 - i >= 0 and tokens[end - 1 - i] == tokens[n - 1 - i]:
            i += 1
        return i

    def propose(self, k: int) -> list[int]:
        if k <= 0:
            return []
        n = len(self.tokens)
        for size in range(min(self.max_n, n), self.min_n - 1, -1):
            earlier = [e for e in self._ends.get((size, *self.tokens[n - size :]), []) if e != n]
            if not earlier:
                continue
            _, best = max((self._agreement(e), e) for e in earlier)
            draft = self.tokens[best : best + k]
            if draft:
                return draft
        return []


def ngram_steps(run: ComposedRun) -> Iterator[ComposedStep]:
    model, n_tokens, forced_tokens, forced_prefix = run.model, run.n_tokens, run.forced_tokens, run.forced_prefix
    prompt_ids = run.prompt_ids
    c: NgramDraft = run.composition
    caches: list[Any] = [KVCache() for _ in model.layers]
    processed = bool(forced_prefix)  # optiq's logits-processor path

    def quantize() -> None:
        maybe_quantize_kv_cache(caches, c.quantized_kv_start, c.kv_group_size, c.kv_bits)

    def forward(inputs: mx.array) -> mx.array:
        with mx.stream(generation_stream):
            out = model(inputs[None], cache=caches)
            quantize()
        return out[0]

    def sample(logits: mx.array, first: int) -> tuple[mx.array, mx.array]:
        """Tokens and logprobs of every row; row i predicts output token `first + i`."""
        if processed:
            rows = [force_row(logits[i : i + 1], forced_prefix, first + i) for i in range(logits.shape[0])]
            logprobs = [row - mx.logsumexp(row, axis=-1, keepdims=True) for row in rows]
            tokens = mx.concatenate([mx.argmax(lp, axis=-1) for lp in logprobs], axis=0)
            logprobs = mx.concatenate(logprobs, axis=0)
        else:
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            tokens = mx.argmax(logprobs, axis=-1)
        if forced_tokens is not None:
            forced = [forced_tokens[g] if g < len(forced_tokens) else -1 for g in range(first, first + logits.shape[0])]
            if any(t >= 0 for t in forced):
                forced_array = mx.array(forced)
                tokens = mx.where(forced_array >= 0, forced_array.astype(tokens.dtype), tokens)
        return tokens, logprobs

    index = NgramIndex(c.ngram_min, c.ngram_max)
    index.extend(prompt_ids)
    prompt = prefill_prompt(model, caches, mx.array(prompt_ids, dtype=mx.uint32), run.prefill_step_size, quantize)

    drafted_total = accepted_total = 0
    reported = [0, 0]  # the counters at the previous yield

    def emit(token: int, logprobs: mx.array, keep_fed: list[int] | None) -> ComposedStep:
        """The step for an emitted token; `keep_fed` marks the last one (the pass to roll back to)."""
        info: dict[str, Any] = {"drafted": drafted_total - reported[0], "accepted": accepted_total - reported[1]}
        reported[:] = [drafted_total, accepted_total]
        if keep_fed is not None:
            fed, keep = keep_fed
            for cache in caches:
                trim(cache, fed - keep)
            info["final_cache"] = cache_digest(caches)
        chosen = token if forced_tokens is None else int(mx.argmax(logprobs).item())
        return ComposedStep(index=n_emitted, logits=logprobs, token=chosen, info=info)

    current = int(prompt[-1].item())
    current_index = -1  # output index of `current`; the last prompt token is -1
    current_logprobs = None
    current_is_output = False
    in_flight = None  # (tokens, logprobs) of a pass already launched on `current`
    n_emitted = 0
    while True:
        remaining = n_tokens - n_emitted - (1 if current_is_output else 0)
        budget = min(c.num_draft_tokens, remaining - 1)
        if in_flight is not None:
            fed = [current]
            tokens, logprobs = in_flight
            in_flight = None
            drafts: list[int] = []
            proposal = index.propose(budget) if budget > 0 else []
        else:
            proposal = index.propose(budget) if budget > 0 else []
            drafts = proposal
            fed = [current, *drafts]
            inputs = mx.array(fed, dtype=mx.uint32)
            tokens, logprobs = sample(forward(inputs), current_index + 1)
            mx.async_eval(tokens)

        if current_is_output:
            last = n_emitted + 1 >= n_tokens
            yield emit(current, current_logprobs, (len(fed), 1) if last else None)
            n_emitted += 1
            if last:
                return

        launched = None
        if not drafts and not proposal and not processed and n_emitted + 1 < n_tokens:
            ahead = tokens[:1].astype(mx.uint32)
            launched = sample(forward(ahead), current_index + 2)
            mx.async_eval(launched[0])
        tokens = tokens.tolist()
        drafted_total += len(drafts)
        n_accepted = 0
        while n_accepted < len(drafts) and tokens[n_accepted] == drafts[n_accepted]:
            n_accepted += 1
        accepted_total += n_accepted

        for j in range(n_accepted):
            index.append(drafts[j])
            last = n_emitted + 1 >= n_tokens
            yield emit(drafts[j], logprobs[j], (len(fed), j + 2) if last else None)
            n_emitted += 1
            if last:
                return

        for cache in caches:
            trim(cache, len(fed) - (n_accepted + 1))
        current = tokens[n_accepted]
        current_index += n_accepted + 1
        current_logprobs = logprobs[n_accepted]
        current_is_output = True
        in_flight = launched
        index.append(current)
