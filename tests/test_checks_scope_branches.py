"""Where checks apply (harness/checks/scope.py), through the profile loader: draft_stats only on an
n-gram drafting composition, streamed_transcript only on the reference path, each refusal naming
why; and the token budget's declared path (harness/checks/exercise_budget.py) counts only the
scenarios that give a budget."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.checks.exercise_budget import NEAR_TIE_DIFFERENCE, TOKEN_BUDGET
from harness.errors import ProfileError
from harness.profile.load import load_profile
from tests.conftest import VALID_PROFILE, write_profile
from tests.test_profile import SPEECH_PROFILE

NGRAM = "    composition: {kind: ngram_draft, num_draft_tokens: 4, ngram_min: 2, ngram_max: 2}\n"
FAST = "    composition: {kind: whisper-fast, budget: {max_differing_tokens: 0}}\n"


def _llama(root: Path, plain_extra: str) -> Path:
    text = VALID_PROFILE.format(name="tiny").replace('    prompt: "Hello"\n', f'    prompt: "Hello"\n{plain_extra}')
    return write_profile(root, text=text)


def test_draft_stats_on_a_scenario_that_does_not_draft_is_refused(isolated: Path) -> None:
    """A plain scenario naming draft_stats: a profile error naming the composition it needs."""
    with pytest.raises(ProfileError, match=r"\.checks: draft_stats needs a composition of kind 'ngram_draft'"):
        load_profile(_llama(isolated, "    checks: [greedy_tokens, draft_stats]\n"))


def test_draft_stats_on_an_ngram_drafting_scenario_loads(isolated: Path) -> None:
    """The contrast: the same check on an n-gram drafting composition is accepted."""
    profile = load_profile(_llama(isolated, NGRAM + "    checks: [greedy_tokens, draft_stats]\n"))
    assert profile.checks(profile.scenario("plain")) == ["greedy_tokens", "draft_stats"]


def test_streaming_a_composition_is_refused(isolated: Path) -> None:
    """streamed_transcript streams the reference path: named on a fast-path composition, an error."""
    extra = FAST + "    checks: [mel, token_budget, streamed_transcript]"
    with pytest.raises(ProfileError, match=r"\.checks: streamed_transcript streams the reference path"):
        load_profile(write_profile(isolated, text=SPEECH_PROFILE.format(extra=extra)))


def test_streaming_the_reference_path_loads(isolated: Path) -> None:
    """The contrast: the plain clip may name streamed_transcript."""
    extra = "    checks: [mel, streamed_transcript]"
    profile = load_profile(write_profile(isolated, text=SPEECH_PROFILE.format(extra=extra)))
    assert "streamed_transcript" in profile.checks(profile.scenario("fox"))


def _profile(*compositions: dict | None) -> SimpleNamespace:
    """Scenarios naming token_budget, each with the composition given (budget or not)."""
    scenarios = [SimpleNamespace(id=f"s{i}", composition=c) for i, c in enumerate(compositions)]
    return SimpleNamespace(scenarios=scenarios, checks=lambda s: ["mel", "token_budget"])


def test_a_token_budget_scenario_without_a_budget_declares_nothing() -> None:
    """A scenario without `max_differing_tokens` is passed over: alone it declares no path, and
    it does not hide the budget of another scenario that admits a differing token."""
    unbudgeted = {"kind": "whisper-fast", "budget": {}}
    assert TOKEN_BUDGET.declared(_profile(unbudgeted, None)) == []
    budgeted = {"kind": "whisper-fast", "budget": {"max_differing_tokens": 1}}
    assert TOKEN_BUDGET.declared(_profile(unbudgeted, budgeted)) == [NEAR_TIE_DIFFERENCE]
