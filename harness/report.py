"""Reports read results only: a JSON report under reports/ (harness/screen.py renders it on the terminal).

A report file is created, never replaced: a failed or repeated run writes a new file and
leaves earlier reports intact. `read_report` is the one reader of a report file that came from
elsewhere (`matrix`, `signoff --from-report`, `signoff --previous`): at most READ_LIMIT bytes
(after gzip), and every field its readers use checked, so a malformed file is one line naming
the file, the field and what was expected, never a traceback or a half-written page.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import re
import zlib
from collections.abc import Callable
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


class ReportFileError(HarnessError):
    """A report file that cannot be read, or is not a parity report: names the file and the field."""


READ_LIMIT = 256 << 20  # bytes of a report read (after gzip): a report is megabytes; a gzip bomb is refused unread
OUTCOMES = ("passed", "failed", "error")
# A device key or harness version names folders (signoff-<version>-<key>, goldens/<model>/<key>): a name, no path.
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def read_report(path: Path) -> dict[str, Any]:
    """A parity report file (`.json`, or gzipped `.json.gz`), read and checked (`check_report`)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read(READ_LIMIT + 1)  # never more: a 1.5 MB bomb of 1.5 GB stops here
        else:
            if path.stat().st_size > READ_LIMIT:
                raise ReportFileError(_too_big(path))
            data = path.read_bytes()
    except EOFError as e:
        raise ReportFileError(f"{path}: cannot read a JSON report: a truncated gzip file ({e})") from e
    except (OSError, zlib.error) as e:  # absent, unreadable, not gzip, a corrupt gzip
        raise ReportFileError(f"{path}: cannot read a JSON report: {getattr(e, 'strerror', None) or e}") from e
    if len(data) > READ_LIMIT:
        raise ReportFileError(_too_big(path))
    try:
        report = json.loads(data)
    except ValueError as e:  # not JSON, not UTF-8
        raise ReportFileError(f"{path}: cannot read a JSON report: not JSON: {e}") from e
    return check_report(report, str(path))


def _too_big(path: Path) -> str:
    return (
        f"{path}: cannot read a JSON report: larger than {READ_LIMIT >> 20} MiB"
        + (" once decompressed (a gzip bomb?)" if path.suffix == ".gz" else "")
        + "; refused, not read further"
    )


_MISSING = object()


def _kind(value: Any) -> str:
    """What a JSON value is, for an error: 'an object', 'the string "a/b"', 'the number 12345'."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:60]!r}" + ("…" if len(value) > 60 else "")
    return {dict: "an object", list: "a list", type(None): "null"}.get(type(value), type(value).__name__)


def check_report(report: Any, where: str) -> dict[str, Any]:
    """`report` if it has the shape of a parity report, as far as its readers use it; else a
    ReportFileError naming `where`, the key and what was expected."""

    def refuse(key: str, expected: str, value: object) -> ReportFileError:
        got = "missing" if value is _MISSING else f"got {_kind(value)}"
        return ReportFileError(f"{where}: {key}: expected {expected}, {got} (not a parity report?)")

    if not isinstance(report, dict):
        raise ReportFileError(f"{where}: expected a JSON object (a parity report), got {_kind(report)}")
    context = report.get("context", _MISSING)
    if not isinstance(context, dict):
        raise refuse("context", "an object (the run's device, models, provenance)", context)
    device = context.get("device", {})
    if not isinstance(device, dict):
        raise refuse("context.device", "an object (the device the run was on)", device)
    for key, value, what in (
        ("context.device.key", device.get("key", "x"), "the golden key"),
        ("harness_version", report.get("harness_version", "x"), "the harness's version"),
    ):
        if not isinstance(value, str) or not FOLDER_NAME.fullmatch(value):
            raise refuse(key, f"{what}: a name of letters, digits and . _ + - (it names folders)", value)
    for key in ("started", "finished", "verdict"):
        if report.get(key) is not None and not isinstance(report[key], str):
            raise refuse(key, "a string", report[key])
    if not isinstance(report.get("counts", {}), dict):
        raise refuse("counts", "an object (checks per outcome)", report["counts"])
    results = report.get("results", _MISSING)
    if not isinstance(results, list):
        raise refuse("results", "a list of check results", results)
    for i, row in enumerate(results):
        _check_row(row, f"results[{i}]", refuse)
    return report


def _check_row(row: Any, at: str, refuse: Callable[[str, str, object], ReportFileError]) -> None:
    if not isinstance(row, dict):
        raise refuse(at, "an object (one check's result)", row)
    for key in ("model", "scenario", "check"):
        value = row.get(key, _MISSING)
        if not isinstance(value, str) or not value:
            raise refuse(f"{at}.{key}", "a non-empty string", value)
    if row.get("outcome", _MISSING) not in OUTCOMES:
        raise refuse(f"{at}.outcome", f"one of {', '.join(OUTCOMES)}", row.get("outcome", _MISSING))
    for key in ("summary", "tier", "oracle"):
        if key in row and not isinstance(row[key], str):
            raise refuse(f"{at}.{key}", "a string", row[key])
    step = row.get("first_bad_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise refuse(f"{at}.first_bad_step", "a step number or null", step)
    for key in ("seconds", "peak_rss_mb"):
        value = row.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(f"{at}.{key}", "a number", value)
    details = row.get("details")
    if details is not None and not isinstance(details, dict):
        raise refuse(f"{at}.details", "an object or null", details)
    per_step = (details or {}).get("per_step", [])
    if not isinstance(per_step, list) or not all(isinstance(step, dict) for step in per_step):
        raise refuse(f"{at}.details.per_step", "a list of objects (one per step compared)", per_step)


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
    from harness.history.regress import safely
    from harness.history.store import record, store_path
    from harness.screen import shown_path

    # Each failing check against the implementation's previous run (harness/history/regress.py):
    # a known-failing implementation's new fault shows as a regression.
    report["regressions"], unread = safely(report, store_path())
    if unread:
        report.setdefault("context", {}).setdefault("notes", []).append(unread)
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
