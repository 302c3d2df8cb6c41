"""Every check proves it exercised what it names (issue 31 part 1): the paths a check declares,
read from the oracle's records of the CI profiles' scenarios, and a fault on a path that only a
scenario built for it walks, caught there and passed everywhere else.

The profile-level judgement (an ERROR row "nothing exercised", the coverage lines) is tested
through the command line in tests/test_verdicts.py."""

from __future__ import annotations

import dataclasses

import pytest

from harness.checks import registry
from harness.coverage import judge_coverage
from harness.report import ItemResult
from harness.session import ParitySession

MINI = "minicpm5-2b-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MINI)]


def _walked(model: str, scenario_id: str, check: str) -> list[str]:
    session = ParitySession(selected_scenarios={model: {scenario_id}})
    profile = session.profile(model)
    golden = session.golden(profile, profile.scenario(scenario_id)).record
    return sorted(registry.get(check).exercises.walked(golden))


@pytest.mark.parametrize(
    ("model", "scenario_id", "walked"),
    [
        (MINI, "spec-requant-k3", ["partial acceptance"]),  # built for it
        (MINI, "spec-twin-k2", []),  # every draft rejected
        (MINI, "spec-self-k5", []),  # every draft accepted
        ("smollm2-135m", "spec-requant-k2", ["partial acceptance"]),
    ],
)
def test_speculative_partial_acceptance_is_read_from_the_oracles_steps(model, scenario_id, walked) -> None:
    assert _walked(model, scenario_id, "speculative") == walked


@pytest.mark.parametrize(
    ("scenario_id", "walked"),
    [
        ("eos-im-end", ["stops on EOS 130073", "stops on an EOS id"]),
        ("eos-s-stops", ["stops on EOS 1", "stops on an EOS id"]),
        ("think-off", []),
    ],
)
def test_eos_stop_paths_name_the_id_the_oracle_stopped_on(scenario_id: str, walked: list[str]) -> None:
    assert _walked(MINI, scenario_id, "eos_stop") == walked


def test_coverage_is_judged_over_the_profile_not_one_scenario() -> None:
    profile = ParitySession().profile(MINI)

    def row(scenario: str, check: str, walked: list[str] | None) -> ItemResult:
        details = {} if walked is None else {"walked": walked}
        return ItemResult(MINI, scenario, check, "L1", "mlx-lm", "passed", "", details=details)

    naming = [s.id for s in profile.scenarios if "speculative" in profile.checks(s)]
    partial = [row(s, "speculative", ["partial acceptance"] if s == "spec-requant-k3" else []) for s in naming]
    (spec,) = [c for c in judge_coverage([profile], partial, "cpu") if c.check == "speculative"]
    assert spec.row is None and spec.line == f"exercise {MINI} speculative: partial acceptance: spec-requant-k3"
    none = [row(s, "speculative", []) for s in naming]
    (spec,) = [c for c in judge_coverage([profile], none, "cpu") if c.check == "speculative"]
    assert spec.row is not None and spec.row.outcome == "error" and spec.row.scenario == "(profile)"
    assert spec.row.summary.startswith(f"nothing exercised: no scenario of {MINI} walked 'partial acceptance'")
    crashed = none[:-1] + [row(naming[-1], "speculative", None)]  # a row without facts: not judged
    (spec,) = [c for c in judge_coverage([profile], crashed, "cpu") if c.check == "speculative"]
    assert spec.row is None and "not judged: 1 scenario(s) not run or without a result" in spec.line


def test_a_draft_rewind_that_ignores_a_partial_acceptance_is_caught_only_where_one_happens() -> None:
    """The audit's missed fault: right when every draft is accepted or every one rejected, so
    spec-twin-k2 and spec-self-k5 cannot see it; spec-requant-k3, built for the path, fails it."""
    from harness.tools.mutant_list import MUTANTS
    from harness.tools.mutants import judge

    mutant = next(m for m in MUTANTS if m.name == "draft-rewind")
    judged = judge(mutant)
    assert judged["killed"] and judged["outcomes"]["speculative"] == "failed", judged["summaries"]
    blind = judge(dataclasses.replace(mutant, scenario="spec-twin-k2"))  # every draft rejected: no effect
    assert not blind["killed"] and blind["equivalent"], blind["summaries"]
