"""Beam search's finished candidates are compared, not only the winner (issue 53 part 4):
`decode_tokens` fails on a candidate missing, added, reordered or with other tokens, and on a
sum beyond CANDIDATE_SUM_TOLERANCE nats a term; the records interface checks the field; the
in-tree recorder writes it from the decoder's observer."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np
import pytest

from harness.checks.tokens import CANDIDATE_SUM_TOLERANCE, decode_tokens
from harness.errors import RecordError
from harness.paths import REPO_ROOT
from harness.records import ScenarioRecord
from harness.records_schema import check_meta
from harness.runners.whisper_record import TranscriptionRecorder


def _meta() -> dict[str, Any]:
    """A tracked two-window Whisper record, its first decode call given three candidates."""
    path = sorted((REPO_ROOT / "goldens" / "whisper-tiny-en").glob("*mlx*/long-two-windows.json"))[0]
    meta = json.loads(path.read_text())["record"]
    call = meta["decode_calls"][0]
    call["candidates"] = [
        {"tokens": call["tokens"], "sum_logprob": -3.25},
        {"tokens": call["tokens"][:-1], "sum_logprob": -4.5},
        {"tokens": call["tokens"][1:], "sum_logprob": -5.0},
    ]
    return meta


def _record(meta: dict[str, Any]) -> ScenarioRecord:
    return ScenarioRecord.from_meta(meta, np.zeros((len(meta["tokens"]), 4), np.float32), "test")


def _judge(edit) -> Any:
    golden = _meta()
    actual = copy.deepcopy(golden)
    edit(actual["decode_calls"][0]["candidates"], actual["decode_calls"][0])
    return decode_tokens(_record(golden), _record(actual))


def test_identical_candidates_pass_and_are_counted() -> None:
    result = _judge(lambda cands, call: None)
    assert result.passed and "3 beam candidates with identical tokens" in result.summary


@pytest.mark.parametrize(
    "edit",
    [
        lambda cands, call: cands.reverse(),  # the order they finished
        lambda cands, call: cands.pop(),  # one fewer
        lambda cands, call: cands.append(dict(cands[0])),  # one more
        lambda cands, call: cands[2]["tokens"].append(7),  # other tokens
        lambda cands, call: call.pop("candidates"),  # none recorded
    ],
    ids=["reordered", "missing", "added", "other-tokens", "absent"],
)
def test_any_other_candidate_set_fails_naming_the_candidates(edit) -> None:
    result = _judge(edit)
    assert not result.passed and "candidates" in result.summary and "decode_calls" not in result.summary


def _shift(by: float):
    def edit(cands: list, call: dict) -> None:
        terms = len(cands[1]["tokens"]) + 1
        cands[1]["sum_logprob"] += by * CANDIDATE_SUM_TOLERANCE * terms

    return edit


def test_a_sum_beyond_the_per_term_bound_fails_naming_call_and_candidate() -> None:
    result = _judge(_shift(1.5))
    assert not result.passed and "decode call 0, beam candidate 1" in result.summary
    assert result.details["candidate"] == 1 and result.details["oracle"] == -4.5


def test_a_sum_within_the_bound_passes_with_its_largest_difference() -> None:
    result = _judge(_shift(0.5))
    assert result.passed
    assert math.isclose(result.details["candidate_sum_largest_difference_per_term"], 0.5 * CANDIDATE_SUM_TOLERANCE)


def test_a_nan_sum_fails() -> None:
    def edit(cands: list, call: dict) -> None:
        cands[0]["sum_logprob"] = float("nan")

    assert not _judge(edit).passed


def test_the_records_interface_checks_each_candidate() -> None:
    meta = _meta()
    check_meta(meta, "golden")
    meta["decode_calls"][0]["candidates"][1]["sum_logprob"] = "-4.5"
    with pytest.raises(RecordError, match=r"decode_calls\[0\]\.candidates\[1\]\.sum_logprob: expected a number"):
        check_meta(meta, "golden")


def test_the_recorder_keeps_the_decoders_candidates_for_its_one_window() -> None:
    import mlx.core as mx

    from models.whisper.decoding_types import DecodingResult

    recorder = TranscriptionRecorder(
        dict.fromkeys(("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold")), 1, eot=50256
    )
    recorder.on_decode_begin((50257, 50362), 5, 0.0)
    recorder.on_step(mx.zeros((5, 4)), mx.array([1, 2, 3, 4, 50256]), True)
    recorder.on_candidates([[[1], [2, 3]]], [[-0.5, -1.25]])
    result = DecodingResult(audio_features=mx.zeros((1,)), language="en", tokens=[1], text="a")
    recorder.on_decode_call(0, 3000, result, False)
    assert recorder.decode_calls[0]["candidates"] == [
        {"tokens": [1], "sum_logprob": -0.5},
        {"tokens": [2, 3], "sum_logprob": -1.25},
    ]
    with pytest.raises(AssertionError, match="one-window"):
        recorder.on_decode_begin((50257,), 5, 0.0)
        recorder.on_candidates([[[1]], [[2]]], [[-0.5], [-1.0]])
