"""The Whisper fast path's L2 gate (harness/checks/token_budget.py) on synthetic records, built as
tests/test_exercise_budget.py builds them (one greedy decode call over an 8-token vocabulary):
every rule's failure is named (the record, the fast path ran, the per-step bound, where the
differences arise), an ended sequence is not judged, and a flip decided by a rule rather than a
logit is classified as such."""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import numpy as np
import pytest

from harness.checks.token_budget import _classify, check_token_budget, clip_tokens, measure
from harness.goldens.calibration import CalibrationRecord, StepBound, golden_identity
from harness.records import CompactLogits
from models.whisper.fast_filters import FastFilters, FilterState, TimestampRules
from tests.test_exercise_budget import EOT, ORACLE, _judged, _record

TOKENS = [2, 4, EOT]  # the oracle's picks on ORACLE's rows


def _golden():
    return _record(TOKENS, ORACLE, "free")


def _forced(rows: list[dict[int, float]] = ORACLE, picks: list[int] | None = TOKENS, tokens: list[int] = TOKENS):
    return _record(tokens, rows, "teacher_forced", picks=picks)


def _calibration(golden, budget: int, steps: tuple[StepBound, ...]) -> CalibrationRecord:
    return CalibrationRecord("synthetic", "synthetic", "key", golden_identity(golden), budget, steps, {})


def test_clip_tokens_of_a_record_without_decode_calls_is_an_error() -> None:
    record = dataclasses.replace(_golden(), extra={})
    with pytest.raises(ValueError, match=r"synthetic \(free\): not a speech record \(no decode_calls\)"):
        clip_tokens(record)


def test_measure_refuses_a_compact_golden() -> None:
    """Margins need the oracle's full vectors: a compact golden is a usage error, named."""
    compact = CompactLogits(vocab=8, row_sha256=[], topk_ids=[], topk_values=[], logsumexp=[], full_steps=0)
    golden = dataclasses.replace(_golden(), compact=compact)
    with pytest.raises(ValueError, match="synthetic: the token-budget gate needs the oracle's full logit vectors"):
        measure(golden, _forced())


def test_an_identical_fast_path_measures_every_step_with_no_failure() -> None:
    """The baseline the measurements below depart from: three steps, zero error."""
    measured = measure(_golden(), _forced())
    assert measured["steps"] == [StepBound(0, s, 0, 0.0) for s in range(3)]
    assert (measured["flips"], measured["failures"]) == ([], [])


def test_another_decode_call_count_is_a_failure_measuring_nothing() -> None:
    forced = _forced()
    forced.extra["decode_calls"] = forced.extra["decode_calls"] * 2
    measured = measure(_golden(), forced)
    assert measured == {
        "steps": [],
        "flips": [],
        "failures": ["the teacher-forced run made 2 decode calls, the oracle 1"],
    }


def test_other_logits_shape_is_a_failure_measuring_nothing() -> None:
    measured = measure(_golden(), _forced(ORACLE[:2], [2, 4], [2, 4]))
    assert measured["steps"] == []
    assert measured["failures"] == ["teacher-forced logits (2, 8) vs the oracle's (3, 8)"]


def test_a_call_of_other_steps_is_a_failure_and_not_measured() -> None:
    forced = _forced()
    forced.extra["decode_calls"][0]["n_steps"] = 2
    measured = measure(_golden(), forced)
    assert measured["steps"] == []
    assert measured["failures"] == ["decode call 0: teacher-forced 2 steps x 1, the oracle 3 x 1"]


def test_steps_after_the_sequence_ended_are_not_judged() -> None:
    """After EOT both sides append EOT: a step whose prefix ends in EOT is neither measured nor a
    flip, whatever the fast path picked there."""
    golden = _record([2, EOT, EOT], [{2: 5.0}, {EOT: 9.0}, {EOT: 9.0}], "free")
    forced = _forced([{2: 5.0}, {EOT: 9.0}, {4: 9.0}], picks=[2, EOT, 4], tokens=[2, EOT, EOT])
    measured = measure(golden, forced)
    assert measured["steps"] == [StepBound(0, 0, 0, 0.0), StepBound(0, 1, 0, 0.0)]
    assert (measured["flips"], measured["failures"]) == ([], [])


def test_a_non_finite_fast_logit_where_the_oracles_is_finite_is_a_failure() -> None:
    """Named at its step; the error is measured over the logits finite on both sides."""
    rows = [ORACLE[0], {4: 3.0, 5: 2.999, 0: -math.inf}, ORACLE[2]]
    measured = measure(_golden(), _forced(rows))
    assert measured["failures"] == [
        "decode call 0 step 1: the fast path's logits are non-finite where the oracle's are not"
    ]
    assert measured["steps"][1] == StepBound(0, 1, 0, 0.0)


def test_filters_that_do_not_reproduce_the_oracles_choice_are_a_failure() -> None:
    """The oracle recorded 3 at step 0 where its own row, filtered, picks 2: the rules differ."""
    golden = _record([3, 4, EOT], ORACLE, "free")
    measured = measure(golden, _forced(picks=[2, 4, EOT], tokens=[3, 4, EOT]))
    assert measured["failures"] == [
        "decode call 0 step 0: the fast path's filters applied to the oracle's logits choose 2, "
        "the oracle chose 3: the decoding rules differ"
    ]


def test_a_negative_budget_is_an_error() -> None:
    golden = _golden()
    with pytest.raises(ValueError, match="token budget must be >= 0, got -1"):
        check_token_budget(golden, golden, _forced(), -1, _calibration(golden, -1, ()))


def test_a_calibration_record_of_other_steps_does_not_describe_the_run() -> None:
    golden = _golden()
    result = check_token_budget(golden, _golden(), _forced(), 0, _calibration(golden, 0, ()))
    assert not result.passed
    assert result.summary == (
        "1 problem(s): the teacher-forced run checked 3 steps, the calibration record bounds 0 other ones: "
        "the record does not describe this run"
    )
    assert result.details["steps_over_bound"] == []


def _unexplained(text: str) -> dict:
    return {"explained": False, "explanation": f"the counted differences are unexplained: {text}"}


def test_an_extra_free_decode_call_after_equal_ones_is_unexplained() -> None:
    """The calls both made agree (tokens and decisions): the difference is the extra call."""
    free = _golden()
    call = free.extra["decode_calls"][0]
    free.extra["decode_calls"] = [call, call | {"seek": 3000, "tokens": [5]}]
    result = _judged(_golden(), free, _forced(), 5)
    assert not result.passed and result.details["differing_tokens"] == 1
    assert result.details["arising"] == _unexplained(
        "the free run made 2 decode calls, the oracle 1, with no differing tokens in the calls both made"
    )


def test_the_oracles_tokens_with_another_decision_are_unexplained() -> None:
    """The free run decoded the oracle's tokens but dropped the call: the decision is named."""
    free = _golden()
    free.extra["decode_calls"][0]["kept"] = False
    result = _judged(_golden(), free, _forced(), 5)
    assert not result.passed and result.details["differing_tokens"] == 2
    assert result.details["arising"] == _unexplained(
        "decode call 0 decoded the oracle's tokens but decided differently (kept: oracle True, fast False)"
    )


def test_differences_in_a_call_delegated_to_the_faithful_decoder_are_unexplained() -> None:
    """No greedy picks were recorded for the call where the free run leaves the oracle."""
    free = _record([2, 5, EOT], ORACLE, "free")
    result = _judged(_golden(), free, _forced(picks=None), 5)
    assert not result.passed
    assert result.details["arising"] == _unexplained(
        "they arise at decode call 0 step 1, a call delegated to the faithful decoder (no greedy flip)"
    )
    assert "the fast path decoded no greedy step" in result.summary


# -- rule 4(c) where the two sides' filters allow different tokens -----------------------------------

TEXT_MAX, BEGIN = 3.0, 6  # tokens 0-3 text, 4 EOT, 5 no-timestamps, 6-9 timestamps
PREFIX = [BEGIN, 0]  # a timestamp then text: neither the initial nor a pair rule applies


def _row(timestamp: float, want: float = TEXT_MAX) -> np.ndarray:
    return np.array([want, 0, 0, 0, 0, 0, timestamp, timestamp, timestamp, timestamp], np.float32)


def _hat(filters: FastFilters, row: np.ndarray, state: FilterState) -> np.ndarray:
    return np.array(filters.apply(mx.array(row[None]), state))[0]


def test_a_flip_by_the_timestamp_rule_is_judged_on_its_log_prob_margin() -> None:
    """The timestamps' total log-prob is below the best text token's on the oracle's row and
    above it on the fast path's: margin and error are those of the rule, a near-tie."""
    rules = TimestampRules(begin=BEGIN, eot=4, no_timestamps=5, max_initial_index=None, fix_monotonic=False)
    filters = FastFilters(10, None, None, rules)
    state = FilterState.from_sampled([PREFIX], BEGIN)
    g, a = _row(1.0), _row(1.8)
    g_hat, a_hat = _hat(filters, g, state), _hat(filters, a, state)
    assert (int(np.argmax(g_hat)), int(np.argmax(a_hat))) == (0, BEGIN)  # the rule flipped the pick
    flip = _classify("here", 0, 0, BEGIN, g, a, g_hat, a_hat, filters, state)
    g_gap, a_gap = math.log(4) + 1.0 - TEXT_MAX, math.log(4) + 1.8 - TEXT_MAX  # timestamps vs best text
    assert flip["kind"] == "timestamp rule" and flip["near_tie"] is True
    assert flip["margin"] == pytest.approx(abs(g_gap), rel=1e-5)
    assert flip["error"] == pytest.approx(abs(a_gap - g_gap), rel=1e-5)
    assert flip["explanation"].startswith("here: oracle 0 vs fast 6: near-tie: the timestamp-probability rule")


def test_a_token_allowed_on_one_side_only_without_timestamp_rules_is_a_rule_not_a_near_tie() -> None:
    """No logit-dependent rule to blame (the fast row's own logit is -inf): an infinite margin,
    never a near-tie."""
    filters = FastFilters(10, None, None, None)
    g = _row(1.0)
    a = g.copy()
    a[0] = -np.inf
    flip = _classify("here", 0, 0, BEGIN, g, a, g, a, filters, FilterState.initial(1))
    assert (flip["kind"], flip["margin"], flip["error"], flip["near_tie"]) == ("rules", math.inf, 0.0, False)
    assert flip["explanation"] == (
        "here: oracle 0 vs fast 6: NOT a near-tie: the oracle's rules forbid the fast path's token "
        "(or allow one the fast path forbade)"
    )
