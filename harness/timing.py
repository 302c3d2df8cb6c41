"""Where a parity run's wall time goes: exclusive wall time per phase (issue 18).

Phases nest (an oracle generation runs inside a check's first call, a venv check inside the
oracle's run, a model load inside an in-tree run): the clock charges every interval to the
innermost open phase only, so the phases' times never overlap and, with the `other` row
(imports, collection bookkeeping, pytest itself), they sum to the wall time.

One clock per process (`clock`). Under pytest-xdist each worker has its own: a worker ships
each item's phase times with the item's result and the controller adds them up, which then
measure worker time (the workers run at once), not the controller's wall time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

# The phases, in the order a breakdown lists them (one not named here comes after them).
PHASES = (
    "collection",
    "venv",
    "artifact",
    "artifact convert",
    "twin build",
    "goldens read",
    "in-tree load",
    "in-tree free",
    "in-tree free (repeat)",
    "in-tree teacher_forced",
    "in-tree compiled",
    "in-tree compiled (repeat)",
    "in-tree streamed",
    "judging",
    "localization",
    "report",
)
ORACLE_PREFIX = "oracle "  # "oracle mlx-lm": one generator process of that oracle (per call)


def in_tree_phase(mode: str, repeat: bool = False) -> str:
    return f"in-tree {mode}{' (repeat)' if repeat else ''}"


def oracle_phase(oracle: str) -> str:
    return f"{ORACLE_PREFIX}{oracle}"


class PhaseClock:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start the run's clock now, with no phase recorded."""
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[str] = []
        self._mark = self.started
        self._thread = threading.get_ident()  # phases are charged on this thread only
        # Work done beside the phases (the oracle generating while the in-tree side runs): its
        # own seconds, outside the exclusive rows (only the wait for it is a row).
        self.beside: dict[str, float] = {}

    def _charge(self, now: float) -> None:
        if self._stack:
            top = self._stack[-1]
            self.seconds[top] = self.seconds.get(top, 0.0) + (now - self._mark)
        self._mark = now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time spent inside, less the time of the phases opened inside, is charged to `name`.

        Only on the clock's own thread: a phase opened on another thread (the oracle's
        generation running beside the in-tree side, harness/goldens/lifecycle.py) overlaps the
        main thread's phases and is not charged; the main thread's wait for it is."""
        if threading.get_ident() != self._thread:
            yield
            return
        self._charge(time.perf_counter())
        self._stack.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            yield
        finally:
            self._charge(time.perf_counter())
            self._stack.pop()

    def add_beside(self, name: str, seconds: float) -> None:
        self.beside[name] = self.beside.get(name, 0.0) + seconds

    def totals(self) -> dict[str, float]:
        """Exclusive seconds per phase so far (an open phase's time up to now included)."""
        self._charge(time.perf_counter())
        return dict(self.seconds)

    def wall(self) -> float:
        return time.perf_counter() - self.started


clock = PhaseClock()


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The phase seconds spent between two `totals()` (those that grew)."""
    out = {k: after[k] - before.get(k, 0.0) for k in after}
    return {k: v for k, v in out.items() if v > 0}


def _order(name: str) -> tuple[int, str]:
    if name in PHASES:
        return (PHASES.index(name), name)
    return (len(PHASES) if name.startswith(ORACLE_PREFIX) else len(PHASES) + 1, name)


def in_tree_seconds(seconds: dict[str, float]) -> float:
    """The in-tree passes' seconds: every `in-tree <mode>` row, repeats included, the load not
    (issue 18's target: a warm run within 1.1 x the sum of its in-tree passes)."""
    return sum(v for k, v in seconds.items() if k.startswith("in-tree ") and k != "in-tree load")


def breakdown(
    seconds: dict[str, float],
    calls: dict[str, int],
    wall: float,
    workers: int = 0,
    worker_seconds: float = 0.0,
    controller_seconds: float = 0.0,
    beside: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The report's `timing`: one row per phase (exclusive seconds, times entered), then `other`.

    In one process the rows sum to `wall`, and `other` is the time outside every phase. With
    xdist workers (`workers` > 0) the rows are busy seconds: the workers' item time
    (`worker_seconds`) plus the controller's own phases (`controller_seconds`: collection,
    report). `other` is then the items' time outside any phase, and the rows sum to `total`.
    The controller's remaining wall time is spent waiting for the workers: it is reported as
    `controller_waiting_seconds`, outside the rows (counted as `other`, it would look like
    overhead that does not exist). `total_over_in_tree` is the busy total over the in-tree
    passes' seconds. `beside_seconds`: work that ran beside the phases (the oracle generating
    while the in-tree side ran), its own seconds; only the wait for it is in the rows."""
    rows = [
        {"phase": name, "seconds": round(seconds[name], 3), "calls": calls.get(name, 0)}
        for name in sorted(seconds, key=_order)
    ]
    phased = sum(seconds.values())
    total = worker_seconds + controller_seconds if workers else wall
    rows.append({"phase": "other", "seconds": round(max(total - phased, 0.0), 3), "calls": 0})
    in_tree = in_tree_seconds(seconds)
    out: dict[str, Any] = {
        "wall_seconds": round(wall, 3),
        "total_seconds": round(total, 3),
        "workers": workers,
        "phases": rows,
        "in_tree_seconds": round(in_tree, 3),
        "total_over_in_tree": round(total / in_tree, 4) if in_tree > 0 else None,
    }
    if workers:
        out["controller_waiting_seconds"] = round(max(wall - controller_seconds, 0.0), 3)
    if beside:
        out["beside_seconds"] = {name: round(v, 3) for name, v in sorted(beside.items(), key=lambda kv: _order(kv[0]))}
    return out


def format_breakdown(timing: dict[str, Any]) -> list[str]:
    """Compact lines for the terminal: phase, seconds, share of the total, times entered; then
    the in-tree passes' share."""
    total = timing["total_seconds"] or 1.0
    head = f"time to verdict: {timing['wall_seconds']:.1f} s wall"
    if timing.get("workers"):
        head += (
            f" ({timing['workers']} workers: the rows are busy seconds, {timing['total_seconds']:.1f} s in all;"
            f" the controller waited {timing.get('controller_waiting_seconds', 0.0):.1f} s)"
        )
    lines = [head]
    for row in timing["phases"]:
        calls = f"  x{row['calls']}" if row["calls"] > 1 else ""
        lines.append(f"  {row['phase']:<28} {row['seconds']:9.2f} s {100 * row['seconds'] / total:5.1f} %{calls}")
    for name, seconds in timing.get("beside_seconds", {}).items():
        waited = next((r["seconds"] for r in timing["phases"] if r["phase"] == name), 0.0)
        lines.append(
            f"  {name} ran {seconds:.1f} s beside the in-tree side; {waited:.1f} s of it was waited for (its row)"
        )
    ratio = timing.get("total_over_in_tree")
    if ratio is not None:
        lines.append(
            f"  in-tree passes: {timing['in_tree_seconds']:.1f} s of {timing['total_seconds']:.1f} s"
            f" ({ratio:.3f} x the in-tree passes)"
        )
    return lines
