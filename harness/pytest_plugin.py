"""pytest face of the harness: profiles become items (profile x scenario x check).

`pytest profiles/ --model smollm2-135m` selects a model; `-n auto --dist loadgroup` runs in
parallel with each scenario's checks kept on one worker (one in-tree run per scenario).
The controller gathers every item's structured result, prints the verdict table and writes
the JSON report.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.compare import CheckResult
from harness.errors import HarnessError
from harness.paths import profiles_dir
from harness.profile import Profile, Scenario, available_profiles, load_profile
from harness.progress import progress
from harness.provenance import device_facts
from harness.report import ItemResult, build_report, peak_rss_mb, print_table, write_report
from harness.session import ParitySession, harness_commit, model_provenance

_SESSION_KEY = pytest.StashKey[ParitySession]()
_REMAINING_KEY = pytest.StashKey[dict[str, int]]()  # ParityItems left to run, per profile
_STARTED_KEY = pytest.StashKey[dt.datetime]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity")
    group.addoption("--model", action="append", default=[], help="model(s) to gate (profile names)")
    group.addoption("--parity-report", default=None, help="write the JSON report here (default: reports/)")
    group.addoption("--no-parity-report", action="store_true", help="do not write a JSON report")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "parity: a parity gate collected from a profile")
    config.addinivalue_line("markers", "L1: tier L1 (bit-exact against the plain oracle)")
    config.addinivalue_line("markers", "L2: tier L2 (composed oracle or explained budget)")
    config.addinivalue_line("markers", "nightly: a scenario kept out of make test (-m 'not nightly')")
    config.stash[_STARTED_KEY] = dt.datetime.now(dt.UTC)
    config.pluginmanager.register(_Collector(), "parity-collector")
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        progress.uncaptured = capture.global_and_fixture_disabled
    requested = [m for value in config.getoption("model") for m in value.split(",") if m]
    known = available_profiles()
    unknown = [m for m in requested if m not in known]
    if unknown:
        raise pytest.UsageError(
            f"unknown model(s) {unknown}: no profile in {profiles_dir()}; known models: {', '.join(known) or '(none)'}"
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Goldens are made for the scenarios that will run, not for those -m / -k deselected."""
    selected: dict[str, set[str]] = {}
    for item in items:
        if isinstance(item, ParityItem):
            selected.setdefault(item.profile.name, set()).add(item.scenario.id)
    _session(config).selected_scenarios.update(selected)
    remaining: dict[str, int] = {}
    for item in items:
        if isinstance(item, ParityItem):
            remaining[item.profile.name] = remaining.get(item.profile.name, 0) + 1
    config.stash[_REMAINING_KEY] = remaining


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a profile's last item in this process its in-tree model is released. Under xdist a
    worker runs only some of the items it counted, and so keeps its models (as before)."""
    if not isinstance(item, ParityItem) or _REMAINING_KEY not in item.config.stash:
        return
    remaining = item.config.stash[_REMAINING_KEY]
    remaining[item.profile.name] -= 1
    if remaining[item.profile.name] == 0:
        _session(item.config).release(item.profile.name)


def _session(config: pytest.Config) -> ParitySession:
    if _SESSION_KEY not in config.stash:
        config.stash[_SESSION_KEY] = ParitySession()
    return config.stash[_SESSION_KEY]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".yaml" and file_path.parent.resolve() == profiles_dir():
        return ProfileFile.from_parent(parent, path=file_path)
    return None


def scoped_out(models: list[str]) -> list[str]:
    """The scenarios of these models that this backend does not run (their `backends`)."""
    out = []
    for name in models:
        try:
            profile = load_profile(available_profiles()[name])
        except (HarnessError, KeyError):
            continue
        for s in profile.scenarios:
            if not profile.runs_on(s, device_facts().backend):
                out.append(f"{name}/{s.id} ({'/'.join(s.backends)} only)")
    return out


class ProfileFile(pytest.File):
    def collect(self):
        requested = [m for value in self.config.getoption("model") for m in value.split(",") if m]
        if requested and self.path.stem not in requested:
            return
        profile = load_profile(self.path)
        for scenario in profile.scenarios:
            if not profile.runs_on(scenario, device_facts().backend):
                # Not collected here (a full-size twin's complete set takes hours on the CPU
                # backend); the report's context lists it as scoped out, never as passed.
                continue
            for check in profile.checks(scenario):
                item = ParityItem.from_parent(
                    self, name=f"{scenario.id}::{check}", profile=profile, scenario=scenario, check=check
                )
                item.add_marker(pytest.mark.parity)
                item.add_marker(getattr(pytest.mark, profile.tier_of(scenario)))
                item.add_marker(pytest.mark.xdist_group(f"{profile.name}:{scenario.id}"))
                for tag in scenario.tags:
                    item.add_marker(getattr(pytest.mark, tag))
                yield item

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, HarnessError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class ParityFailure(Exception):
    def __init__(self, result: CheckResult):
        super().__init__(result.summary)
        self.result = result


class ParityItem(pytest.Item):
    def __init__(self, *, profile: Profile, scenario: Scenario, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.profile, self.scenario, self.check = profile, scenario, check

    def _result(self, outcome: str, summary: str, seconds: float, result: CheckResult | None) -> None:
        item = ItemResult(
            model=self.profile.name,
            scenario=self.scenario.id,
            check=self.check,
            tier=self.profile.tier_of(self.scenario),
            oracle=self.profile.oracle_of(self.scenario),
            outcome=outcome,
            summary=summary,
            seconds=round(seconds, 3),
            first_bad_step=result.first_bad_step if result else None,
            details={"per_step": result.per_step, **result.details} if result else {},
            peak_rss_mb=peak_rss_mb(),
        )
        # user_properties travel from xdist workers to the controller, which writes the report.
        self.user_properties.append(("parity", json.dumps(item.__dict__)))

    def runtest(self) -> None:
        started = time.perf_counter()
        try:
            result = _session(self.config).run_check(self.profile, self.scenario, self.check)
        except HarnessError as e:
            self._result("error", str(e), time.perf_counter() - started, None)
            raise
        self._result("passed" if result.passed else "failed", result.summary, time.perf_counter() - started, result)
        if not result.passed:
            raise ParityFailure(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ParityFailure):
            return f"{self.profile.name}/{self.scenario.id} {self.check} FAILED: {excinfo.value.result.summary}"
        if isinstance(excinfo.value, HarnessError):
            return f"{self.profile.name}/{self.scenario.id} {self.check} ERROR: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.profile.name}::{self.scenario.id}::{self.check}"


class _Collector:
    """Gathers item results on the controller (xdist workers send them in user_properties)."""

    def __init__(self) -> None:
        self.results: list[ItemResult] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == "parity":
                self.results.append(ItemResult(**json.loads(value)))

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if hasattr(config, "workerinput") or not self.results:  # xdist worker: the controller reports
            return
        terminalreporter.write_line("")
        print_table(self.results)
        skipped = scoped_out(sorted({r.model for r in self.results}))
        if skipped:
            backend = device_facts().backend
            terminalreporter.write_line(f"not run on the {backend} backend (scenario backends): {', '.join(skipped)}")
        if config.getoption("no_parity_report"):
            return
        models = sorted({r.model for r in self.results})
        context = {
            "device": device_facts().as_dict(),
            "models": models,
            "harness_commit": harness_commit(),
            "provenance": {m: model_provenance(m) for m in models},
            "scoped_out": scoped_out(models),
        }
        report = build_report(self.results, context, config.stash[_STARTED_KEY])
        target = config.getoption("parity_report")
        path = write_report(report, Path(target) if target else None)
        terminalreporter.write_line(f"parity report: {path}")
