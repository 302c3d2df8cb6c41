"""The `speculative` judge (harness/checks/speculative.py) on synthetic draft records: two verify
steps of one draft each (four target rows). Each departure is reported naming the verify step:
missing or too few rows, fewer or more steps, other final tokens, another array shape; against
a compact golden the rows are judged by their digest, and no digest is never a pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.checks.speculative import ARRAY, judge_speculative
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord, array_sha256

ROWS = np.arange(20, dtype=np.float32).reshape(4, 5)  # (drafted + 1) rows per verify step


def _step(j: int, accepted: int) -> dict:
    return {"verify_step": j, "drafted": 1, "accepted": accepted, "from_draft": False}


def _record(tokens: list[int], infos: list[dict], rows: np.ndarray | None = ROWS) -> ScenarioRecord:
    arrays = {} if rows is None else {ARRAY: rows.copy()}
    logits = np.zeros((len(tokens), 5), np.float32)
    return ScenarioRecord("s", None, [1], tokens, logits, [0], arrays=arrays, extra={"step_info": infos})


# step 0 yields an accepted draft and the target's token, step 1 a rejected draft's replacement.
INFOS = [{"from_draft": True}, _step(0, 1), _step(1, 0)]


def _golden(**changes) -> ScenarioRecord:
    return dataclasses.replace(_record([1, 2, 3], INFOS), **changes)


def test_an_identical_draft_run_passes_with_its_counts() -> None:
    """The baseline the failures below depart from."""
    result = judge_speculative(_golden(), _record([1, 2, 3], INFOS))
    assert result.passed, result.summary
    assert result.summary.startswith("2 verify steps (4 target rows) bit-identical, accepted [1, 0]")
    assert result.details == {"accepted": [1, 0], "drafted": [1, 1]}


def test_a_golden_without_verify_steps_compares_nothing() -> None:
    """A golden of no draft run (no step_info) raises, never passes."""
    with pytest.raises(NothingComparedError, match="speculative: nothing to compare: the golden records no verify"):
        judge_speculative(_golden(extra={}), _record([1, 2, 3], INFOS))


def test_an_in_tree_record_without_the_verify_array_is_the_wrong_tensors() -> None:
    result = judge_speculative(_golden(), _record([1, 2, 3], INFOS, rows=None))
    assert not result.passed
    assert result.summary == "wrong tensors: the in-tree record has no 'verify_logits' array"


def test_fewer_in_tree_verify_steps_fail_at_the_first_missing_one() -> None:
    """The in-tree run stopped after step 0: step 1 is where it fails."""
    result = judge_speculative(_golden(), _record([1, 2], INFOS[:2]))
    assert not result.passed and result.first_bad_step == 1
    assert result.summary == "in-tree ran 1 verify steps, the oracle 2"


def test_more_in_tree_verify_steps_fail_after_the_oracles_last() -> None:
    """Every oracle step matched, then the in-tree run verified once more."""
    actual = _record([1, 2, 3, 4], [*INFOS, _step(2, 0)], rows=np.concatenate([ROWS, ROWS[:2]]))
    result = judge_speculative(_golden(), actual)
    assert not result.passed and result.first_bad_step == 2
    assert result.summary == "in-tree ran 3 verify steps, the oracle 2"


def test_too_few_verify_rows_fail_naming_the_step() -> None:
    """Step 1 needs rows 2 and 3; the in-tree array stops at row 2."""
    result = judge_speculative(_golden(), _record([1, 2, 3], INFOS, rows=ROWS[:3]))
    assert not result.passed and result.first_bad_step == 1
    assert result.summary == "verify step 1: verify_logits has too few rows"


def test_other_tokens_after_the_last_verify_step_fail_as_final_tokens() -> None:
    """A token past every verify step is in no step's JSON: the final token comparison catches it."""
    golden = _golden(tokens=[1, 2, 3, 4], extra={"step_info": [*INFOS, {}]})
    result = judge_speculative(golden, _record([1, 2, 3, 9], [*INFOS, {}]))
    assert not result.passed and result.first_bad_step == 3
    assert result.summary == "final tokens differ (at token 3; 4 vs 4 tokens)"


def test_extra_verify_rows_beyond_the_steps_fail_on_the_shape() -> None:
    """Every judged row equal, but the in-tree array has one row more than the oracle's."""
    result = judge_speculative(_golden(), _record([1, 2, 3], INFOS, rows=np.concatenate([ROWS, ROWS[:1]])))
    assert not result.passed
    assert result.summary == "verify_logits: oracle (4, 5) vs in-tree (5, 5)"


def _compact(digest: str | None) -> ScenarioRecord:
    """A compact golden: no verify rows at hand, at most their sha256."""
    return _golden(arrays={}, array_digests={} if digest is None else {ARRAY: digest})


def test_a_compact_golden_judges_the_rows_by_their_digest() -> None:
    """The same rows pass; one changed bit (the steps' JSON still equal) fails on the digest."""
    assert judge_speculative(_compact(array_sha256(ROWS)), _record([1, 2, 3], INFOS)).passed
    changed = ROWS.copy()
    changed[3, 4] = np.nextafter(changed[3, 4], np.float32(np.inf))
    result = judge_speculative(_compact(array_sha256(ROWS)), _record([1, 2, 3], INFOS, rows=changed))
    assert not result.passed
    assert result.summary == "verify_logits differs from the golden's sha256 (its blob is not at hand to say where)"


def test_a_compact_golden_without_the_digest_compares_nothing() -> None:
    with pytest.raises(NothingComparedError, match="the golden has neither 'verify_logits' nor its digest"):
        judge_speculative(_compact(None), _record([1, 2, 3], INFOS))
