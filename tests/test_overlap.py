"""Oracle generation beside the in-tree side (issue 18 part 3).

When a profile's goldens are absent, the oracle generates them in its own process while the
session runs the in-tree free runs (they need no golden). The verdicts, the number of in-tree
runs and the golden files are those of a serial run; only the order in time changes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import timing
from harness.errors import GoldenError
from harness.records import ScenarioRecord
from tests.conftest import write_profile
from tests.fakes import FakeOracle, fake_session

ORACLE_SECONDS = 1.0


class _TimedRunner:
    """Replays the fake oracle (so checks pass) and notes when each run started."""

    def __init__(self, fail: str | None = None):
        self.runs: list[tuple[str, str, float]] = []  # (scenario, mode, start)
        self.fail = fail

    def run(self, spec, forced=None) -> ScenarioRecord:
        mode = "teacher_forced" if forced is not None else "free"
        self.runs.append((spec["id"], mode, time.perf_counter()))
        if spec["id"] == self.fail:
            raise RuntimeError(f"in-tree crash on {spec['id']}")
        record = FakeOracle.records([spec])[spec["id"]]  # the generator's thread reads FakeOracle's delay
        record.mode = mode
        return record


def _session(root: Path, runner: _TimedRunner, overlap: bool):
    session = fake_session(root)
    session.overlap_generation = overlap
    session._runners["tiny"] = runner
    return session


def _judge_all(session) -> dict[tuple[str, str], bool]:
    profile = session.profile("tiny")
    out = {}
    for scenario in profile.scenarios:
        for check in ("decode_logits", "teacher_forced_logits"):
            out[(scenario.id, check)] = session.run_check(profile, scenario, check).passed
    return out


@pytest.fixture
def slow_oracle(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")
    monkeypatch.setattr(FakeOracle, "delay", ORACLE_SECONDS)
    monkeypatch.setattr(FakeOracle, "counter", isolated / "oracle-runs")
    monkeypatch.setattr("harness.goldens.specs.os.cpu_count", lambda: 2)
    write_profile(isolated)
    return isolated


def test_free_runs_are_made_while_the_oracle_generates(slow_oracle: Path) -> None:
    runner = _TimedRunner()
    session = _session(slow_oracle, runner, overlap=True)
    timing.clock.reset()
    started = time.perf_counter()
    verdicts = _judge_all(session)
    assert all(verdicts.values()), verdicts
    assert len((slow_oracle / "oracle-runs").read_text().splitlines()) == 1  # one generator run, as serially
    free = [(s, t - started) for s, mode, t in runner.runs if mode == "free"]
    forced = [(s, t - started) for s, mode, t in runner.runs if mode == "teacher_forced"]
    # Both free runs started while the generator slept; each scenario ran free once (the
    # prefetched run was used, not repeated) and teacher-forced once, after the goldens.
    assert sorted(s for s, _ in free) == ["chat", "plain"] and all(t < ORACLE_SECONDS for _, t in free), free
    assert sorted(s for s, _ in forced) == ["chat", "plain"] and all(t >= ORACLE_SECONDS for _, t in forced), forced
    assert not session._prefetched  # every prefetched run was used
    seconds = timing.clock.totals()
    assert timing.clock.calls["in-tree free"] == 2
    # The wait for the generator is charged to the oracle; the thread's own phases are not.
    assert 0 < seconds["oracle mlx-lm"] <= ORACLE_SECONDS + 0.5
    # The generator's own time is kept beside the rows, and the breakdown says both.
    assert timing.clock.beside["oracle mlx-lm"] >= ORACLE_SECONDS
    out = timing.breakdown(seconds, timing.clock.calls, timing.clock.wall(), beside=timing.clock.beside)
    assert out["beside_seconds"]["oracle mlx-lm"] >= ORACLE_SECONDS
    assert any("oracle mlx-lm ran" in line and "was waited for" in line for line in timing.format_breakdown(out))


def test_without_overlap_the_oracle_runs_first(slow_oracle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for overlap, env in ((False, "1"), (True, "0")):  # the session does not ask, or the user turned it off
        monkeypatch.setenv("MLX_PARITY_OVERLAP", env)
        for path in (slow_oracle / "goldens").rglob("*.json"):
            path.unlink()
        runner = _TimedRunner()
        session = _session(slow_oracle, runner, overlap=overlap)
        started = time.perf_counter()
        assert all(_judge_all(session).values())
        assert all(t - started >= ORACLE_SECONDS for _, _, t in runner.runs), (overlap, env, runner.runs)


def test_one_machine_core_means_no_overlap(slow_oracle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.goldens.specs import overlap_enabled

    assert overlap_enabled(True)
    monkeypatch.setattr("harness.goldens.specs.os.cpu_count", lambda: 1)
    monkeypatch.setattr("harness.goldens.specs.device_facts", lambda: type("F", (), {"backend": "cpu"})())
    assert not overlap_enabled(True)
    monkeypatch.setattr("harness.goldens.specs.device_facts", lambda: type("F", (), {"backend": "cuda"})())
    assert overlap_enabled(True) and not overlap_enabled(False)


def test_a_crash_while_prefetching_is_reported_by_the_check(slow_oracle: Path) -> None:
    runner = _TimedRunner(fail="plain")
    session = _session(slow_oracle, runner, overlap=True)
    profile = session.profile("tiny")
    with pytest.raises(RuntimeError, match="in-tree crash on plain"):
        session.run_check(profile, profile.scenario("plain"), "decode_logits")
    # The generator finished all the same: the other scenario is judged against its golden.
    assert session.run_check(profile, profile.scenario("chat"), "decode_logits").passed
    assert [s for s, mode, _ in runner.runs if mode == "free"].count("plain") == 2  # prefetch, then the check


def test_a_failing_generator_fails_the_goldens_once(slow_oracle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self, model_dir, specs):
        time.sleep(0.3)
        raise OSError("No space left on device")

    monkeypatch.setattr(FakeOracle, "run", broken)
    runner = _TimedRunner()
    session = _session(slow_oracle, runner, overlap=True)
    profile = session.profile("tiny")
    for scenario in ("plain", "chat"):
        with pytest.raises(GoldenError, match="No space left on device"):
            session.run_check(profile, profile.scenario(scenario), "decode_logits")
    assert not list((slow_oracle / "goldens").rglob("*.json"))  # nothing written
