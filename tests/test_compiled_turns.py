"""compiled_decode over chat turns (issue 53: the compiled loop's hand-back of a kept cache,
compiled_kv.store_back, was walked by no gate while the check ran single-turn scenarios only).

minicpm5-2b-mini's cache-reuse declares compiled_decode: each turn decoded by the compiled loop
on the one kept cache (tests/test_e2e_parity.py runs it against the mlx-lm goldens). A kept
cache handed back with its last position blank passes every eager check and fails
compiled_decode alone."""

from __future__ import annotations

import pytest

from harness.tools.mutant_faults_l2 import COMPILED_TURN_MUTANTS

MODEL = "minicpm5-2b-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


@pytest.mark.parametrize("mutant", COMPILED_TURN_MUTANTS, ids=lambda m: m.name)
def test_a_kept_cache_handed_back_wrong_fails_compiled_decode_alone(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    failed = {check for check, outcome in judged["outcomes"].items() if outcome != "passed"}
    assert failed == {"compiled_decode"}, judged["summaries"]


def test_the_compiled_turns_record_says_which_variant_ran() -> None:
    from harness.goldens.specs import runnable_spec
    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile(MODEL)
    scenario = next(s for s in profile.scenarios if s.id == "cache-reuse")
    assert "compiled_decode" in profile.checks(scenario)
    runner = session.runner(profile)
    record = runner.run(runnable_spec(profile.scenario_spec(scenario)), decode="compiled")
    assert record.extra["compiled_variant"] in ("split", "whole")
    assert len(record.extra["turns"]) == 2 and len(record.tokens) == 2 * (profile.steps(scenario) + 1)
