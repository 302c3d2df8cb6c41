"""The L2 rotating quantized KV cache's chunked writes and growth are gated (issue 53: branch
coverage showed l2-rotating-quantized-kv, one prefill write of a prompt longer than the window,
never made a multi-token write after the first nor grew the ring after a short prompt).

Each fault of harness/tools/mutant_faults_l2.py passes l2-rotating-quantized-kv, the scenario
that was there, and is killed by the scenario added for its path; make test's e2e run
(tests/test_e2e_parity.py) holds both scenarios passing against mlx-optiq."""

from __future__ import annotations

import dataclasses

import pytest

from harness.tools.mutant_faults_l2 import L2_CACHE_MUTANTS

MODEL = "minicpm5-2b-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


@pytest.mark.parametrize("mutant", L2_CACHE_MUTANTS, ids=lambda m: m.name)
def test_each_fault_passes_the_old_scenario_and_is_killed_on_its_own(mutant) -> None:
    from harness.tools.mutants import judge

    old = judge(dataclasses.replace(mutant, scenario="l2-rotating-quantized-kv"))
    assert not old["killed"] and set(old["outcomes"].values()) == {"passed"}, old["summaries"]
    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    assert judged["outcomes"]["decode_logits"] == "failed", judged["summaries"]
