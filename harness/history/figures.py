"""A result's figures (issue 46 part 5): how far a failing check is from the oracle, as the
results store keeps them (`results.figures`) and harness/history/regress.py compares them."""

from __future__ import annotations

import math
from typing import Any


def figures(row: dict[str, Any]) -> dict[str, Any] | None:
    """How far a result is from the oracle, as its details record it: the per-step rows that
    differ (their indices), the differing elements and the largest |Δ|; None where it says none."""
    details = row.get("details") or {}
    out: dict[str, Any] = {}
    per_step = details.get("per_step")
    if isinstance(per_step, list) and per_step and all(isinstance(s, dict) for s in per_step):
        out["steps"] = len(per_step)
        out["steps_differing"] = [i for i, s in enumerate(per_step) if _number(s.get("n_differing"))]
        out["n_differing"] = sum(int(_number(s.get("n_differing"))) for s in per_step)
        out["max_abs"] = max(_number(s.get("max_abs_diff")) for s in per_step)
    elif _number(details.get("max_abs_diff")) or details.get("max_abs_diff") == 0:
        out["max_abs"] = _number(details["max_abs_diff"])
    if isinstance(row.get("first_bad_step"), int):
        out["first_bad_step"] = row["first_bad_step"]
    return out or None


def _number(value: Any) -> float:
    """A finite figure, else 0 (NaN and infinities are the check's own failure, said in its row)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0
