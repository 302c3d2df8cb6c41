"""Which run repeats a scenario's free run for the determinism check (issue 18: one in-tree run
saved per scenario where it is sound).

Two in-tree runs fed the same tokens must agree bit for bit before any oracle comparison means
anything. When the free run followed the golden, the teacher-forced run (fed the golden's
tokens) was fed exactly what the free run fed itself, so it is that repeat. Only then: a free
run that left the golden's path is repeated for real, never judged against a run fed other tokens.
"""

from __future__ import annotations

from typing import Any

from harness.checks.compare import diff_vectors
from harness.errors import NonDeterministicError
from harness.records import ScenarioRecord

# What decides a Whisper decode call's inputs (its window, temperature, prompt, fed tokens):
# equal for every call, two runs decoded the same windows from the same tokens.
DECODE_CALL_INPUTS = ("seek", "segment_frames", "temperature", "batch", "initial_tokens", "n_steps", "member_tokens")


def _call_inputs(record: ScenarioRecord) -> list[dict[str, Any]] | None:
    calls = record.extra.get("decode_calls")
    if not isinstance(calls, list):
        return None
    return [{key: call.get(key) for key in DECODE_CALL_INPUTS} for call in calls]


def forced_run_repeats_free(free: ScenarioRecord, forced: ScenarioRecord | None, golden: ScenarioRecord) -> bool:
    """Whether `forced` is a repeat of `free`: the free run chose the golden's tokens and, for a
    speech record, decoded the golden's windows with the golden's prompts, temperatures and
    member tokens, exactly as the teacher-forced run did."""
    if forced is None or free.tokens != golden.tokens:
        return False
    if free.extra.get("decode_calls") is None:  # a language model's record: the tokens are its inputs
        return True
    calls = _call_inputs(free)
    return forced.tokens == free.tokens and calls is not None and calls == _call_inputs(forced) == _call_inputs(golden)


def check_deterministic(label: str, first: ScenarioRecord, second: ScenarioRecord) -> None:
    """Two runs fed the same tokens must agree bit for bit, or no comparison means anything."""
    for step in range(min(len(first.tokens), len(second.tokens))):
        diff = diff_vectors(first.logits[step], second.logits[step])
        if not diff.equal:
            raise NonDeterministicError(
                f"in-tree implementation is not deterministic on {label}: two runs fed the same tokens "
                f"differ at step {step} ({diff.explain()}); no oracle comparison was made"
            )
    if len(first.tokens) != len(second.tokens):
        raise NonDeterministicError(f"in-tree implementation is not deterministic on {label}: run lengths differ")
    verify = first.arrays.get("verify_logits")  # a draft run: every verify row and step, not only the kept rows
    if verify is not None and (
        verify.tobytes() != second.arrays["verify_logits"].tobytes()
        or first.extra.get("step_info") != second.extra.get("step_info")
    ):
        raise NonDeterministicError(
            f"in-tree implementation is not deterministic on {label}: the draft runs' verify rows or steps differ"
        )
