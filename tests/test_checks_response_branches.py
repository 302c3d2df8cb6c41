"""The `response` judge (harness/checks/response.py) on synthetic server responses: each way a
sequence can differ is named (forced ids, initial state, a streamed chunk, the whole message),
non-dict chunks are compared as they are, and a golden without a response is never a pass."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from harness.checks.response import check_response
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord


def _sequence(tokens: list[int]) -> dict[str, Any]:
    return {
        "initial_state": "normal",
        "tokens": tokens,
        "stream": [
            {"delta": {"role": "assistant", "content": "a"}, "finish_reason": None},
            {"delta": {"content": "b"}, "finish_reason": "stop", "usage": {"completion_tokens": 2}},
        ],
        "whole": {"message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop"},
    }


def _response() -> dict[str, Any]:
    forced = _sequence([7, 8]) | {"id": "tool-call", "text": "<tool>", "ids": [7, 8]}
    return {"generated": _sequence([5, 6]), "forced": [forced]}


def _record(response: dict[str, Any] | None) -> ScenarioRecord:
    extra = {} if response is None else {"server_response": response}
    return ScenarioRecord("s", None, [1], [5, 6], np.zeros((2, 4), np.float32), [0], extra=extra)


def _judge(edit) -> Any:
    """The judge on the golden response against a copy of it changed by `edit`."""
    mine = copy.deepcopy(_response())
    edit(mine)
    return check_response(_record(_response()), _record(mine))


def test_identical_responses_pass_counting_every_sequence_and_chunk() -> None:
    """The baseline the failures below depart from: two sequences, four streamed chunks."""
    result = _judge(lambda r: None)
    assert result.passed, result.summary
    assert result.summary.startswith("2 sequences (generated, tool-call): 4 streamed chunks")


@pytest.mark.parametrize("response", [None, {}])
def test_a_golden_without_a_server_response_compares_nothing(response: dict | None) -> None:
    """No (or an empty) server response in the golden raises, never passes."""
    with pytest.raises(NothingComparedError, match="response: nothing to compare: the golden has no server response"):
        check_response(_record(response), _record(_response()))


def test_other_forced_sequences_fail_naming_both_sides_ids() -> None:
    """The forced texts' ids must be the same list on both sides, before any sequence is read."""
    result = _judge(lambda r: r["forced"].append(r["forced"][0] | {"id": "extra"}))
    assert not result.passed
    assert result.summary == "response: forced sequences ['tool-call', 'extra'] in-tree, ['tool-call'] in the oracle"


def test_a_missing_in_tree_response_fails_on_its_forced_sequences() -> None:
    """An in-tree record with no server response at all has no forced sequences."""
    result = check_response(_record(_response()), _record(None))
    assert not result.passed
    assert result.summary == "response: forced sequences [] in-tree, ['tool-call'] in the oracle"


@pytest.mark.parametrize(
    ("sequence", "key", "label"),
    [("generated", "initial_state", "generated tokens"), ("forced", "tokens", "forced 'tool-call'")],
)
def test_a_differing_initial_state_or_token_list_is_named(sequence: str, key: str, label: str) -> None:
    """initial_state and tokens are compared before the stream, naming the sequence and both values."""

    def edit(r: dict) -> None:
        target = r["generated"] if sequence == "generated" else r["forced"][0]
        target[key] = "reasoning" if key == "initial_state" else [9]

    result = _judge(edit)
    golden = "'normal'" if key == "initial_state" else "[7, 8]"
    mine = "'reasoning'" if key == "initial_state" else "[9]"
    assert not result.passed
    assert result.summary == f"response: {label}: {key} differs: oracle {golden} vs in-tree {mine}"
    assert result.details == {"sequence": "generated" if sequence == "generated" else "tool-call"}


def test_a_differing_non_streaming_message_is_named_after_equal_chunks() -> None:
    """Every chunk equal but the whole message not: the failure shows both messages' fields."""
    result = _judge(lambda r: r["generated"]["whole"]["message"].update(content="abc"))
    assert not result.passed
    assert result.summary == (
        "response: generated tokens: non-streaming message differs: oracle {'finish_reason': 'stop', "
        "'content': 'ab'} vs in-tree {'finish_reason': 'stop', 'content': 'abc'}"
    )


def test_non_dict_chunks_are_compared_as_they_are() -> None:
    """A chunk that is not a dict (here a bare string) is its own fields: equal strings pass,
    different ones fail showing both."""
    golden = _response()
    golden["generated"]["stream"][0] = "x"
    same = copy.deepcopy(golden)
    assert check_response(_record(golden), _record(same)).passed
    other = copy.deepcopy(golden)
    other["generated"]["stream"][0] = "y"
    result = check_response(_record(golden), _record(other))
    assert not result.passed
    assert result.summary == "response: generated tokens: streamed chunk 0 of 2 differs: oracle 'x' vs in-tree 'y'"


def test_a_forced_text_encoded_to_other_ids_is_the_failure() -> None:
    """A forced text whose ids differ is not the same sequence: that, not its chunks, is reported."""
    result = _judge(lambda r: r["forced"][0].update(ids=[7, 9]))
    assert not result.passed
    assert result.summary == (
        "response: forced 'tool-call': the text '<tool>' encodes to [7, 9] in-tree, [7, 8] in the oracle "
        "(the sequences are not the same tokens)"
    )
