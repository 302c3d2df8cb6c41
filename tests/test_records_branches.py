"""Records and their interface (harness/records.py, harness/records_schema.py): malformed compact
logits, records whose tensors, steps or segments disagree, and result files or metas that are
not JSON objects are errors naming what was expected."""

from __future__ import annotations

import re

import numpy as np
import pytest

from harness.errors import RecordError
from harness.records import CompactLogits, ScenarioRecord
from harness.records_schema import check_meta, check_result


def _record(**changes) -> ScenarioRecord:
    fields = {
        "scenario_id": "plain",
        "rendered_prompt": None,
        "prompt_ids": [1],
        "tokens": [2, 3],
        "logits": np.zeros((2, 4), np.float32),
        "eos_ids": [0],
    }
    return ScenarioRecord(**(fields | changes))


def _compact_json(**changes) -> dict:
    return CompactLogits.of(np.eye(2, 4, dtype=np.float32), 2, 1).as_json() | changes


# -- CompactLogits.from_json ----------------------------------------------------------------------


def test_compact_logits_of_unequal_lengths_are_refused() -> None:
    """One hash, top-k and logsumexp per row: a missing logsumexp entry is an error."""
    assert len(CompactLogits.from_json(_compact_json(), "g").row_sha256) == 2
    with pytest.raises(RecordError, match="g: compact logits: row_sha256, topk and logsumexp lengths differ"):
        CompactLogits.from_json(_compact_json(logsumexp=[0.0]), "g")


def test_compact_row_hashes_must_be_64_digits() -> None:
    """A truncated row hash is refused, not compared."""
    data = _compact_json()
    data["row_sha256"] = [data["row_sha256"][0], data["row_sha256"][1][:12]]
    with pytest.raises(RecordError, match="row_sha256 entries must be 64 hex digits"):
        CompactLogits.from_json(data, "g")


# -- ScenarioRecord -------------------------------------------------------------------------------


def test_a_row_outside_every_segment_is_named_by_its_index() -> None:
    """describe_row names a row inside a segment by turn and step, one past them all as `row N`."""
    record = _record(extra={"turns": [{"row_offset": 0, "n_steps": 1}, {"row_offset": 1, "n_steps": 1}]})
    assert record.describe_row(1) == "turn 1 step 0"
    assert record.describe_row(2) == "row 2"


def test_compact_hashes_for_other_rows_than_the_tokens_are_refused() -> None:
    """A compact record must describe one row per token."""
    compact = CompactLogits.from_json(_compact_json(), "g")
    _record(logits=np.zeros((0, 4), np.float32), compact=compact).validate("g")  # two rows, two tokens
    record = _record(tokens=[2, 3, 1], logits=np.zeros((0, 4), np.float32), compact=compact)
    with pytest.raises(RecordError, match="g: compact logits describe 2 rows, 3 tokens were recorded"):
        record.validate("g")


def test_compact_head_rows_beyond_the_tokens_are_refused() -> None:
    """A compact record's full head cannot hold more rows than tokens."""
    compact = CompactLogits.from_json(_compact_json(), "g")
    record = _record(logits=np.zeros((3, 4), np.float32), compact=compact)
    with pytest.raises(RecordError, match="compact logits describe 2 rows, 2 tokens were recorded"):
        record.validate("g")


def test_logits_rows_must_match_the_tokens() -> None:
    """A full record with one logits row per token passes; one row short is an error."""
    with pytest.raises(RecordError, match="g: logits has 1 rows but 2 tokens were recorded"):
        _record(logits=np.zeros((1, 4), np.float32)).validate("g")


def test_the_expected_number_of_steps_is_enforced() -> None:
    """validate(n_tokens=...) refuses a record of another length."""
    _record().validate("g", n_tokens=2)
    with pytest.raises(RecordError, match="g: expected 3 steps, got 2"):
        _record().validate("g", n_tokens=3)


def test_named_tensors_must_be_float32() -> None:
    """A float64 tensor is refused by name, never compared after a silent cast."""
    _record(arrays={"mel": np.zeros(3, np.float32)}).validate("g")
    with pytest.raises(RecordError, match="g: mel: expected float32, got float64"):
        _record(arrays={"mel": np.zeros(3)}).validate("g")


def test_segments_must_cover_every_row() -> None:
    """Segments covering fewer rows than tokens are an error naming both counts."""
    _record(extra={"rows": [{"row_offset": 0, "n_steps": 1, "batch": 2}]}).validate("g")
    record = _record(extra={"turns": [{"row_offset": 0, "n_steps": 1}]})
    with pytest.raises(RecordError, match="g: segments cover 1 rows, the record has 2"):
        record.validate("g")


# -- records_schema -------------------------------------------------------------------------------

META = {"scenario_id": "plain", "rendered_prompt": None, "prompt_ids": [1], "tokens": [2], "eos_ids": [0]}


def test_a_list_or_object_field_given_a_string_is_named() -> None:
    """A list rule refuses a non-list (a string is iterable, but not a token list), an object
    rule a non-object."""
    check_meta(META, "w")
    with pytest.raises(RecordError, match=re.escape("w: prompt_ids: expected a list of int token ids, got '12'")):
        check_meta(META | {"prompt_ids": "12"}, "w")
    with pytest.raises(RecordError, match=re.escape("w: transcript: expected a transcript object, got 'hi'")):
        check_meta(META | {"transcript": "hi"}, "w")


def test_a_meta_that_is_not_an_object_is_refused() -> None:
    """check_meta of a JSON list names the record itself."""
    with pytest.raises(RecordError, match=re.escape("w: record: expected a JSON object, got [1]")):
        check_meta([1], "w")


def test_a_result_that_is_not_an_object_is_refused() -> None:
    """check_result of a JSON string names the result itself."""
    with pytest.raises(RecordError, match=re.escape("r: result: expected a JSON object, got 'x'")):
        check_result("x", "r")


def test_a_scenario_entry_that_is_not_an_object_is_refused() -> None:
    """Each scenarios entry is a record or an error object; a list is named by its id."""
    check_result({"scenarios": {"a": {"error": "boom"}}, "environment": {}}, "r")
    with pytest.raises(
        RecordError, match=re.escape("r: scenarios['a']: expected a record object or an error object, got [1]")
    ):
        check_result({"scenarios": {"a": [1]}, "environment": {}}, "r")
