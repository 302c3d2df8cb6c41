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
        assert CHECKS[check].judge(golden, same).passed
    flipped = _speech_record([1, 0, 3], " a b", -0.25)
    result = CHECKS["decode_tokens"].judge(golden, flipped)
    assert not result.passed and result.first_bad_step == 1, result.summary
    retexted = _speech_record([1, 2, 3], " a c", -0.25)
    assert not CHECKS["decode_tokens"].judge(golden, retexted).passed  # a decode call's text
    result = CHECKS["transcript_text"].judge(golden, retexted)
    assert not result.passed and "text" in result.summary, result.summary
