"""`bench-kv`'s wall-clock budget: what a cell should cost, estimated from the cells already run.

On a CPU with the reference BLAS the prefill's attention dominates a long-context run, and it
grows with the query-key pairs it computes (`attention_work`: chunk by chunk, each chunk of
queries against every key it sees; a rotating window keeps max_size - 1 old keys). A side's run
of a configuration at a longer context is estimated from the cells already measured (see
`estimate_run_s`): the prefill by attention work, the decode by the tokens held (each step reads
them all). A cell also pays its processes' start (import, model load, warm-up): the most seen so
far. Oracle sides wait for the in-tree sides: a cell runs its oracle side only if the in-tree
sides of every cell still to come fit in what is left after it.
"""

from __future__ import annotations

import statistics
from typing import Any

from harness.tools.bench_kv_configs import KVConfig


def attention_work(context: int, chunk: int, window: int | None = None) -> int:
    """Query-key pairs of a chunked prefill of `context` tokens (the last one runs alone, as
    mlx-lm's generate_step runs it); with a window, what a rotating cache lets each chunk see."""
    work, held, remaining = 0, 0, context - 1
    while remaining > 0:
        n = min(chunk, remaining)
        visible = held if window is None else min(held, window - 1)
        work += n * (visible + n)
        held += n
        remaining -= n
    return work + (held + 1 if window is None else min(held + 1, window))


def _held(context: int, config: KVConfig) -> int:
    return context if config.window is None else min(context, config.window)


def _medians(cell: dict[str, Any]) -> tuple[float, float]:
    """The in-tree side's median prefill and decode seconds in a measured cell."""
    runs = cell["sides"]["in-tree"]["runs"]
    return statistics.median(r["prefill_s"] for r in runs), statistics.median(r["decode_s"] for r in runs)


def _prefill_fit(points: list[tuple[int, float]], chunk: int, window: int | None) -> tuple[float, float] | None:
    """(a, b) of prefill_s = a x tokens + b x attention_work through the last two points, if both are >= 0."""
    (n1, p1), (n2, p2) = points[-2:]
    w1, w2 = attention_work(n1, chunk, window), attention_work(n2, chunk, window)
    det = n1 * w2 - n2 * w1
    if det == 0:
        return None
    a, b = (p1 * w2 - p2 * w1) / det, (n1 * p2 - n2 * p1) / det
    return (a, b) if a >= 0 and b >= 0 else None


def estimate_run_s(config: KVConfig, context: int, chunk: int, cells: list[dict[str, Any]]) -> float | None:
    """Seconds one side's run should take; None when no shorter context has been measured.

    From this configuration's own runs at shorter contexts if there are any, else from the
    slowest configuration at the longest shorter context. With two of its own contexts the
    prefill is fitted as linear + attention work; with one, all of it is scaled by the attention
    work (an upper bound: the projections and MLP grow only linearly)."""
    measured = sorted((c for c in cells if c.get("sides") and c["context"] < context), key=lambda c: c["context"])
    if not measured:
        return None
    own = [c for c in measured if c["config"] == config.name]
    if not own:
        longest = measured[-1]["context"]
        own = [max((c for c in measured if c["context"] == longest), key=lambda c: sum(_medians(c)))]
    points = [(c["context"], _medians(c)[0]) for c in own]
    base, (prefill_s, decode_s) = own[-1]["context"], _medians(own[-1])
    fit = _prefill_fit(points, chunk, config.window) if len(points) >= 2 else None
    if fit is not None:
        prefill = fit[0] * context + fit[1] * attention_work(context, chunk, config.window)
    else:
        prefill = prefill_s * attention_work(context, chunk, config.window) / attention_work(base, chunk, config.window)
    return prefill + decode_s * _held(context, config) / _held(base, config)


def startup_s(cells: list[dict[str, Any]]) -> float:
    """The longest a cell has spent outside its timed runs (process start, load, warm-up)."""
    spent = [
        c["wall_s"] - sum(r["prefill_s"] + r["decode_s"] for s in c["sides"].values() for r in s["runs"])
        for c in cells
        if c.get("sides")
    ]
    return max(spent, default=0.0)


def alone_s(config: KVConfig, context: int, n_rounds: int, chunk: int, cells: list[dict[str, Any]]) -> float:
    """The in-tree side alone of a cell, estimated (0 when there is nothing to estimate from)."""
    per_run = estimate_run_s(config, context, chunk, cells)
    return 0.0 if per_run is None else startup_s(cells) + n_rounds * per_run


def plan_cell(
    config: KVConfig,
    context: int,
    n_rounds: int,
    oracle: bool,
    left_s: float,
    budget_s: float,
    chunk: int,
    cells: list[dict[str, Any]],
    reserve_s: float = 0.0,
) -> tuple[bool, dict[str, str]]:
    """(run the oracle side too?, notes): `oracle_not_run` when only the in-tree side fits (the
    oracle side must also leave `reserve_s`, the in-tree sides of the cells still to come at this
    context: every configuration's own figures before any comparison), `not_run` when even the
    in-tree side would overrun the time left."""
    per_run = estimate_run_s(config, context, chunk, cells)
    if per_run is None:  # nothing to estimate from: run it while any time is left
        spent = f"over budget: the --budget-s {budget_s:.0f} s are spent"
        return (oracle, {}) if left_s > 0 else (False, {"not_run": spent})
    start = startup_s(cells)
    alone, both = start + n_rounds * per_run, start + 2 * n_rounds * per_run
    left = max(left_s, 0.0)
    notes = {}
    if oracle and both + reserve_s > left:
        oracle = False
        notes["oracle_not_run"] = f"over budget: both sides estimated {both:.0f} s, {left:.0f} s left" + (
            f", {reserve_s:.0f} s of it kept for the in-tree sides still to run" if reserve_s else ""
        )
    if alone > left:
        notes["not_run"] = (
            f"over budget: estimated {alone:.0f} s for the in-tree side alone ({per_run:.0f} s a run), "
            f"{left:.0f} s of --budget-s {budget_s:.0f} left"
        )
    return oracle, notes
