"""What a failing run costs: the oracle regenerates a scenario's full vectors once, and after
the first regeneration the other scenarios' in one process beside the in-tree side; a scenario
is localized once, however many checks fail in it and at whichever later steps."""

from __future__ import annotations

import concurrent.futures
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.checks.localize import Localization
from harness.records import ScenarioRecord
from harness.session import ParitySession
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import FakeOracle, fake_session

# ids of distinct lengths: the fake oracle seeds by it
THREE = VALID_PROFILE.format(name="tiny").split("scenarios:")[0] + textwrap.dedent(
    """\
    scenarios:
      - {id: a, prompt: "Hello", steps: 3}
      - {id: bb, prompt: "Hello there", steps: 3}
      - {id: ccc, prompt: "Hello again", steps: 3}
    """
)


class _Nudged:
    """The fake oracle's records with one logit of row 1 nudged by one ULP (every scenario)."""

    def run(self, spec, forced=None) -> ScenarioRecord:
        record = FakeOracle.records([spec])[spec["id"]]
        record.logits[1, 3] = np.nextafter(record.logits[1, 3], np.float32(np.inf))
        record.mode = "teacher_forced" if forced is not None else "free"
        return record


def _session(root: Path, overlap: bool) -> ParitySession:
    session = fake_session(root)
    session._runners["tiny"] = _Nudged()
    session.lifecycle.overlap_generation = lambda: overlap
    return session


@pytest.mark.parametrize("overlap", [True, False])
def test_full_vectors_are_regenerated_once_per_scenario_and_ahead_beside(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")  # fake models have no module taps
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this test may itself run on a worker
    monkeypatch.setattr("harness.goldens.specs.os.cpu_count", lambda: 2)
    write_profile(isolated, text=THREE)
    fake_session(isolated).goldens(fake_session(isolated).profile("tiny"))  # compact goldens, as tracked
    shutil.rmtree(isolated / "cache" / "blobs")  # a fresh clone: no full vectors here
    counter = isolated / "oracle-runs"
    monkeypatch.setattr(FakeOracle, "counter", counter)
    session = _session(isolated, overlap)
    profile = session.profile("tiny")
    runs = []
    for scenario in profile.scenarios:
        for check in ("decode_logits", "teacher_forced_logits"):
            result = session.run_check(profile, scenario, check)
            assert not result.passed and result.first_bad_step == 1, result.summary
            concurrent.futures.wait(session.lifecycle.full.pending.values())
            runs.append(counter.read_text().count("\n"))
    # Once per scenario. With overlap the first failure starts the others' beside the in-tree
    # side, so they are ready before their checks run; without, each waits for its own.
    assert runs == ([3] * 6 if overlap else [1, 1, 2, 2, 3, 3])


def test_a_scenario_is_localized_once_for_its_earliest_failing_step(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    profile = session.profile("tiny")
    calls: list[tuple[str, int]] = []

    def localize(profile, scenario, row):
        calls.append((scenario.id, row))
        return Localization(row, "model.layers.0.mlp", None, 3)

    monkeypatch.setattr(session, "_localize", localize)
    plain, chat = profile.scenario("plain"), profile.scenario("chat")
    assert session.localize(profile, plain, 3).row == 3
    assert session.localize(profile, plain, 5).row == 3  # a later step: the scenario's earliest explains it
    assert session.localize(profile, plain, 3).row == 3
    assert calls == [("plain", 3)]
    assert session.localize(profile, plain, 1).row == 1  # an earlier step is localized anew
    assert session.localize(profile, chat, 5).row == 5  # another scenario is its own
    assert calls == [("plain", 3), ("plain", 1), ("chat", 5)]
