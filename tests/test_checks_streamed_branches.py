"""The `streamed_transcript` judge (harness/checks/streamed.py) on synthetic Whisper records: a
streamed record must equal the batch one in its logits (shape, then bits), tokens, transcript,
log-Mel and encoder output, each difference named with the chunk size; a batch run without a
decode call is never a pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.checks.streamed import compare_streamed
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord

TOKENS = [3, 4, 5]


def _record(**changes) -> ScenarioRecord:
    """Three steps of one decode call, a transcript, a log-Mel and an encoder output."""
    call = {"seek": 0, "row_offset": 0, "n_steps": 3, "batch": 1, "tokens": TOKENS, "temperature": 0.0}
    record = ScenarioRecord(
        "clip",
        None,
        [1],
        list(TOKENS),
        np.arange(18, dtype=np.float32).reshape(3, 6),
        [7],
        arrays={"mel": np.ones((2, 4), np.float32), "encoder": np.zeros((3, 2), np.float32)},
        extra={"decode_calls": [call], "transcript": {"text": " hi", "segments": [{"start": 0.0, "end": 1.0}]}},
    )
    return dataclasses.replace(record, **changes)


def test_an_identical_stream_passes() -> None:
    """The baseline the failures below depart from."""
    result = compare_streamed(_record(), _record(), 7.0)
    assert result.passed, result.summary
    assert result.summary.startswith("7 s chunks: 1 windows, 3 logits rows, tokens, transcript, mel and encoder")


def test_a_batch_run_without_decode_calls_compares_nothing() -> None:
    with pytest.raises(NothingComparedError, match="streamed_transcript: nothing to compare: the batch run made no"):
        compare_streamed(_record(extra={}), _record(), 1.0)


def test_logits_of_another_shape_fail_before_any_row_is_compared() -> None:
    streamed = _record(logits=np.zeros((2, 6), np.float32))
    result = compare_streamed(_record(), streamed, 1.0)
    assert not result.passed
    assert result.summary == "1 s chunks: logits (3, 6) in the batch run, (2, 6) streamed"
    assert result.details == {"chunk_s": 1.0}


def test_a_logits_row_off_by_one_ulp_fails_at_its_step() -> None:
    logits = _record().logits.copy()
    logits[1, 2] = np.nextafter(logits[1, 2], np.float32(np.inf))
    result = compare_streamed(_record(), _record(logits=logits), 30.0)
    assert not result.passed and result.first_bad_step == 1
    assert result.summary.startswith("30 s chunks: first differing step 1 (decode call 0 step 1)"), result.summary
    assert "max ULP 1" in result.summary
    assert result.details["chunk_s"] == 30.0


def test_other_tokens_with_the_same_logits_fail_at_the_first_differing_token() -> None:
    result = compare_streamed(_record(), _record(tokens=[3, 9, 5]), 1.0)
    assert not result.passed and result.first_bad_step == 1
    assert result.summary == "1 s chunks: token 1: batch 4 vs streamed 9"


def test_a_differing_transcript_names_the_key_path() -> None:
    streamed = _record()
    streamed.extra = streamed.extra | {"transcript": {"text": " hi", "segments": [{"start": 0.0, "end": 1.5}]}}
    result = compare_streamed(_record(), streamed, 1.0)
    assert not result.passed
    assert result.summary == "1 s chunks: transcript differs at segments[0].end: batch 1.0 vs streamed 1.5"


@pytest.mark.parametrize(
    ("name", "array", "where"),
    [
        ("mel", np.ones((2, 5), np.float32), "(2, 4) batch vs (2, 5) streamed: shape"),
        ("encoder", np.array([[0, 0], [0, 0], [0, -0.0]], np.float32), "(3, 2) batch vs (3, 2) streamed: first "),
    ],
)
def test_a_differing_mel_or_encoder_output_names_the_shape_or_first_index(
    name: str, array: np.ndarray, where: str
) -> None:
    """Compared by raw bits: a -0.0 for a 0.0 is a difference, reported at its index."""
    streamed = _record()
    streamed.arrays = streamed.arrays | {name: array}
    result = compare_streamed(_record(), streamed, 1.0)
    assert not result.passed
    assert result.summary.startswith(f"1 s chunks: {name} {where}"), result.summary
    if name == "encoder":
        assert result.summary.endswith("differing index (2, 1)")
