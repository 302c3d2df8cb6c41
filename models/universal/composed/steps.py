"""What every composed path yields, and the pieces the decode loops share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from models.universal.generate import force_row, generation_stream

__all__ = ["ComposedRun", "ComposedStep", "force_row", "generation_stream"]


@dataclass(frozen=True)
class ComposedStep:
    """One emitted token of a composed path.

    `logits` is the vector the L2 oracle records for this step: the model's raw logits for
    the cache paths; for ngram drafting the logprobs optiq's generator yields with the token
    (rows of a multi-position verify pass, log-softmaxed together). `token` is the model's
    greedy choice at this step (the forced one where a forced prefix applies). `info` holds
    the drafting counters for ngram drafting and, on the last step, the final cache state.
    """

    index: int
    logits: mx.array  # (vocab,)
    token: int
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ComposedRun:
    """One composed run as `composed_steps` hands it to a path, every field validated: the
    model, the prompt, how many steps, the parsed composition, the prefill chunk, the
    teacher-forced tokens (None: free-running) and mlx-lm's forced prefix ([]: none)."""

    model: Any  # a models.universal.model.UniversalLlama
    prompt_ids: list[int]
    n_tokens: int
    composition: Any  # a models.universal.composed.spec.Composition
    prefill_step_size: int
    forced_tokens: list[int] | None
    forced_prefix: list[int]
