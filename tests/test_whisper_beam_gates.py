"""The token-level gates `decode_tokens` and `transcript_text` fail on a perturbed in-tree beam
search, judged as `make parity` judges them: `ParitySession.run_check` against the tracked
openai-whisper golden of whisper-tiny-en/fox-beam5 (compact: decided by its tokens and JSON; the
oracle's full vectors, which explain a differing token, come from the cache or are regenerated
by the openai-whisper venv).

Each fault is one plausible beam-search bug in models/whisper (token_decoders.py, inference.py), injected by a
monkeypatch as `make mutants` injects its faults (harness/tools/mutant_faults.py). The
unperturbed implementation passes both checks on this golden (`make parity`, and
tests/test_whisper_beam.py's end-to-end comparison with the oracle run here).
"""

from __future__ import annotations

import pytest

from harness.checks.compare import CheckResult
from harness.records import ScenarioRecord
from harness.session import ParitySession
from models.whisper import inference, token_decoders

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("whisper-tiny-en")]

MODEL, SCENARIO = "whisper-tiny-en", "fox-beam5"
CHECKS = ("decode_tokens", "transcript_text")


def judge() -> tuple[dict[str, CheckResult], ScenarioRecord, ScenarioRecord]:
    """(each check's verdict, the golden, the in-tree free run) in a fresh session."""
    session = ParitySession(selected_scenarios={MODEL: {SCENARIO}})  # only this scenario's golden is read
    profile = session.profile(MODEL)
    scenario = profile.scenario(SCENARIO)
    results = {check: session.run_check(profile, scenario, check) for check in CHECKS}
    return results, session.golden(profile, scenario).record, session.intree(profile, scenario, "free")


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
def test_a_beam_ranking_that_picks_the_worst_finished_sequence_fails_both_token_gates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The final ranking reversed (the lowest length-normalized log-probability wins, an argmin
    for the argmax): the search itself is untouched, every beam row at every step is the
    oracle's, yet the decode call returns another finished sequence, and the transcript
    (its last timestamp) differs."""
    rank = token_decoders.MaximumLikelihoodRanker.rank

    def worst_first(self: token_decoders.MaximumLikelihoodRanker, tokens: list, sum_logprobs: list) -> list[int]:
        return rank(self, tokens, [[-lp for lp in group] for group in sum_logprobs])  # score -> -score

    monkeypatch.setattr(token_decoders.MaximumLikelihoodRanker, "rank", worst_first)
    results, golden, free = judge()
    assert free.tokens == golden.tokens  # the beam rows: the fault is in the ranking alone
    tokens, transcript = results["decode_tokens"], results["transcript_text"]
    assert not tokens.passed, tokens.summary
    assert "decode calls' chosen tokens differs at [0].tokens[" in tokens.summary, tokens.summary
    assert not transcript.passed, transcript.summary
    assert "transcript (text, tokens, timestamps" in transcript.summary, transcript.summary


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
def test_beam_rows_whose_cache_is_not_reordered_fail_decode_tokens_at_the_first_wrong_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The self-attention cache rows not gathered after a step's ranking: a row continues
    another row's history. The first row token that differs fails `decode_tokens` mid-run (a
    wrong token, not a shorter run); the transcript survives on this clip (the beams converge
    on the same text), so only the row-by-row comparison catches this fault here."""
    monkeypatch.setattr(inference.Inference, "reorder", lambda self, rows: None)
    results, golden, free = judge()
    tokens = results["decode_tokens"]
    assert not tokens.passed, tokens.summary
    step = tokens.first_bad_step
    assert step is not None and 0 < step < min(len(golden.tokens), len(free.tokens)), tokens.summary
    assert free.tokens[:step] == golden.tokens[:step] and free.tokens[step] != golden.tokens[step]
    assert tokens.details["intree_token"] == free.tokens[step]
    assert f"token trajectories diverge at step {step}" in tokens.summary, tokens.summary
    assert results["transcript_text"].passed, results["transcript_text"].summary
