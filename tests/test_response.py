"""The `response` check (issue 17): the in-tree reasoning / content / tool_calls split against
mlx-lm's server, judged on the minicpm5-2b-mini goldens (every expected value is the oracle's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.errors import ProfileError
from harness.profile.load import load_profile
from harness.session import ParitySession

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minicpm5-2b-mini")]

MODEL, SCENARIO = "minicpm5-2b-mini", "response-split"


def session_of() -> ParitySession:
    return ParitySession(selected_scenarios={MODEL: {SCENARIO}})  # only this scenario's golden is read


def judge(session: ParitySession):
    profile = session.profile(MODEL)
    return session.run_check(profile, profile.scenario(SCENARIO), "response")


def test_response_fails_on_a_parser_that_reads_a_number_as_a_string(monkeypatch: pytest.MonkeyPatch) -> None:
    from models.universal import tool_calls

    readers = tuple((names, str if "number" in names else read) for names, read in tool_calls._READERS)
    monkeypatch.setattr(tool_calls, "_READERS", readers)
    result = judge(session_of())
    assert not result.passed
    # The only number-typed value is book_table's budget, in the typed-parameters text.
    assert "forced 'typed-parameters': streamed chunk" in result.summary, result.summary
    assert '"budget": 12.5' in result.summary and '"budget": "12.5"' in result.summary, result.summary
    assert result.details["sequence"] == "typed-parameters"


def test_response_fails_when_a_forced_text_encodes_differently() -> None:
    session = session_of()
    profile = session.profile(MODEL)
    spec = profile.scenario_spec(profile.scenario(SCENARIO))
    forced = [dict(f) for f in spec["response"]["forced"]]
    forced[1]["text"] = forced[1]["text"].replace("mild", "mild!")
    session.intree_spec_edits[(MODEL, SCENARIO)] = {"response": {"forced": forced}}
    result = judge(session)
    assert not result.passed
    assert "forced 'think-then-answer': the text" in result.summary and "encodes to" in result.summary, result.summary


def test_the_response_key_and_check_go_together(tmp_path: Path) -> None:
    source = Path(__file__).resolve().parents[1] / "profiles" / f"{MODEL}.yaml"
    text = source.read_text()
    without_check = text.replace("checks: [prompt_identity, teacher_forced_logits, response]", "steps: 8", 1)
    without_check = re.sub(r'\n    exercises: \["response: [^\n]*', "", without_check, count=1)  # its claims go too
    path = tmp_path / f"{MODEL}.yaml"
    path.write_text(without_check.replace("    steps: 8\n    steps: 8\n", "    steps: 8\n", 1))
    with pytest.raises(ProfileError, match="response check needs the scenario's 'response:' key"):
        load_profile(path)
    bad_forced = text.replace("- id: think-never-closes", "- id: Think", 1)
    path.write_text(bad_forced)
    with pytest.raises(ProfileError, match=r"response\.forced\[0\]\.id: expected lowercase"):
        load_profile(path)
