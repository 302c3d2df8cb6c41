"""Each decode call's finished candidates (harness/checks/candidates.py): their number first,
then each one's tokens and float32 sum bit for bit, a failure naming the decode call and the
candidate. Through the session: a greedy sum one ULP off fails `fallback_decisions` against the
mlx-whisper golden, which records the candidates; on a beam scenario, whose openai-whisper golden
does not, `decode_tokens` says so, and a perturbed in-tree beam search's candidates fail the judge
against the unperturbed run's."""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from harness.checks.candidates import NOT_RECORDED, judge_candidates
from harness.records import ScenarioRecord
from harness.session import ParitySession
from models.whisper import token_decoders

CALL = {"seek": 0, "attempt": 0, "temperature": 0.0}


def _record(candidates: list[list[dict[str, Any]]] | None) -> ScenarioRecord:
    calls = [CALL | ({"candidates": c} if candidates is not None else {}) for c in candidates or [[]]]
    return ScenarioRecord("s", None, [], [], np.zeros((0, 4), np.float32), [0], extra={"decode_calls": calls})


FIVE = [{"tokens": [10 + i, 20, 30], "sum_logprob": -1.5 - i} for i in range(5)]


def _judge(golden: list, actual: list | None, sums: bool = True):
    return judge_candidates("fallback_decisions", _record(golden), _record(actual), sums=sums)


def test_identical_candidates_pass_with_their_count() -> None:
    failure, note = _judge([FIVE, FIVE[:1]], copy.deepcopy([FIVE, FIVE[:1]]))
    assert failure is None and note == "6 finished candidates of 2 decode calls identical (tokens and float32 sums)"


def test_a_dropped_candidate_fails_on_the_count_first() -> None:
    failure, _ = _judge([FIVE], [FIVE[1:]])  # the first candidate missing: the tokens differ too
    assert failure is not None and not failure.passed
    assert failure.summary.startswith(
        "decode call 0 (seek 0, attempt 0, T=0.0): the oracle finished 5 candidates, the in-tree run 4"
    )


def test_reordered_candidates_fail_naming_the_first_one_and_the_token() -> None:
    failure, _ = _judge([FIVE], [[FIVE[1], FIVE[0], *FIVE[2:]]])
    assert failure is not None
    assert "decode call 0 (seek 0, attempt 0, T=0.0) candidate 0: tokens differ at position 0: oracle 10 vs " in (
        failure.summary
    )
    assert failure.details["candidate"] == 0 and failure.details["decode_call"] == 0


def test_a_sum_one_ulp_off_fails_and_says_how_far() -> None:
    off = copy.deepcopy(FIVE)
    off[3]["sum_logprob"] = float(np.nextafter(np.float32(-4.5), np.float32(0)))
    failure, _ = _judge([FIVE], [off])
    assert failure is not None
    assert "candidate 3 (tokens identical): sum_logprob differs: oracle -4.5 vs in-tree " in failure.summary
    assert failure.summary.endswith("(1 float32 ULP apart)") and failure.details["ulp"] == 1
    assert _judge([FIVE], [off], sums=False)[0] is None  # a token-level check leaves the sums out


def test_an_in_tree_record_without_candidates_fails() -> None:
    failure, _ = _judge([FIVE], None)
    assert failure is not None and "the in-tree record has no finished candidates (the oracle finished 5)" in (
        failure.summary
    )


def test_an_oracle_without_candidates_is_said_so_never_silently_passed() -> None:
    failure, note = _judge(None, [FIVE])  # type: ignore[arg-type]
    assert failure is None and note == NOT_RECORDED


# -- through the session, on profile scenarios -------------------------------------------------


def _one_ulp_up(sums: mx.array) -> mx.array:
    """The first candidate's float32 sum one representable float towards zero."""
    values = np.array(sums, dtype=np.float32)
    values.flat[0] = np.nextafter(values.flat[0], np.float32(0))
    return mx.array(values)


@pytest.mark.slow
@pytest.mark.xdist_group("whisper-tiny-en")
def test_a_greedy_sum_one_ulp_off_fails_fallback_decisions_naming_the_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The greedy decoder's finalize hands over a sum one ULP off: every token and the chosen
    text stay the oracle's, and the candidates, judged before the decisions, fail first."""
    finalize = token_decoders.GreedyDecoder.finalize

    def nudged(self: token_decoders.GreedyDecoder, tokens: mx.array, sum_logprobs: mx.array):
        tokens, sums = finalize(self, tokens, sum_logprobs)
        return tokens, _one_ulp_up(sums)

    monkeypatch.setattr(token_decoders.GreedyDecoder, "finalize", nudged)  # unperturbed: make parity passes it
    session = ParitySession(selected_scenarios={"whisper-tiny-en": {"fox-greedy"}})
    profile = session.profile("whisper-tiny-en")
    result = session.run_check(profile, profile.scenario("fox-greedy"), "fallback_decisions")
    assert not result.passed, result.summary
    assert "decode call 0 (seek 0, attempt 0, T=0.0) candidate 0 (tokens identical): sum_logprob differs" in (
        result.summary
    )
    assert result.summary.endswith("(1 float32 ULP apart)"), result.summary


@pytest.mark.slow
@pytest.mark.xdist_group("whisper-tiny-en")
def test_beam_candidates_not_recorded_by_the_oracle_are_said_so_and_a_dropped_one_fails_the_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fox-beam5 against its openai-whisper golden: decode_tokens passes and says the finished
    candidates were not compared. The in-tree beam search records them (5 here); a finalize that
    drops the last finished sequence fails the judge against the unperturbed run, naming the
    decode call and the counts (a sum one ULP off: the greedy gate test above)."""
    model, sid = "whisper-tiny-en", "fox-beam5"
    session = ParitySession(selected_scenarios={model: {sid}})
    profile = session.profile(model)
    scenario = profile.scenario(sid)
    verdict = session.run_check(profile, scenario, "decode_tokens")
    assert verdict.passed and NOT_RECORDED in verdict.summary, verdict.summary
    reference = session.intree(profile, scenario, "free")
    (call,) = reference.extra["decode_calls"]
    assert len(call["candidates"]) == 5 and call["candidates"][0]["tokens"]

    finalize = token_decoders.BeamSearchDecoder.finalize

    def drop_last(self: token_decoders.BeamSearchDecoder, tokens: list, sum_logprobs: list):
        sequences, sums = finalize(self, tokens, sum_logprobs)
        return [s[:-1] for s in sequences], [s[:-1] for s in sums]

    monkeypatch.setattr(token_decoders.BeamSearchDecoder, "finalize", drop_last)
    dropped = ParitySession(selected_scenarios={model: {sid}}).intree(profile, scenario, "free")
    failure, _ = judge_candidates("decode_tokens", reference, dropped, sums=False)
    assert failure is not None, "a dropped finished sequence passed"
    assert failure.summary.startswith(
        "decode call 0 (seek 0, attempt 0, T=0.0): the oracle finished 5 candidates, the in-tree run 4"
    ), failure.summary
    assert failure.details["oracle"] == call["candidates"]
