"""compiled_decode over chat turns and in a chosen variant (issue 53: the compiled loop's
hand-back of a kept cache, compiled_kv.store_back, and the "blocks" variant were walked by no
gate while the check ran single-turn scenarios in the default variant only).

minicpm5-2b-mini's cache-reuse declares compiled_decode: each turn decoded by the compiled loop
on the one kept cache; smollm2-135m's chat sets `compiled_variant: blocks` (tests/test_e2e_parity.py
runs both against the mlx-lm goldens). A kept cache handed back with its last position blank,
and a blocks step attending without the position it just wrote, pass every eager check and fail
compiled_decode alone."""

from __future__ import annotations

import pytest

from harness.tools.mutant_faults_l2 import COMPILED_MUTANTS

MODEL = "minicpm5-2b-mini"


def _nightly(mutant) -> list:
    """smollm2-135m's real weights make a compiled fault cost over a minute here: make test's
    30-minute budget leaves those to make test-nightly (the mini twin's stay in make test)."""
    return [pytest.mark.nightly] if mutant.model == "smollm2-135m" else []


@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(m, marks=[pytest.mark.slow, pytest.mark.xdist_group(m.model), *_nightly(m)], id=m.name)
        for m in COMPILED_MUTANTS
    ],
)
def test_each_compiled_fault_fails_compiled_decode_alone(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    failed = {check for check, outcome in judged["outcomes"].items() if outcome != "passed"}
    assert failed == {"compiled_decode"}, judged["summaries"]


@pytest.mark.slow
@pytest.mark.xdist_group(MODEL)
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


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2-135m")
def test_the_session_runs_the_variant_the_scenario_picks() -> None:
    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile("smollm2-135m")
    picked = {s.id: s for s in profile.scenarios}
    assert picked["chat"].compiled_variant == "blocks" and picked["chat-stops-at-eos"].compiled_variant is None
    record = session.intree(profile, picked["chat"], "compiled")
    assert record.extra["compiled_variant"] == "blocks"
