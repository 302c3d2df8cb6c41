"""pytest face of the harness: profiles become items (profile x scenario x check).

`pytest profiles/ --model smollm2-135m` selects a model; `-n auto --dist loadgroup` runs in
parallel with each scenario's checks kept on one worker (one in-tree run per scenario).
The controller gathers every item's structured result, prints the verdict table and writes
the JSON report.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from harness.checks.vad import segments_coverage, walked_segments
from harness.coverage import SCENARIO as COVERAGE_SCENARIO
from harness.coverage import Coverage, judge_coverage
from harness.device import check_real_device
from harness.errors import HarnessError, unknown
from harness.goldens.lifecycle import harness_commit
from harness.model_provenance import model_provenance, with_hellos
from harness.paths import profiles_dir
from harness.profile import Profile
from harness.profile.load import EXTERNAL, available_profiles, load_profile
from harness.profile.vad import VadProfile, available_vad_profiles, load_vad_profile
from harness.progress import progress
from harness.provenance import device_facts
from harness.pytest_counter import RunCounter
from harness.pytest_items import (
    _VAD_KEY,
    ParityItem,
    ProfileFile,
    VadItem,
    VadProfileFile,
    _requested,
    _rerun_count,
    _session,
    short_reason,
)
from harness.report import ItemResult, build_report, keep_report, peak_rss_mb, verdict
from harness.screen import render
from harness.settings import check_all as check_settings
from harness.timing import breakdown, clock, format_breakdown
from harness.vad_session import VadRun

_P = TypeVar("_P")
_REMAINING_KEY = pytest.StashKey[dict[str, int]]()  # ParityItems left to run, per profile
_STARTED_KEY = pytest.StashKey[dt.datetime]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity")
    group.addoption("--model", action="append", default=[], help="model(s) to gate (profile names)")
    group.addoption("--parity-report", default=None, help="write the JSON report here (default: reports/)")
    group.addoption("--no-parity-report", action="store_true", help="do not write a JSON report")
    group.addoption(
        "--rerun-flaky", type=_rerun_count, default=0, help="run a failing check N (0..10) more times: flaky or failing"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "parity: a parity gate collected from a profile")
    config.addinivalue_line("markers", "L1: tier L1 (bit-exact against the plain oracle)")
    config.addinivalue_line("markers", "L2: tier L2 (composed oracle or explained budget)")
    config.addinivalue_line("markers", "nightly: a scenario kept out of make test (-m 'not nightly')")
    try:
        check_settings()
        check_real_device(device_facts())  # no Metal golden made or judged on a paravirtual GPU
    except HarnessError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[_STARTED_KEY] = dt.datetime.now(dt.UTC)
    clock.reset()  # the time-to-verdict breakdown (harness/timing.py) counts from here
    config.pluginmanager.register(_Collector(), "parity-collector")
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        progress.uncaptured = capture.global_and_fixture_disabled
    requested = _requested(config)
    known = known_models()
    missing = [m for m in requested if m not in known]
    if missing:
        raise pytest.UsageError(
            "; ".join(unknown(m, known, "model", "known models") for m in missing) + f" (profiles: {profiles_dir()})"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session):
    with clock.phase("collection"):
        yield


def pytest_collection_finish(session: pytest.Session) -> None:
    """Goldens are made for the scenarios that will run, not for those -m / -k / --lf deselected
    (the final item list: --lf filters after every other plugin's modifyitems)."""
    config, items = session.config, session.items
    if hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False):
        lost = ungrouped(items)
        if lost:
            raise pytest.UsageError(
                f"pytest {pytest.__version__} with this pytest-xdist ignores xdist_group (pytest-dev/pytest-xdist"
                f"#1386): {lost[0]} would run apart from its group, repeating its in-tree runs; install the "
                "project's pinned pytest (requirements.txt)"
            )
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
    vad: dict[str, VadRun] = {}
    for item in items:  # a VAD profile's goldens are made or read once, for the selected fixtures
        if isinstance(item, VadItem):
            vad.setdefault(item.profile.name, VadRun(item.profile, [])).fixtures.append(item.fixture)
    config.stash[_VAD_KEY] = vad


def ungrouped(items: list[pytest.Item]) -> list[str]:
    """Items with an xdist_group mark whose node id lacks the group suffix pytest-xdist's
    loadgroup schedules by (it adds `@<group>` on the worker before the controller sees the ids)."""
    lost = []
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
        }
        if names and not item.nodeid.endswith("@" + "_".join(sorted(names))):
            lost.append(item.nodeid)
    return lost


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a profile's last item in this process its in-tree model is released. Under xdist a
    worker runs only some of the items it counted, and so keeps its models (as before)."""
    if not isinstance(item, ParityItem) or _REMAINING_KEY not in item.config.stash:
        return
    remaining = item.config.stash[_REMAINING_KEY]
    remaining[item.profile.name] -= 1
    if remaining[item.profile.name] == 0:
        _session(item.config).release(item.profile.name)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".yaml" and file_path.parent.resolve() in (profiles_dir(), profiles_dir() / EXTERNAL):
        return ProfileFile.from_parent(parent, path=file_path)
    if file_path.suffix == ".yaml" and file_path.parent.resolve() == (profiles_dir() / "vad").resolve():
        return VadProfileFile.from_parent(parent, path=file_path)
    return None


def known_models() -> dict[str, Path]:
    """Every profile `make parity` collects: model profiles and VAD profiles (profiles/vad/)."""
    return available_profiles() | available_vad_profiles()


def _loaded(models: list[str], available: Callable[[], dict[str, Path]], load: Callable[[Path], _P]) -> list[_P]:
    """The profiles of these models that load (one that does not is its own ERROR row)."""
    out = []
    for name in models:
        try:
            out.append(load(available()[name]))
        except (HarnessError, KeyError):
            continue
    return out


def _loadable(models: list[str]) -> list[Profile]:
    return _loaded(models, available_profiles, load_profile)


def _loadable_vad(models: list[str]) -> list[VadProfile]:
    return _loaded(models, available_vad_profiles, load_vad_profile)


def not_run_here(models: list[str]) -> list[str]:
    """Of these models, those of which no scenario runs on this backend (all scoped elsewhere)."""
    backend = device_facts().backend
    return [p.name for p in _loadable(models) if p.scenarios and not p.active_scenarios(backend)]


def scoped_out(models: list[str]) -> list[str]:
    """The scenarios of these models that this backend does not run (their `backends`)."""
    backend = device_facts().backend
    return [
        f"{p.name}/{s.id} ({'/'.join(s.backends)} only)"
        for p in _loadable(models)
        for s in p.scenarios
        if not p.runs_on(s, backend)
    ]


def _item_row(nodeid: str, summary: str) -> ItemResult:
    """An ERROR row for a parity item (or profile) that recorded no result of its own."""
    parts = nodeid.split("::")
    model = Path(parts[0]).stem
    scenario, check = (parts[1], parts[2]) if len(parts) == 3 else ("(profile)", "collect")
    tier = oracle = "?"
    try:
        profile = load_profile(available_profiles()[model])
        chosen = next(s for s in profile.scenarios if s.id == scenario)
        tier, oracle = profile.tier_of(chosen), profile.oracle_of(chosen)
    except (HarnessError, KeyError, StopIteration):
        pass
    return ItemResult(
        model=model,
        scenario=scenario,
        check=check,
        tier=tier,
        oracle=oracle,
        outcome="error",
        summary=summary,
        peak_rss_mb=peak_rss_mb(),
    )


def _is_parity_id(nodeid: str) -> bool:
    return nodeid.split("::")[0].endswith(".yaml")


class _Collector:
    """Gathers item results on the controller (xdist workers send them in user_properties)
    and owns the verdict: PASS only when every collected parity item recorded a passing
    result. An item that crashed, erred in setup or teardown, or never reported (an
    interrupted run, a crashed worker) is an ERROR row, and so is a profile that failed to
    collect; the exit status is made non-zero to match."""

    def __init__(self) -> None:
        self.rows: dict[str, ItemResult] = {}  # by node id, in arrival order
        self.expected: dict[str, None] = {}  # the collected parity items' node ids, in order
        self.report_line = ""
        self.report: dict | None = None  # the run's report, written or not; the screen renders it
        self.counter = RunCounter()
        self.not_run: list[str] = []  # collected items -x / --maxfail left unrun
        self.coverage: list[Coverage] = []
        # Phase seconds and counts the xdist workers shipped with their items, and the item seconds.
        self.worker_seconds: dict[str, float] = {}
        self.worker_calls: dict[str, int] = {}
        self.worker_item_seconds = 0.0
        self.worker_beside: dict[str, float] = {}
        self.workers: set[str] = set()

    def timing(self) -> dict:
        """The run's time-to-verdict breakdown so far (this process's clock plus the workers')."""
        seconds, calls = clock.totals(), dict(clock.calls)
        own = sum(seconds.values())  # the controller's own phases (collection, report, ...)
        for name, value in self.worker_seconds.items():
            seconds[name] = seconds.get(name, 0.0) + value
        for name, value in self.worker_calls.items():
            calls[name] = calls.get(name, 0) + value
        beside = dict(clock.beside)
        for name, value in self.worker_beside.items():
            beside[name] = beside.get(name, 0.0) + value
        return breakdown(seconds, calls, clock.wall(), len(self.workers), self.worker_item_seconds, own, beside)

    @property
    def results(self) -> list[ItemResult]:
        return list(self.rows.values())

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.expected.update((i.nodeid, None) for i in session.items if isinstance(i, ParityItem))
        if not hasattr(session.config, "workerinput") and not session.config.option.collectonly:
            self.counter.start([i.nodeid for i in session.items if _is_parity_id(i.nodeid)])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        self.expected.update((i, None) for i in ids if _is_parity_id(i))
        if not self.counter.started:  # every worker collects the same items
            self.counter.start([i for i in ids if _is_parity_id(i)])

    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        """No dot per check: the progress bar (or a line per scenario) counts them."""
        if _is_parity_id(report.nodeid) and report.when == "call" and config.option.verbose <= 0:
            return report.outcome, "", ""
        return None

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and _is_parity_id(report.nodeid):
            self.rows[report.nodeid] = _item_row(
                report.nodeid, f"the profile failed to collect: {short_reason(report)}"
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not _is_parity_id(report.nodeid):
            return
        self.counter.report(report)
        if report.when == "call":
            for key, value in report.user_properties:
                if key == "parity":
                    self.rows[report.nodeid] = ItemResult(**json.loads(value))
                elif key == "parity_phases":
                    self._add_worker_phases(report, json.loads(value))
        if not report.failed:
            return
        row = self.rows.get(report.nodeid)
        if row is None:
            self.rows[report.nodeid] = _item_row(
                report.nodeid, f"no result recorded, {report.when} failed: {short_reason(report)}"
            )
        elif report.when != "call":  # e.g. a teardown error after a recorded result
            row.outcome, row.summary = "error", f"{row.summary}; then {report.when} failed: {short_reason(report)}"

    def _add_worker_phases(self, report: pytest.TestReport, phases: dict) -> None:
        for name, value in phases["seconds"].items():
            self.worker_seconds[name] = self.worker_seconds.get(name, 0.0) + value
        for name, value in phases["calls"].items():
            self.worker_calls[name] = self.worker_calls.get(name, 0) + value
        for name, value in phases.get("beside", {}).items():
            self.worker_beside[name] = self.worker_beside.get(name, 0.0) + value
        self.worker_item_seconds += report.duration
        self.workers.add(str(getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "worker")))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        if hasattr(config, "workerinput"):  # xdist worker: the controller reports
            return
        progress.end_run()
        with clock.phase("report"):
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        config = session.config
        if config.option.collectonly:  # nothing ran, nothing is judged: no rows, no report
            terminal = config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:  # but a profile that failed to collect says why (L15)
                for nodeid, row in self.rows.items():
                    terminal.write_line(f"error: {nodeid}: {row.summary}")
            return
        for nodeid in self.expected:
            if nodeid in self.rows:
                continue
            if session.shouldfail:  # -x / --maxfail stopped the run on purpose: listed, not an ERROR
                self.not_run.append(nodeid)
            else:
                self.rows[nodeid] = _item_row(
                    nodeid,
                    "no result recorded: the item did not run to the end "
                    "(interrupted, stopped early, or its worker crashed)",
                )
        # Each check's declared paths against what the scenarios walked (harness/coverage.py).
        models = sorted({r.model for r in self.results} | set(_requested(config)))
        self.coverage = judge_coverage(_loadable(models), self.results, device_facts().backend)
        self.coverage += [segments_coverage(p, walked_segments(self.results, p)) for p in _loadable_vad(models)]
        for c in self.coverage:
            if c.row is not None:
                self.rows[f"{c.model}::{COVERAGE_SCENARIO}::{c.check}"] = c.row
        if verdict(self.results) != "PASS" and session.exitstatus == pytest.ExitCode.OK and self.rows:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if not (self.rows or config.getoption("model")):
            return
        context = {
            "device": device_facts().as_dict(),
            "models": models,
            "harness_commit": harness_commit(),
            "provenance": with_hellos({m: model_provenance(m) for m in models}, self.rows.values()),
            "scoped_out": scoped_out(models),
            "not_run_here": not_run_here(models),
            "not_run": self.not_run,
            "coverage": [c.line for c in self.coverage],
            "exit_status": int(session.exitstatus),
        }
        report = build_report(self.results, context, config.stash[_STARTED_KEY])
        report["timing"] = self.timing()  # up to the report's own writing
        self.report = report
        if config.getoption("no_parity_report"):
            return
        target = config.getoption("parity_report")
        junit = getattr(config.option, "xmlpath", None)
        self.report_line, kept = keep_report(report, Path(target) if target else None, junit)
        if not kept:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The screen comes after pytest's own last line, so that the verdict is the run's last."""
        import contextlib

        progress.uncaptured = contextlib.nullcontext  # this run's capture manager ends here
        terminalreporter = config.pluginmanager.getplugin("terminalreporter")
        if hasattr(config, "workerinput") or self.report is None or terminalreporter is None:
            return
        width = terminalreporter._tw.fullwidth  # pytest's own terminal width (COLUMNS)
        lines = render(self.report, width, self.report_line or None)
        tail = 1 + len(self.report_line.splitlines())  # the report's path (and errors) and the verdict close it
        terminalreporter.write_line("")
        for line in lines[:-tail]:
            terminalreporter.write_line(line.text, **({line.style: True} if line.style else {}))
        if config.option.verbose >= 0:  # -v: every phase of the time to verdict
            for text in format_breakdown(self.timing()):
                terminalreporter.write_line(text)
        for line in lines[-tail:]:
            terminalreporter.write_line(line.text, bold=line is lines[-1], **({line.style: True} if line.style else {}))
