"""Draft-model speculative decoding at L1 (issue 17 part 3): the `speculative` gate against
mlx-lm's speculative_generate_step, its goldens' always-accepted / always-rejected claims,
the gate failing on an acceptance rule off by one, and the profile keys' validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import models.universal.speculative as speculative
from harness.checks.speculative import verify_steps
from harness.errors import ProfileError
from harness.profile.load import load_profile
from harness.session import ParitySession

MINI = "minicpm5-2b-mini"


def _session(model: str, *scenario_ids: str) -> ParitySession:
    """A session that makes (or reads) only these scenarios' goldens."""
    return ParitySession(selected_scenarios={model: set(scenario_ids)})


def _scenario(session: ParitySession, model: str, scenario_id: str):
    profile = session.profile(model)
    return profile, profile.scenario(scenario_id)


def test_accepted_count_is_the_leading_agreement() -> None:
    assert speculative.accepted_count([1, 2, 3], [1, 2]) == 2
    assert speculative.accepted_count([1, 5, 3], [1, 2]) == 1
    assert speculative.accepted_count([4, 2, 3], [1, 2]) == 0


@pytest.mark.parametrize(
    ("model", "scenario_id", "expect"),
    [
        (MINI, "spec-twin-k2", "rejected"),
        (MINI, "spec-self-k5", "accepted"),
        ("smollm2-135m", "spec-self-k2", "accepted"),
        ("smollm2-135m", "spec-self-k5", "accepted"),
    ],
)
def test_the_draft_goldens_are_always_rejected_or_always_accepted(model: str, scenario_id: str, expect: str) -> None:
    """What the scenarios claim, read from the oracle's record (not assumed)."""
    session = _session(model, scenario_id)
    profile, scenario = _scenario(session, model, scenario_id)
    golden = session.golden(profile, scenario).record
    steps = verify_steps(golden)
    assert steps and sum(len(s["tokens"]) for s in steps) == len(golden.tokens) == profile.steps(scenario) + 1
    k = scenario.draft["num_draft_tokens"]
    assert all(1 <= s["drafted"] <= k for s in steps)
    if expect == "rejected":
        assert [s["accepted"] for s in steps] == [0] * len(steps), steps
    else:
        assert [s["accepted"] for s in steps] == [s["drafted"] for s in steps], steps
    rows = sum(s["drafted"] + 1 for s in steps)  # one target row per verified position
    verify = golden.arrays.get("verify_logits")
    if verify is None:  # a compact golden whose blob is not at hand: the full record has it
        verify = session.full_golden(profile, scenario).arrays["verify_logits"]
    assert verify.shape[0] == rows


def test_an_acceptance_rule_off_by_one_fails_the_speculative_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """One draft accepted too many (the always-rejected draft) and one too few (the
    always-accepted one): the gate fails naming the verify step and the accepted count."""
    ids = ("spec-twin-k2", "spec-self-k5")
    session = _session(MINI, *ids)
    for scenario_id in ids:
        profile, scenario = _scenario(session, MINI, scenario_id)
        assert session.run_check(profile, scenario, "speculative").passed
    rule = speculative.accepted_count
    cases = {
        "spec-twin-k2": lambda t, d: min(rule(t, d) + 1, len(d)),
        "spec-self-k5": lambda t, d: max(rule(t, d) - 1, 0),
    }
    for scenario_id, off_by_one in cases.items():
        session = _session(MINI, *ids)
        monkeypatch.setattr(speculative, "accepted_count", off_by_one)
        profile, scenario = _scenario(session, MINI, scenario_id)
        result = session.run_check(profile, scenario, "speculative")
        assert not result.passed, result.summary
        assert result.summary.startswith("verify step 0: accepted differs"), result.summary
        assert result.first_bad_step == 0


def _profile_with(tmp_path: Path, scenario: dict) -> Path:
    data = yaml.safe_load((Path(__file__).parents[1] / "profiles" / f"{MINI}.yaml").read_text())
    data["scenarios"] = [scenario]
    path = tmp_path / f"{MINI}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BASE = {"id": "s", "prompt": "hi", "checks": ["greedy_tokens", "speculative"]}


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        (
            BASE | {"draft": {"artifact": "target", "num_draft_tokens": 0}},
            r"draft.num_draft_tokens: expected an int >= 1",
        ),
        (BASE | {"draft": {"artifact": "x", "num_draft_tokens": 2}}, r"draft.artifact: expected 'target' or a pinned"),
        (BASE | {"draft": {"artifact": "target", "num_draft_tokens": 2, "k": 1}}, r"draft: unknown key\(s\) \['k'\]"),
        (
            BASE | {"draft": {"artifact": {"source": "hub", "repo": "a/b"}, "num_draft_tokens": 2}},
            r"draft.artifact.revision: required",
        ),
        (
            BASE
            | {
                "checks": ["teacher_forced_logits", "speculative"],
                "draft": {"artifact": "target", "num_draft_tokens": 2},
            },
            r"checks: a draft scenario names 'speculative' and only .*teacher_forced_logits",
        ),
        (
            BASE | {"checks": ["greedy_tokens"], "draft": {"artifact": "target", "num_draft_tokens": 2}},
            "speculative missing",
        ),
        (BASE, r"checks: speculative needs a 'draft' scenario"),
        (
            BASE | {"kv_bits": 4, "draft": {"artifact": "target", "num_draft_tokens": 2}},
            r"draft: \['kv_bits'\] are not options of the draft run",
        ),
    ],
)
def test_bad_draft_scenarios_are_profile_errors_naming_the_key(tmp_path: Path, scenario: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile(_profile_with(tmp_path, scenario))


def test_two_draft_runs_must_agree_on_every_verify_row_and_step() -> None:
    """The determinism self-check covers what only the draft record has (verify rows, steps)."""
    import numpy as np

    from harness.errors import NonDeterministicError
    from harness.records import ScenarioRecord
    from harness.session import check_deterministic

    def record(verify: np.ndarray, accepted: int) -> ScenarioRecord:
        info = [{"from_draft": False, "verify_step": 0, "drafted": 2, "accepted": accepted}]
        return ScenarioRecord(
            "s", None, [1], [2], np.zeros((1, 4), np.float32), [0],
            arrays={"verify_logits": verify}, extra={"step_info": info},
        )  # fmt: skip

    rows = np.zeros((3, 4), np.float32)
    check_deterministic("s", record(rows, 0), record(rows.copy(), 0))
    with pytest.raises(NonDeterministicError, match="verify rows or steps differ"):
        check_deterministic("s", record(rows, 0), record(rows, 1))
    with pytest.raises(NonDeterministicError, match="verify rows or steps differ"):
        check_deterministic("s", record(rows, 0), record(rows + np.float32(1e-30), 0))
