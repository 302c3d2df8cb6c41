"""The pytest face of a profile: a profile file collects one item per scenario and check (a VAD
profile: per fixture and check), and each item asks the session for its verdict."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest

from harness.checks.compare import CheckResult
from harness.checks.vad import vad_checks
from harness.errors import HarnessError
from harness.profile import Profile, Scenario
from harness.profile.load import load_profile
from harness.profile.vad import VAD_TIER, VadProfile, load_vad_profile
from harness.provenance import device_facts
from harness.report import ItemResult, peak_rss_mb
from harness.session import ParitySession
from harness.timing import clock, delta
from harness.vad_session import VadRun

_SESSION_KEY = pytest.StashKey[ParitySession]()

_VAD_KEY = pytest.StashKey[dict[str, VadRun]]()

MAX_RERUN_FLAKY = 10  # each rerun makes the scenario's in-tree runs anew: more is no flake hunt but a soak


def _rerun_count(text: str) -> int:
    """`--rerun-flaky`'s value: 0 (off) to MAX_RERUN_FLAKY, else argparse's usage error naming
    the option, before any check runs (issue 51 L23: -1 and 999999 were taken)."""
    try:
        count = int(text)
    except ValueError:
        count = None
    if count is None or not 0 <= count <= MAX_RERUN_FLAKY:
        raise argparse.ArgumentTypeError(f"expected 0 (off) to {MAX_RERUN_FLAKY} reruns, got {text}")
    return count


def _session(config: pytest.Config) -> ParitySession:
    if _SESSION_KEY not in config.stash:
        config.stash[_SESSION_KEY] = ParitySession(overlap_generation=True)
    return config.stash[_SESSION_KEY]


def _requested(config: pytest.Config) -> list[str]:
    return [m for value in config.getoption("model") for m in value.split(",") if m]


class _ProfileCollector(pytest.File):
    """A profile file of either kind: collected when its model is requested (or none is);
    a profile error is its own one-line ERROR."""

    def collect(self):
        requested = _requested(self.config)
        if not requested or self.path.stem in requested:
            yield from self.items()

    def items(self):
        raise NotImplementedError

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, HarnessError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class ProfileFile(_ProfileCollector):
    """Collects one collector per scenario, named by its id, and under it one item per check:
    node ids `profiles/<model>.yaml::<scenario>::<check>` resolve when passed back to pytest."""

    def items(self):
        profile = load_profile(self.path)
        for scenario in profile.scenarios:
            if not profile.runs_on(scenario, device_facts().backend):
                # Not collected here (a full-size twin's complete set takes hours on the CPU
                # backend); the report's context lists it as scoped out, never as passed.
                continue
            yield ScenarioCollector.from_parent(self, name=scenario.id, profile=profile, scenario=scenario)


class ScenarioCollector(pytest.Collector):
    def __init__(self, *, profile: Profile, scenario: Scenario, **kwargs: Any):
        super().__init__(**kwargs)
        self.profile, self.scenario = profile, scenario

    def collect(self):
        profile, scenario = self.profile, self.scenario
        for check in profile.planned(scenario).checks:
            item = ParityItem.from_parent(self, name=check, profile=profile, scenario=scenario, check=check)
            item.add_marker(pytest.mark.parity)
            item.add_marker(getattr(pytest.mark, profile.planned(scenario).tier))
            item.add_marker(pytest.mark.xdist_group(f"{profile.name}:{scenario.id}"))
            for tag in scenario.tags:
                item.add_marker(getattr(pytest.mark, tag))
            yield item


class FlakyCheck(HarnessError):
    """A check that failed and then passed when run again: an ERROR row, never a pass."""


class ParityFailure(Exception):
    def __init__(self, result: CheckResult):
        super().__init__(result.summary)
        self.result = result


def _details(result: CheckResult | None) -> dict[str, Any]:
    if result is None:
        return {}
    counts = {"steps_compared": result.steps_compared, "steps_differing": result.steps_differing}
    return {"per_step": result.per_step, **counts, **result.details}


class _VerdictItem(pytest.Item):
    """One check of one scenario (or fixture): its verdict as a report row, its failure in one line.

    A crash is an ERROR row, never a missing one (pytest shows the traceback)."""

    scenario_id: str
    check: str

    def _judge(self) -> CheckResult:
        raise NotImplementedError

    def _row(self) -> dict[str, Any]:
        raise NotImplementedError  # model, tier, oracle

    def _result(self, outcome: str, summary: str, seconds: float, result: CheckResult | None) -> None:
        item = ItemResult(
            **self._row(),
            scenario=self.scenario_id,
            check=self.check,
            outcome=outcome,
            summary=summary,
            seconds=round(seconds, 3),
            first_bad_step=result.first_bad_step if result else None,
            details=_details(result),
            peak_rss_mb=peak_rss_mb(),
        )
        # user_properties travel from xdist workers to the controller, which writes the report.
        self.user_properties.append(("parity", json.dumps(item.__dict__)))

    def runtest(self) -> None:
        if hasattr(self.config, "workerinput"):  # an xdist worker: its clock's share goes with the result
            before, calls, beside = clock.totals(), dict(clock.calls), dict(clock.beside)
            try:
                self._timed_runtest()
            finally:
                phases = {
                    "seconds": delta(before, clock.totals()),
                    "calls": {k: v - calls.get(k, 0) for k, v in clock.calls.items() if v > calls.get(k, 0)},
                    "beside": delta(beside, clock.beside),
                }
                self.user_properties.append(("parity_phases", json.dumps(phases)))
        else:
            self._timed_runtest()

    def _timed_runtest(self) -> None:
        started = time.perf_counter()
        try:
            result = self._judge()
        except HarnessError as e:
            self._result("error", str(e), time.perf_counter() - started, None)
            raise
        except Exception as e:
            self._result("error", f"{type(e).__name__}: {e}", time.perf_counter() - started, None)
            raise
        self._result("passed" if result.passed else "failed", result.summary, time.perf_counter() - started, result)
        if not result.passed:
            raise ParityFailure(result)

    def repr_failure(self, excinfo, style=None):
        where = f"{self._row()['model']}/{self.scenario_id} {self.check}"
        if isinstance(excinfo.value, ParityFailure):
            return f"{where} FAILED: {excinfo.value.result.summary}"
        if isinstance(excinfo.value, HarnessError):
            return f"{where} ERROR: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self._row()['model']}::{self.scenario_id}::{self.check}"


class ParityItem(_VerdictItem):
    def __init__(self, *, profile: Profile, scenario: Scenario, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.profile, self.scenario, self.check = profile, scenario, check
        self.planned = profile.planned(scenario)  # planned at collection; the run reads it
        self.scenario_id = scenario.id

    def _row(self) -> dict[str, Any]:
        return {
            "model": self.profile.name,
            "tier": self.planned.tier,
            "oracle": self.planned.oracle,
        }

    def _judge(self) -> CheckResult:
        session = _session(self.config)
        result = session.run_check(self.profile, self.scenario, self.check)
        reruns = self.config.getoption("rerun_flaky") or 0
        if result.passed or not reruns:
            return result
        outcomes = ["failed"]
        for _ in range(reruns):  # the in-tree side runs again from scratch; the golden stays
            session.forget_runs(self.profile, self.scenario)
            again = session.run_check(self.profile, self.scenario, self.check)
            outcomes.append("passed" if again.passed else "failed")
        if "passed" in outcomes:  # a flake: never a pass; at L1 the harness or backend is at fault
            bug = " (an L1 check: a harness or backend bug)" if self.planned.tier == "L1" else ""
            raise FlakyCheck(f"flaky{bug}: {', '.join(outcomes)} over {1 + reruns} runs; first: {result.summary}")
        result.summary += f"; failed again in each of {reruns} rerun(s)"
        return result


class VadProfileFile(_ProfileCollector):
    """A VAD profile: one collector per fixture, one item per check under it (harness/checks/vad.py judges)."""

    def items(self):
        profile = load_vad_profile(self.path)
        for fixture in profile.fixtures:
            yield VadFixtureCollector.from_parent(self, name=fixture, profile=profile, fixture=fixture)


class VadFixtureCollector(pytest.Collector):
    def __init__(self, *, profile: VadProfile, fixture: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.profile, self.fixture = profile, fixture

    def collect(self):
        for check in vad_checks(self.profile):
            item = VadItem.from_parent(self, name=check, profile=self.profile, fixture=self.fixture, check=check)
            item.add_marker(pytest.mark.parity)
            item.add_marker(pytest.mark.xdist_group(self.profile.name))  # one model load, one oracle run
            yield item


class VadItem(_VerdictItem):
    def __init__(self, *, profile: VadProfile, fixture: str, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.profile, self.fixture, self.check = profile, fixture, check
        self.scenario_id = fixture

    def _row(self) -> dict[str, Any]:
        return {"model": self.profile.name, "tier": VAD_TIER, "oracle": self.profile.oracle}

    def _judge(self) -> CheckResult:
        runs = self.config.stash.setdefault(_VAD_KEY, {})
        found = runs.setdefault(self.profile.name, VadRun(self.profile, [self.fixture])).check(self.fixture, self.check)
        return CheckResult(self.check, found.passed, found.detail, details=dict(found.details))


def short_reason(report: pytest.BaseReport) -> str:
    """A failed report's reason in one line (its crash message, else its last line)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:500]
    lines = [line for line in str(report.longrepr or "").splitlines() if line.strip()]
    return (lines[-1] if lines else "no detail").strip()[:500]
