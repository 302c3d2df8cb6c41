"""`python -m harness history`: per check, its last runs per device key, the run where it first
failed (of the failures up to now), and flips on one commit and device, which are flaky.

A flip is a check that both passed and failed on the same commit, with no uncommitted changes,
on the same device key, against the same profile file, golden manifests and implementation (the
identity each run stores, harness/history/store.py): nothing that changes bits changed between
those runs, so at L1 the flake is a harness bug (or a nondeterministic backend), and it is
reported as such, never as a pass. Only a FAIL and a PASS make a flip: an ERROR (a stale golden,
a crash) or a skip says nothing about the bits, so it is shown but never makes one; a run of
unknown identity (appended before the store recorded it) is paired with none.
"""

from __future__ import annotations

import argparse
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UsageError
from harness.history.store import connect, store_path

MAX_LAST = 10_000  # runs shown per check: more is no screen's worth

MARK = {"passed": "✓", "failed": "F", "error": "E", "skipped": "s"}


@dataclass
class Run:
    id: int
    started: str
    commit: str | None
    dirty: bool | None
    device: str | None
    identity: str | None = None  # the model's profile/goldens/implementation identity; None: unknown


@dataclass
class Line:
    model: str
    scenario: str
    check: str
    tier: str | None
    device: str | None
    runs: list[tuple[Run, str, int | None, str | None]] = field(default_factory=list)  # run, outcome, step, module

    def first_failure(self) -> tuple[Run, int | None, str | None] | None:
        """The first run of the current streak of non-passing runs (None if the last passed)."""
        first = None
        for run, outcome, step, module in reversed(self.runs):
            if outcome == "passed":
                break
            first = (run, step, module)
        return first

    def flips(self) -> list[str]:
        """Commits (clean checkouts) on which this check both passed and failed, on this device,
        among runs of one known identity. ERROR and skipped rows never count."""
        by_run: dict[tuple[str, str], set[str]] = {}
        for run, outcome, _, _ in self.runs:
            if run.commit and run.dirty is False and run.identity and outcome in ("passed", "failed"):
                by_run.setdefault((run.commit, run.identity), set()).add(outcome)
        return sorted({commit for (commit, _), seen in by_run.items() if len(seen) == 2})


def read_lines(db: Path, model: str | None, check: str | None) -> tuple[list[Line], int]:
    where, params = ["u.kind = 'parity'"], []  # a sign-off's line repeats its parity runs' results
    if model:
        where.append("r.model = ?")
        params.append(model)
    if check:
        where.append("(r.check_name = ? OR r.scenario || '/' || r.check_name = ?)")
        params += [check, check]
    sql = (
        "SELECT u.id, u.started, u.commit_sha, u.dirty, u.device_key, r.model, r.scenario, r.check_name, r.tier, "
        "r.outcome, r.first_bad_step, r.module, r.identity FROM results r JOIN runs u ON u.id = r.run_id"
        + " WHERE "
        + " AND ".join(where)
        + " ORDER BY u.id, r.rowid"
    )
    lines: dict[tuple, Line] = {}
    with connect(db, write=False) as conn:
        total = conn.execute("SELECT COUNT(*) FROM runs WHERE kind = 'parity'").fetchone()[0]
        for row in conn.execute(sql, params):
            run = Run(row[0], row[1], row[2], None if row[3] is None else bool(row[3]), row[4], row[12])
            key = (row[5], row[6], row[7], row[4])
            line = lines.setdefault(key, Line(row[5], row[6], row[7], row[8], row[4]))
            line.runs.append((run, row[9], row[10], row[11]))
    return list(lines.values()), total


def render(lines: list[Line], last: int) -> list[str]:
    out = []
    for device in dict.fromkeys(line.device for line in lines):
        out.append(f"device {device}:")
        for line in (x for x in lines if x.device == device):
            shown = line.runs[-last:]
            marks = "".join(MARK.get(o, "?") for _, o, _, _ in shown)
            ids = f"runs {shown[0][0].id}..{shown[-1][0].id}"
            text = f"  {line.model}/{line.scenario}/{line.check}  {marks}  ({ids})"
            first = line.first_failure()
            if first is not None:
                run, step, module = first
                where = f", step {step}" if step is not None else ""
                where += f", first diverging module {module}" if module else ""
                commit = f"{run.commit}{'+dirty' if run.dirty else ''}" if run.commit else "unknown commit"
                text += f"\n      failing since run {run.id} ({run.started}, {commit}){where}"
            flips = line.flips()
            if flips:
                bug = " (an L1 check: a harness or backend bug)" if line.tier == "L1" else ""
                text += f"\n      FLAKY: passed and failed on commit {', '.join(flips)} on this device{bug}"
            out += text.splitlines()
    return out


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.last <= MAX_LAST:  # 0 would show every run, a negative one crash
        raise UsageError(f"--last must be between 1 and {MAX_LAST}, got {args.last}")
    db = Path(args.db) if args.db else store_path()
    try:
        lines, total = read_lines(db, args.model, args.check)
    except sqlite3.Error as e:  # connect names a bad file; a query that fails is named here
        print(f"error: results store {db}: {e}")
        return 2
    print(f"results store {db}: {total} runs; per check the last {args.last} runs (oldest first)")
    if not lines:
        print("no results match")
        return 0
    print("\n".join(render(lines, args.last)))
    return 0
