"""Bounds a scenario's numbers and mappings must keep, checked at load (a profile error names
the key and the range): steps, prefill chunks, an L2 budget, a message's role."""

from __future__ import annotations

from typing import Any

from harness.errors import ProfileError

MAX_STEPS = 4096


def _check_budget(composition: dict[str, Any], where: str) -> None:
    """An L2 budget states its size; the number and its origin come from the scenario's
    calibration record (harness/goldens/calibration.py), which the gate requires to agree."""
    budget = composition.get("budget")
    if not isinstance(budget, dict):
        raise ProfileError(f"{where}.budget: expected {{max_differing_tokens: N}}")
    n = budget.get("max_differing_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ProfileError(f"{where}.budget.max_differing_tokens: expected an integer >= 0, got {n!r}")
    if "origin" in budget:
        raise ProfileError(
            f"{where}.budget.origin: the origin of a budget lives in its calibration record "
            "(goldens/<profile>/<key>/calibration/<scenario>.json, written by `make calibrate ARGS=--write`)"
        )
    unknown = set(budget) - {"max_differing_tokens"}
    if unknown:
        raise ProfileError(f"{where}.budget: unknown keys {sorted(unknown)}")
    unknown = set(composition) - {"kind", "budget"}
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")


def _check_counts(steps: int | None, prefill_step_size: int | None, where: str) -> None:
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise ProfileError(
            f"{where}.steps: expected an integer in [1, {MAX_STEPS}] (decode steps after the prefill), got {steps}"
        )
    if prefill_step_size is not None and prefill_step_size < 1:
        raise ProfileError(
            f"{where}.prefill_step_size: expected an integer >= 1 (prompt tokens per prefill chunk), "
            f"got {prefill_step_size}"
        )


def _check_message(message: dict[str, Any], where: str) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ProfileError(f"{where}.role: expected a string")
