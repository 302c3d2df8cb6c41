"""A known-failing implementation still catches new faults (issue 46 part 5).

A check that already fails cannot fail harder: a fault planted in a package whose logits already
differ leaves the verdict matrix as it was, and only the numbers move. So each run's figures (the
steps that differ, the elements that differ, the largest |Δ|) are kept in the results store
(harness/history/store.py, `results.figures`), and each check of a new run is compared with the
same check in the implementation's previous run of the same profile: the same model, profile
file and golden manifests on the same device key (the implementation itself may differ: that is
what is being watched). A failing check whose figures got worse is **regressed**:

- a step differs that did not (an index into the check's per-step rows), or
- the largest |Δ| grew by more than its noise, or more elements differ than the noise allows.

The noise is what the implementation's own reruns show: the spread of the figure over the earlier
runs of the exact same identity (implementation included) as the previous run; zero for a
deterministic implementation, whose reruns agree bit for bit (the harness refuses one that does
not before comparing anything). A failing check whose figures changed otherwise (better, or
only the first bad step moved) is **moved**; a check that passed before and fails now is a
**new failure**. None of this changes a verdict: the report lists them (`regressions`) and the
screen says so, one line each.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from harness.history.figures import figures
from harness.history.store import HistoryError, _identities, connect

REGRESSED, MOVED, NEW = "regressed", "moved", "new failure"
NOISE_RUNS = 5  # how many reruns of the previous run's identity give the noise


def compare_with_previous(report: dict[str, Any], db: Path) -> list[dict[str, Any]]:
    """Each failing check of `report` against its previous run in the store at `db` (none there:
    nothing to compare, an empty list). A store that cannot be read raises HistoryError."""
    if not db.is_file():
        return []
    context = report.get("context", {})
    device = context.get("device", {})
    device_key = device.get("key") or device.get("device_key")
    now_ids = _identities(context)
    out = []
    with connect(db, write=True) as conn:  # write: an older schema is migrated first, as the run's own record does
        for row in report.get("results", []):
            if row.get("outcome") != "failed":
                continue
            ids = now_ids.get(row["model"]) or {}
            if not (ids.get("profile") and ids.get("goldens") and device_key):
                continue  # an unknown identity is paired with nothing
            found = _previous(conn, row, device_key, ids)
            if found is not None:
                entry = _judge(row, *found)
                if entry is not None:
                    out.append(entry)
    return out


def _previous(
    conn: sqlite3.Connection, row: dict[str, Any], device_key: str, ids: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The latest earlier result of this check on the same profile, goldens and device, and the
    figures of the earlier reruns of that result's exact identity (its noise)."""
    rows = conn.execute(
        "SELECT r.id, r.started, r.commit_sha, r.identities, s.outcome, s.figures FROM results s "
        "JOIN runs r ON r.id = s.run_id WHERE s.model = ? AND s.scenario = ? AND s.check_name = ? "
        "AND r.device_key = ? AND r.kind = 'parity' ORDER BY r.id DESC",
        (row["model"], row["scenario"], row["check"], device_key),
    ).fetchall()
    same = []
    for run_id, started, commit, identities, outcome, figs in rows:
        mine = (json.loads(identities) if identities else {}).get(row["model"]) or {}
        if mine.get("profile") == ids["profile"] and mine.get("goldens") == ids["goldens"]:
            same.append((run_id, started, commit, mine.get("key"), outcome, json.loads(figs) if figs else None))
    if not same or (same[0][4] == "failed" and same[0][5] is None):
        return None  # never run this way, or run before figures were kept
    run_id, started, commit, key, outcome, figs = same[0]
    previous = {"run": run_id, "started": started, "commit": commit, "outcome": outcome, "figures": figs}
    reruns = [f for _, _, _, k, o, f in same[: NOISE_RUNS + 1] if key and k == key and o == outcome and f]
    return previous, reruns


def _judge(row: dict[str, Any], previous: dict[str, Any], reruns: list[dict[str, Any]]) -> dict[str, Any] | None:
    now = figures(row) or {}
    base = {"model": row["model"], "scenario": row["scenario"], "check": row["check"], "since": previous}
    if previous["outcome"] != "failed":
        return base | {"kind": NEW, "figures": now, "why": [f"passed in run {previous['run']}"]}
    was = previous["figures"]
    noise = {k: _spread(reruns, k) for k in ("max_abs", "n_differing")}
    why, worse = [], False
    new_steps = sorted(set(now.get("steps_differing", [])) - set(was.get("steps_differing", [])))
    if new_steps:
        worse = True
        why.append(f"{len(new_steps)} more step(s) differ (first: row {new_steps[0]})")
    for key, label in (("max_abs", "max |Δ|"), ("n_differing", "elements differing")):
        a, b = was.get(key), now.get(key)
        if a is None or b is None or abs(b - a) <= noise[key]:
            continue
        worse |= b > a
        why.append(f"{label} {_fmt(a)} → {_fmt(b)}" + (f" (noise {_fmt(noise[key])})" if noise[key] else ""))
    if not why and was.get("first_bad_step") != now.get("first_bad_step"):
        why.append(f"first bad step {was.get('first_bad_step')} → {now.get('first_bad_step')}")
    if not why:
        return None
    return base | {"kind": REGRESSED if worse else MOVED, "figures": now, "why": why}


def _spread(reruns: list[dict[str, Any]], key: str) -> float:
    values = [f[key] for f in reruns if isinstance(f.get(key), int | float)]
    return max(values) - min(values) if len(values) > 1 else 0.0


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def lines(regressions: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The screen's lines, each with its style: one per regressed (red) or moved (yellow) check,
    and one per model for its new failures (checks that passed in the previous run)."""
    out = []
    for r in regressions:
        if r["kind"] == NEW:
            continue
        tail = "already failing, now worse" if r["kind"] == REGRESSED else "already failing; its figures changed"
        head = "REGRESSED" if r["kind"] == REGRESSED else "moved"
        text = f"{head} {r['model']}/{r['scenario']}/{r['check']} since {_when(r['since'])}: {'; '.join(r['why'])}"
        out.append((f"{text}: {tail}", "red" if r["kind"] == REGRESSED else "yellow"))
    new: dict[str, list[dict[str, Any]]] = {}
    for r in regressions:
        if r["kind"] == NEW:
            new.setdefault(r["model"], []).append(r)
    for model, rows in new.items():
        names = ", ".join(f"{r['scenario']}/{r['check']}" for r in rows[:4]) + (", …" if len(rows) > 4 else "")
        out.append(
            (f"new failures of {model} since {_when(rows[0]['since'])}: {len(rows)} check(s) ({names})", "yellow")
        )
    return out


def _when(since: dict[str, Any]) -> str:
    return f"run {since['run']} ({str(since.get('started') or '')[:10]}, {str(since.get('commit') or '?')[:9]})"


def safely(report: dict[str, Any], db: Path) -> tuple[list[dict[str, Any]], str | None]:
    """`compare_with_previous`, or no comparison and the line saying why the store could not say."""
    try:
        return compare_with_previous(report, db), None
    except HistoryError as e:
        return [], f"regressions: not compared with the previous run: {e}"
