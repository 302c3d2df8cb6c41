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
    scenario = profile.scenario(scenario_id)
    golden = session.golden(profile, scenario).record
    return sorted(registry.get(check).exercises.walked(golden, profile.scenario_spec(scenario), {}))


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


@pytest.mark.parametrize(
    ("scenario_id", "walked"),
    [("rotating-kv-chunked", ["multi-token write into a full ring"]), ("rotating-kv", []), ("think-off", [])],
)
def test_a_full_ring_write_is_read_from_the_prompt_and_its_chunks(scenario_id: str, walked: list[str]) -> None:
    assert _walked(MINI, scenario_id, "decode_logits") == walked


@pytest.mark.parametrize(
    ("prompt", "window", "step", "walked"),
    [
        (32, 24, 8, True),  # chunks 8, 8, 8, 7: the fourth arrives when 24 are held
        (32, 24, 2048, False),  # one chunk of 31: the first write, no trim
        (25, 24, 8, False),  # chunks 8, 8, 8: full only after the last
        (27, 24, 8, True),  # chunks 8, 8, 8, 2: two tokens arrive when 24 are held
        (26, 24, 8, False),  # chunks 8, 8, 8, 1: only one token arrives when full
        (32, 24, 1, False),  # one token at a time: never several at once
    ],
)
def test_full_ring_write_chunk_arithmetic(prompt: int, window: int, step: int, walked: bool) -> None:
    from harness.checks.exercise import DECODE_LOGITS

    spec = {"max_kv_size": window, "prefill_step_size": step}
    assert bool(DECODE_LOGITS.walked(_record([0] * 3, prompt_ids=list(range(prompt))), spec, {})) is walked


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


def test_a_full_ring_trim_off_by_one_is_caught_only_where_a_chunk_meets_a_full_ring() -> None:
    """The audit's other missed cache fault: rotating-kv prefills in one chunk and never takes
    the path; rotating-kv-chunked, built for it, fails it."""
    from harness.tools.mutant_list import MUTANTS
    from harness.tools.mutants import judge

    mutant = next(m for m in MUTANTS if m.name == "rotating-trim")
    judged = judge(mutant)
    assert judged["killed"] and judged["outcomes"]["decode_logits"] in ("failed", "error"), judged["summaries"]
    blind = judge(dataclasses.replace(mutant, scenario="rotating-kv"))
    assert not blind["killed"] and blind["equivalent"], blind["summaries"]


def _record(tokens: list[int], prompt_ids: list[int] | None = None):
    import numpy as np

    from harness.records import ScenarioRecord

    return ScenarioRecord("s", None, prompt_ids or [1], tokens, np.zeros((len(tokens), 4), np.float32), [3])


def _result(summary: str):
    from harness.checks.compare import CheckResult

    return CheckResult("eos_stop", True, summary)


class _PROFILE:  # a profile named "m" whose scenarios' specs hold nothing the paths read
    name = "m"

    @staticmethod
    def scenario_spec(scenario) -> dict:
        return {}


def test_a_scenario_that_exists_for_a_path_and_does_not_walk_it_is_an_error() -> None:
    from harness.checks.exercise import EOS_STOP, walked_paths
    from harness.errors import NothingComparedError
    from harness.profile import Scenario

    scenario = Scenario(id="stops", prompt="x", exercises=["eos_stop: stops on an EOS id"])
    walked = walked_paths(_PROFILE, scenario, "eos_stop", EOS_STOP, _record([1, 3]), _result("ok"))
    assert walked == ["stops on EOS 3", "stops on an EOS id"]
    with pytest.raises(NothingComparedError, match=r"m/stops exists to walk eos_stop's \['stops on an EOS id'\]"):
        walked_paths(_PROFILE, scenario, "eos_stop", EOS_STOP, _record([1, 2]), _result("EOS ids [3] identical"))
    plain = Scenario(id="plain", prompt="x")  # a scenario that claims nothing: its walk is only counted
    assert walked_paths(_PROFILE, plain, "eos_stop", EOS_STOP, _record([1, 2]), _result("ok")) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("eos_stop: stops on EOS 7", r"eos_stop declares no path 'stops on EOS 7' here; its paths: \['stops on EOS 1'"),
        (
            "speculative: partial acceptance",
            r"expected 'check: path' with a check of the scenario among \['decode_logits', 'eos_stop', 'detokenize'\]",
        ),
        ("stops on EOS 1", r"expected 'check: path'"),
    ],
)
def test_a_scenarios_exercises_name_a_declared_path_of_one_of_its_checks(tmp_path, entry: str, message: str) -> None:
    import yaml

    from harness.errors import ProfileError
    from harness.paths import REPO_ROOT
    from harness.profile.load import load_profile

    data = yaml.safe_load((REPO_ROOT / "profiles" / f"{MINI}.yaml").read_text())
    eos = next(s for s in data["scenarios"] if s["id"] == "eos-s-stops")
    eos["exercises"] = [entry]
    path = tmp_path / f"{MINI}.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)
