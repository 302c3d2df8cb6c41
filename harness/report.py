"""Reports read results only: a JSON report under reports/ and a rich verdict table.

A report file is created, never replaced: a failed or repeated run writes a new file and
leaves earlier reports intact.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness import HARNESS_VERSION
from harness.fileio import atomic_create_json
from harness.paths import reports_dir


@dataclass
class ItemResult:
    model: str
    scenario: str
    check: str
    tier: str
    oracle: str
    outcome: str  # "passed" | "failed" | "error"
    summary: str
    first_bad_step: int | None = None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    peak_rss_mb: float = 0.0  # of the process that ran the item, at its end


def peak_rss_mb() -> float:
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)  # bytes on macOS, KiB on Linux


def verdict(results: list[ItemResult]) -> str:
    if not results:
        return "NO CHECKS RAN"
    return "PASS" if all(r.outcome == "passed" for r in results) else "FAIL"


def build_report(results: list[ItemResult], context: dict[str, Any], started: dt.datetime) -> dict[str, Any]:
    return {
        "harness_version": HARNESS_VERSION,
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "verdict": verdict(results),
        "counts": {o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "error")},
        "context": context,
        "results": [r.__dict__ for r in results],
    }


def write_report(report: dict[str, Any], path: Path | None = None) -> Path:
    if path is None:
        models = "-".join(sorted({r["model"] for r in report["results"]})) or "none"
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        path = reports_dir() / f"parity-{models}-{stamp}.json"
    atomic_create_json(path, report)
    return path


def print_table(results: list[ItemResult], console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 160)
    table = Table(title=f"Parity verdict: {verdict(results)}", show_lines=False)
    for column in ("model", "scenario", "check", "tier", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    style = {"passed": "green", "failed": "bold red", "error": "bold yellow"}
    for r in results:
        table.add_row(
            r.model, r.scenario, r.check, r.tier, f"[{style[r.outcome]}]{r.outcome.upper()}[/]", r.summary[:160]
        )
    console.print(table)
