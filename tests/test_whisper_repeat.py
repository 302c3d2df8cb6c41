"""The Whisper determinism repeat (issue 18): a speech scenario whose free run followed the
oracle's decode calls has its teacher-forced run as the repeat (one in-tree run saved); a free
run that left the golden's path is still repeated for real, and a drifting model is caught
either way.

Against the committed goldens of the whisper-large-v3-turbo mini twin (width 64: cheap).
"""

from __future__ import annotations

import copy

import mlx.core as mx
import pytest

from harness.errors import NonDeterministicError
from harness.repeat import forced_run_repeats_free
from harness.runners.whisper import WhisperRunner
from harness.session import ParitySession

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("whisper-large-v3-turbo-mini")]

MODEL = "whisper-large-v3-turbo-mini"
SCENARIO = "fox-detect-language"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The modes of the in-tree transcriptions run, in order."""
    seen: list[str] = []
    original = WhisperRunner.run

    def counted(self, spec, forced=None):
        record = original(self, spec, forced=forced)
        seen.append(record.mode)
        return record

    monkeypatch.setattr(WhisperRunner, "run", counted)
    return seen


def drifting(model) -> None:
    """Every decoder call adds a growing amount to one vocabulary entry's logit (far below the
    argmax): the tokens stay, the logits of two runs fed the same tokens differ."""
    cls = type(model.decoder)
    calls = [0]

    def call(self, tokens, audio_features, kv_cache=None):
        calls[0] += 1
        logits, cache, cross = cls.__call__(self, tokens, audio_features, kv_cache)
        return logits + mx.zeros(logits.shape[-1]).at[7].add(calls[0] * 1e-5), cache, cross

    model.decoder.__class__ = type("Drifting", (cls,), {"__call__": call})


def no_timestamp_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoding rule dropped: the free run leaves the golden's tokens (its logits stay exact)."""
    import models.whisper.logit_filters as logit_filters

    monkeypatch.setattr(logit_filters.ApplyTimestampRules, "apply", lambda self, logits, tokens: logits)


def judge(hook=None, check: str = "teacher_forced_logits"):
    session = ParitySession(model_hook=hook)
    profile = session.profile(MODEL)
    scenario = profile.scenario(SCENARIO)
    return session, session.run_check(profile, scenario, check)


def test_a_free_run_on_the_golden_path_is_repeated_by_the_teacher_forced_run(runs: list[str]) -> None:
    session, result = judge()
    assert result.passed, result.summary
    assert runs == ["free", "teacher_forced"]  # no third transcription
    profile = session.profile(MODEL)
    golden = session.golden(profile, profile.scenario(SCENARIO)).record
    free, forced = (session._records[(MODEL, SCENARIO, mode)] for mode in ("free", "teacher_forced"))
    assert forced_run_repeats_free(free, forced, golden)
    # Any decode call fed otherwise (another window, prompt or member tokens) is not a repeat.
    for key, value in (("seek", 1), ("initial_tokens", [0]), ("member_tokens", [[0]])):
        other = copy.deepcopy(free)
        other.extra["decode_calls"][0][key] = value
        assert not forced_run_repeats_free(other, forced, golden), key


def test_a_drifting_whisper_is_caught_by_the_teacher_forced_repeat(runs: list[str]) -> None:
    with pytest.raises(NonDeterministicError, match=rf"not deterministic on {MODEL}/{SCENARIO}: .*differ at step 0"):
        judge(drifting)
    assert runs == ["free", "teacher_forced"]


def test_a_free_run_off_the_golden_path_is_repeated_for_real(runs: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    no_timestamp_rules(monkeypatch)
    _, result = judge()
    assert result.passed, result.summary  # teacher-forced logits stay exact; only the tokens moved
    assert runs == ["free", "teacher_forced", "free"]
    runs.clear()
    with pytest.raises(NonDeterministicError, match=rf"not deterministic on {MODEL}/{SCENARIO}: .*differ at step 0"):
        judge(drifting)  # drifting and off the path: the real repeat catches it
    assert runs == ["free", "teacher_forced", "free"]
