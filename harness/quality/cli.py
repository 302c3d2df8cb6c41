"""`python -m harness quality --model M [--pair ID]`: measure a profile's quality pairs, print
the table, write reports/quality-<model>-<device>[-N]/{quality.json, index.html}.

Exit codes: 0 measured (every in-tree cross-check equal or not run, every stated threshold
met); 1 an in-tree cross-check differs (a parity failure); 3 a quality threshold failed (and no
parity failure); 2 bad input (a profile key, an artifact, the oracle), nothing written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.errors import HarnessError, ProfileError
from harness.paths import reports_dir
from harness.profile.load import find_profile
from harness.progress import progress
from harness.quality.page import render_page
from harness.quality.report import comparisons, comparisons_table, document, table
from harness.quality.run import PairResult, measure_pair


def _progress_printer(model: str, pair: str):
    started = time.perf_counter()

    def on_progress(phase: str, done: int, total: int) -> None:
        if done == total or done % 4 == 0:
            progress.say(
                f"quality {model}/{pair}: {phase} window {done}/{total} ({time.perf_counter() - started:.0f}s)"
            )

    return on_progress


def measure(model: str, pair_ids: list[str]) -> list[PairResult]:
    profile = find_profile(model)
    if profile.quality is None:
        raise ProfileError(f"{profile.source_file}: quality: the profile names no quality pairs")
    pairs = [profile.quality.pair(p) for p in pair_ids] if pair_ids else profile.quality.pairs
    results = [measure_pair(profile, p, on_progress=_progress_printer(model, p.id)) for p in pairs]
    return results


def write_report(model: str, results: list[PairResult], out: Path | None = None) -> Path:
    from harness.goldens.lifecycle import harness_commit
    from harness.provenance import device_facts
    from harness.signoff.writer import write_signoff_dir

    facts = device_facts()
    doc = document(model, facts.as_dict(), results, harness_commit())
    files = {
        "quality.json": (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode(),
        "index.html": render_page(doc, results).encode(),
    }
    # A new folder renamed into place, `-N` when the name is taken: an earlier report is never replaced.
    return write_signoff_dir(out or reports_dir(), f"quality-{model}-{facts.key}", files)


def store_report(model: str, results: list[PairResult], started: str, facts: dict[str, Any]) -> dict[str, Any]:
    """The run as the results store takes it (harness/history/store.py): per pair, the in-tree
    cross-check (parity) and, where the pair states thresholds, its quality line."""
    rows = []
    for r in results:
        base = {"model": model, "scenario": r.pair.id, "tier": "quality", "oracle": r.oracle}
        rows.append(base | {"check": "cross_check", "outcome": "failed" if r.parity_failed else "passed"})
        if r.quality is not None:
            outcome = "passed" if r.quality.status == "PASS" else "failed"
            rows.append(base | {"check": "quality", "outcome": outcome, "summary": "; ".join(r.quality.reasons)})
    for row in rows:
        row.setdefault("summary", "")
    verdict = {0: "PASS", 1: "PARITY FAILURE", 3: "QUALITY FAIL"}[exit_code(results)]
    finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {
        "started": started,
        "finished": finished,
        "verdict": verdict,
        "context": {"device": facts, "models": [model]},
        "results": rows,
    }


def exit_code(results: list[PairResult]) -> int:
    if any(r.parity_failed for r in results):
        return 1
    if any(r.quality is not None and r.quality.status == "FAIL" for r in results):
        return 3
    return 0


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=False, width=max(Console().width, 200))
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    try:
        results = measure(args.model, args.pair)
        directory = write_report(args.model, results, Path(args.out) if args.out else None)
        from harness.history.store import record, store_path
        from harness.provenance import device_facts

        report = store_report(args.model, results, started, device_facts().as_dict())
        record(store_path(), "quality", report, directory / "quality.json")
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    console.print(table(args.model, results))
    items = comparisons(results)
    if items:
        console.print(comparisons_table(items))
    for r in results:
        if r.parity_failed:
            console.print(
                f"[red]PARITY FAILURE[/red] {args.model}/{r.pair.id}: in-tree cross-check {r.cross_check.line()}"
            )
    console.print(f"quality report written: {directory}/index.html")
    return exit_code(results)
