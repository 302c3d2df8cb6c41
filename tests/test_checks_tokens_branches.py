"""Token-level checks (harness/checks/tokens.py) on synthetic records: the prompt of each turn
(count first, then each one's text and ids, the failing turn named), where runs that end themselves
stop (at EOS or at the step limit), and a flip outside every ranked decode call classified as a
greedy row."""

from __future__ import annotations

import dataclasses

import numpy as np

from harness.checks.tokens import classify_flip, compare_eos, compare_prompt
from harness.records import ScenarioRecord


def _record(tokens: list[int], **extra) -> ScenarioRecord:
    """A run over a 4-token vocabulary whose logits prefer each chosen token by 1.0."""
    logits = np.zeros((len(tokens), 4), np.float32)
    logits[np.arange(len(tokens)), tokens] = 1.0
    return ScenarioRecord("s", None, [5, 6], list(tokens), logits, [3], extra=dict(extra))


def _prompt(ids: list[int]) -> ScenarioRecord:
    """A one-token run after the prompt `ids` (no rendered text)."""
    return ScenarioRecord("s", None, list(ids), [1], np.eye(4, dtype=np.float32)[[1]], [3])


def _turn(text: str, ids: list[int]) -> dict:
    return {"rendered_prompt": text, "prompt_ids": ids}


def test_a_different_number_of_turns_fails_before_any_prompt_is_compared() -> None:
    """Two turns in the oracle, one in-tree: the counts are the verdict."""
    golden = _record([1, 2], turns=[_turn("<u>a", [5]), _turn("<u>b", [6])])
    actual = _record([1, 2], turns=[_turn("<u>a", [5])])
    result = compare_prompt("prompt_identity", golden, actual)
    assert not result.passed
    assert result.summary == "2 turns in the oracle, 1 in-tree"


def test_the_turn_whose_prompt_differs_is_named() -> None:
    """The second turn's ids differ: the summary leads with `turn 1`, then the position."""
    golden = _record([1, 2], turns=[_turn("<u>a", [5]), _turn("<u>b", [6, 7])])
    actual = _record([1, 2], turns=[_turn("<u>a", [5]), _turn("<u>b", [6, 8])])
    result = compare_prompt("prompt_identity", golden, actual)
    assert not result.passed
    assert result.summary.startswith(
        "turn 1: prompt token ids differ at position 1: oracle [6, 7] vs in-tree [6, 8] from position 0"
        " (lengths 2 vs 2)"
    )
    assert result.details == {"oracle": [6, 7], "intree": [6, 8]}
    same = compare_prompt("prompt_identity", golden, dataclasses.replace(golden))
    assert same.passed and same.summary == "2 turns' rendered prompts and 3 token ids identical"


def test_runs_that_both_stop_at_eos_pass_naming_the_step() -> None:
    """`stop: eos` runs of equal length and reason pass; the summary says where EOS came."""
    golden = _record([1, 2, 3], finish_reason="stop")
    result = compare_eos("eos_stop", golden, dataclasses.replace(golden))
    assert result.passed
    assert result.summary == "EOS ids [3] identical; both runs stop at EOS (step 2) after 3 tokens"


def test_runs_that_both_hit_the_step_limit_pass_saying_so() -> None:
    """Both runs end at the limit (`length`): a pass that says no EOS was reached."""
    golden = _record([1, 2, 1], finish_reason="length")
    result = compare_eos("eos_stop", golden, dataclasses.replace(golden))
    assert result.passed
    assert result.summary == "EOS ids [3] identical; both runs stop at the step limit, without EOS after 3 tokens"


def test_runs_that_end_for_different_reasons_fail() -> None:
    """The contrast: equal lengths but `stop` against `length` is a failure at the last step."""
    golden = _record([1, 2, 3], finish_reason="stop")
    actual = _record([1, 2, 3], finish_reason="length")
    result = compare_eos("eos_stop", golden, actual)
    assert not result.passed and result.first_bad_step == 2
    assert result.summary.startswith("the runs end differently: oracle after 3 tokens (stop), in-tree after 3")


def test_a_row_outside_every_ranked_call_is_classified_as_a_greedy_flip() -> None:
    """A decode call of 2 members covers rows 0-1; row 2 lies outside it, so the flip there is
    classified on its logits (a near-tie here), not left unclassified as a ranked row."""
    call = {"row_offset": 0, "n_steps": 1, "batch": 2}
    golden = _record([1, 1, 2], decode_calls=[call])
    actual = _record([1, 1, 0], decode_calls=[call])
    actual.logits[2] = [1.5, 0.0, 1.0, 0.0]  # token 0 now leads token 2 by 0.5: the margin moved by 1.5
    flip = classify_flip(golden, actual, 2)
    assert "ranked" not in flip
    assert flip["near_tie"] is True and flip["oracle_margin"] == 1.0 and flip["margin_shift"] == 1.5
    inside = classify_flip(golden, _record([0, 1, 2], decode_calls=[call]), 0)
    assert inside["ranked"] == 2 and inside["near_tie"] is False


def test_ext2_f12_a_doubled_bos_is_shown_with_the_shared_one_and_named() -> None:
    """external-2 F12: chuk-lazarus's chat prompt began [1, 1, 317, ...] where the oracle's began
    [1, 317, ...]; the window starting at the difference hid the shared BOS, so a doubled BOS read
    as a single added one. The window now starts before the difference and the insertion is named."""
    golden = _prompt([1, 317, 42, 9])
    actual = _prompt([1, 1, 317, 42, 9])
    result = compare_prompt("prompt_identity", golden, actual)
    assert not result.passed
    assert result.summary == (
        "prompt token ids differ at position 1: oracle [1, 317, 42, 9] vs in-tree [1, 1, 317, 42, 9] from position 0"
        " (lengths 4 vs 5); in-tree has one extra token 1 at position 1"
        " (token 1 twice in a row: added both by the template and by the tokenizer?)"
    )
    dropped = compare_prompt("prompt_identity", actual, golden)
    assert dropped.summary.endswith(
        "; the oracle has one extra token 1 at position 1"
        " (token 1 twice in a row: added both by the template and by the tokenizer?)"
    )
    other = compare_prompt("prompt_identity", golden, _prompt([1, 318, 42, 9]))
    assert "extra" not in other.summary
