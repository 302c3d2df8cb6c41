"""The parity run's count for the progress bar (harness/progress.py): checks done of the
total, and each scenario as its last check ends (xdist's workers report to the controller,
which counts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.progress import progress


class RunCounter:
    """Feeds the progress bar: checks done of the total, and each scenario as it completes."""

    def __init__(self) -> None:
        self.started = False
        self.left: dict[str, int] = {}  # per "model/scenario", its checks not yet done
        self.checks: dict[str, int] = {}  # and all of them
        self.failed: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.bad: set[str] = set()

    def start(self, ids: list[str]) -> None:
        self.started = True
        for nodeid in ids:
            key = scenario_of(nodeid)
            self.left[key] = self.left.get(key, 0) + 1
        self.checks = dict(self.left)
        progress.start_run(len(ids))

    def report(self, report: pytest.TestReport) -> None:
        key = scenario_of(report.nodeid)
        self.seconds[key] = self.seconds.get(key, 0.0) + report.duration
        if report.failed:
            self.bad.add(report.nodeid)
        if report.when != "teardown" or key not in self.left:
            return
        failed = report.nodeid in self.bad
        progress.check_done(not failed)
        self.failed[key] = self.failed.get(key, 0) + failed
        self.left[key] -= 1
        if self.left[key] == 0:
            progress.scenario_done(key, self.checks[key], self.failed[key], self.seconds[key])


def scenario_of(nodeid: str) -> str:
    """`model/scenario` of a parity node id (an xdist group suffix left out)."""
    parts = nodeid.split("@")[0].split("::")
    return f"{Path(parts[0]).stem}/{parts[1]}" if len(parts) >= 2 else Path(parts[0]).stem
