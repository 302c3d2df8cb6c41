"""The `detokenize` judge (harness/checks/text.py) on synthetic stream_text records: a record
without a well-formed stream_text, or a golden that streamed no piece, compares nothing; another
segment count or another full decode (every piece equal) fails, naming it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.checks.text import compare_stream_text
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord

SEGMENT = {"pieces": ["He", "llo"], "decoded": "Hello"}


def _record(stream_text: Any, tokens: tuple[int, ...] = (1, 2)) -> ScenarioRecord:
    extra = {} if stream_text is None else {"stream_text": stream_text}
    logits = np.zeros((len(tokens), 4), np.float32)
    return ScenarioRecord("s", None, [1], list(tokens), logits, [3], extra=extra)


def test_identical_streams_pass() -> None:
    """The baseline the failures below depart from."""
    result = compare_stream_text(_record([SEGMENT]), _record([dict(SEGMENT)]))
    assert result.passed, result.summary
    assert result.summary.startswith("2 streamed pieces and 1 full decode(s) identical")


@pytest.mark.parametrize(
    "stream_text",
    [None, {"pieces": [], "decoded": ""}, [{"pieces": ["a"]}], ["a"]],
    ids=["absent", "not-a-list", "no-decoded", "not-a-dict"],
)
@pytest.mark.parametrize("side", ["golden", "in-tree"])
def test_a_record_without_a_well_formed_stream_text_compares_nothing(stream_text: Any, side: str) -> None:
    """Either side's stream_text must be a list of {pieces, decoded}: else it raises naming the side."""
    golden, actual = (
        (_record(stream_text), _record([SEGMENT])) if side == "golden" else (_record([SEGMENT]), _record(stream_text))
    )
    with pytest.raises(
        NothingComparedError, match=f"detokenize: nothing to compare: the {side} record has no stream_text"
    ):
        compare_stream_text(golden, actual)


def test_another_segment_count_fails_naming_both() -> None:
    result = compare_stream_text(_record([SEGMENT]), _record([SEGMENT, SEGMENT]))
    assert not result.passed
    assert result.summary == "1 segments streamed by the oracle, 2 in-tree"


def test_a_golden_that_streamed_no_piece_compares_nothing() -> None:
    """Segments present but every piece list empty: nothing was streamed, never a pass."""
    empty = [{"pieces": [], "decoded": ""}]
    with pytest.raises(NothingComparedError, match="detokenize: nothing to compare: the golden streamed no pieces"):
        compare_stream_text(_record(empty), _record(empty))


def test_another_full_decode_fails_with_every_piece_equal() -> None:
    """The pieces agree but the full decode does not: the failure names the segment and both decodes."""
    result = compare_stream_text(_record([SEGMENT]), _record([SEGMENT | {"decoded": " Hello"}]))
    assert not result.passed
    assert result.summary == "full decode of segment 0 differs: oracle 'Hello' vs in-tree ' Hello'"
    assert result.details == {"segment": 0, "oracle": "Hello", "intree": " Hello"}
