"""Reports read results only: a JSON report under reports/ (harness/screen.py renders it on the terminal).

A report file is created, never replaced: a failed or repeated run writes a new file and
leaves earlier reports intact.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import HARNESS_VERSION
from harness.errors import HarnessError
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


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float written as a string ("NaN", "Infinity",
    "-Infinity"): a report is strict JSON, and a string says what the number was."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def build_report(results: list[ItemResult], context: dict[str, Any], started: dt.datetime) -> dict[str, Any]:
    return finite_json(
        {
            "harness_version": HARNESS_VERSION,
            "started": started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "verdict": verdict(results),
            "counts": {o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "error")},
            "context": context,
            "results": [r.__dict__ for r in results],
        }
    )


def merge_reports(reports: list[dict[str, Any]], runs: dict[str, int]) -> dict[str, Any]:
    """One report from the reports of several parity runs on one machine (one per profile).

    Results are concatenated in run order, verdict and counts recomputed from them. Context
    values that are per model (`provenance`) are united, lists (`models`, `scoped_out`)
    joined, anything else (the device, the harness commit) must be the same in every run: two
    runs on different devices or commits are refused, not averaged. `runs` maps each profile
    to its run's exit code and is kept in the context, so a verdict can name the run that failed.
    """
    if not reports:
        raise HarnessError("no parity report to merge")
    versions = sorted({str(r["harness_version"]) for r in reports})
    if len(versions) > 1:
        raise HarnessError(f"the parity runs come from different harness versions {versions}")
    results = [item for report in reports for item in report["results"]]
    context: dict[str, Any] = {}
    for report in reports:
        for key, value in report["context"].items():
            if key == "exit_status":  # each run's own: `runs` holds them all
                continue
            if key not in context:
                context[key] = value
            elif isinstance(value, list):
                context[key] = sorted(set(context[key]) | set(value))
            elif key == "provenance":
                context[key] = {**context[key], **value}
            elif value != context[key]:
                raise HarnessError(
                    f"the parity runs disagree on context {key!r} ({context[key]!r} vs {value!r}): "
                    "they are not one machine's runs of one harness"
                )
    context["runs"] = dict(runs)
    outcomes = [r["outcome"] for r in results]
    items = [ItemResult(**r) for r in results]
    return {
        "harness_version": reports[0]["harness_version"],
        "started": min(r["started"] for r in reports),
        "finished": max(r["finished"] for r in reports),
        "verdict": verdict(items),
        "counts": {o: outcomes.count(o) for o in ("passed", "failed", "error")},
        "context": context,
        "results": results,
    }


def write_report(report: dict[str, Any], path: Path | None = None) -> Path:
    """Create the report file (never replacing one); a failed write names the path."""
    if path is None:
        models = "-".join(sorted({r["model"] for r in report["results"]})) or "none"
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        path = reports_dir() / f"parity-{models}-{stamp}.json"
    try:
        atomic_create_json(path, report)
    except FileExistsError as e:
        if str(e.filename2) == str(path):  # the link onto an existing report: never replaced
            raise
        raise HarnessError(f"cannot write the parity report {path}: {e}") from e
    except (OSError, ValueError) as e:
        raise HarnessError(f"cannot write the parity report {path}: {e}") from e
    return path


def keep_report(report: dict[str, Any], target: Path | None, junit: str | None) -> tuple[str, bool]:
    """Write the report (never replacing one) and append the run to the results store
    (harness/history/store.py): the lines naming where (or what went wrong), and whether both
    were kept."""
    from harness.history.store import record, store_path
    from harness.screen import shown_path

    try:
        path = write_report(report, target)
    except FileExistsError:
        return f"error: the parity report {target} exists and is never replaced: name a new path", False
    except HarnessError as e:
        return f"error: {e}", False
    line = f"report: {shown_path(path)}" + (f" · JUnit: {shown_path(Path(junit))}" if junit else "")
    try:
        record(store_path(), "parity", report, path)
    except HarnessError as e:
        return f"{line}\nerror: {e}", False
    return line, True
