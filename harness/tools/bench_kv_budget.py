"""`bench-kv`'s wall-clock budget: what a cell should cost, estimated from the cells already run.

On a CPU with the reference BLAS the prefill's attention dominates a long-context run, and it
grows with the query-key pairs it computes (`attention_work`: chunk by chunk, each chunk of
queries against every key it sees; a rotating window keeps max_size - 1 old keys). A side's run
of a configuration at a longer context is estimated from its run at the longest shorter context
measured (this configuration's if there is one, else the slowest there): the prefill scaled by
the ratio of attention work, the decode by the ratio of tokens held (each step reads them all).
A cell also pays its processes' start (import, model load, warm-up): the most seen so far.
"""

from __future__ import annotations

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


def estimate_run_s(config: KVConfig, context: int, chunk: int, cells: list[dict[str, Any]]) -> float | None:
    """Seconds one side's run should take; None when no shorter context has been measured."""
    measured = [c for c in cells if c.get("sides") and c["context"] < context]
    if not measured:
        return None
    longest = max(c["context"] for c in measured)
    at_longest = [c for c in measured if c["context"] == longest]
    same = [c for c in at_longest if c["config"] == config.name] or at_longest
    work_ratio = attention_work(context, chunk, config.window) / attention_work(longest, chunk, config.window)
    held_ratio = _held(context, config) / _held(longest, config)
    return max(
        r["prefill_s"] * work_ratio + r["decode_s"] * held_ratio for c in same for r in c["sides"]["in-tree"]["runs"]
    )


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
