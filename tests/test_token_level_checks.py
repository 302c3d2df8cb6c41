"""The token-level checks judged against a foreign oracle (openai-whisper on PyTorch)."""

from __future__ import annotations

import numpy as np

from harness.records import ScenarioRecord


def _speech_record(tokens: list[int], text: str, avg_logprob: float) -> ScenarioRecord:
    call = {"seek": 0, "temperature": 0.0, "n_steps": len(tokens), "batch": 1, "row_offset": 0}
    call |= {"tokens": tokens, "text": text, "avg_logprob": avg_logprob}
    segment = {"start": 0.0, "end": 1.0, "text": text, "tokens": tokens, "avg_logprob": avg_logprob}
    return ScenarioRecord(
        "beam",
        None,
        [],
        tokens,
        np.zeros((len(tokens), 4), np.float32),
        [3],
        extra={"decode_calls": [call], "transcript": {"text": text, "segments": [segment]}},
    )


def test_token_level_checks_ignore_foreign_floats_and_catch_token_and_text_changes() -> None:
    from harness.checks.registry import CHECKS

    golden = _speech_record([1, 2, 3], " a b", -0.25)
    # Another framework's log-probabilities differ in their last bits: not judged at token level.
    same = _speech_record([1, 2, 3], " a b", -0.2500001)
    for check in ("decode_tokens", "transcript_text"):
        assert CHECKS[check].compare(golden, same).passed
    flipped = _speech_record([1, 0, 3], " a b", -0.25)
    result = CHECKS["decode_tokens"].compare(golden, flipped)
    assert not result.passed and result.first_bad_step == 1, result.summary
    retexted = _speech_record([1, 2, 3], " a c", -0.25)
    assert not CHECKS["decode_tokens"].compare(golden, retexted).passed  # a decode call's text
    result = CHECKS["transcript_text"].compare(golden, retexted)
    assert not result.passed and "text" in result.summary, result.summary


def _beam_record(tokens: list[int], logits: np.ndarray) -> ScenarioRecord:
    """One decode call of two beam members over two steps, rows interleaved step-major."""
    call = {"seek": 0, "temperature": 0.0, "n_steps": 2, "batch": 2, "row_offset": 0, "tokens": tokens[:2]}
    return ScenarioRecord("beam", None, [], tokens, logits, [3], extra={"decode_calls": [call]})


def test_a_beam_rows_token_is_not_explained_by_that_rows_logits_alone() -> None:
    """Beam search ranks whole sequences by their summed log-probabilities: a member's token
    may be below another token on its own row. A differing beam row is said to be one, never
    blamed on "a logit filter, forcing or sampling" nor classified as a near-tie of its row."""
    from harness.checks.tokens import compare_tokens

    logits = np.array([[0.0, 2.0, 1.0, 0.0]] * 4, np.float32)
    golden = _beam_record([1, 2, 2, 1], logits)  # row 1 (member 1 of step 0) took token 2, below token 1
    flipped = _beam_record([1, 1, 2, 1], logits)
    result = compare_tokens("decode_tokens", golden, flipped)
    assert not result.passed and result.first_bad_step == 1
    assert "decode call 0 step 0 member 1" in result.summary, result.summary
    assert "beam" in result.summary and "logit filter" not in result.summary, result.summary
    assert result.details["flip"]["near_tie"] is False
    # A row of one member (greedy) keeps the row-level explanation.
    single = {"seek": 0, "temperature": 0.0, "n_steps": 4, "batch": 1, "row_offset": 0, "tokens": [1, 2, 2, 1]}
    greedy = ScenarioRecord("g", None, [], [1, 2, 2, 1], logits, [3], extra={"decode_calls": [single]})
    other = ScenarioRecord("g", None, [], [1, 1, 2, 1], logits, [3], extra={"decode_calls": [single]})
    assert "logit filter" in compare_tokens("decode_tokens", greedy, other).summary
