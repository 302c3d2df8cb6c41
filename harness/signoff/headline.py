"""One line per non-passing check, for the Blocking lists: where it differs, and in which module.

A logits failure's summary is long (both sides' top-5 and the element statistics come before
the localization), so a list that clipped it lost the one thing a reader acts on: the first
diverging module. The headline is built from the result's details instead: the step, its
max ULP and (where the report has them) KL and top-1 at that step, then the module
(`details.localization`, harness/checks/localize.py `as_dict`), which is never clipped.
"""

from __future__ import annotations

from typing import Any

from harness.report import ItemResult

CLIP = 160  # characters of a summary shown when there is no vector difference to describe
_MODULE_MARK = "; first diverging module:"


def clip(text: str, limit: int = CLIP) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def headline(r: ItemResult) -> str:
    """'step 0, max ULP 9, KL 3.1e-07, top-1 agrees — first diverging module model.layers.7.mlp'."""
    details = r.details if isinstance(r.details, dict) else {}
    diff = details.get("first_step_diff") or details.get("first_diff")
    step = r.first_bad_step
    if isinstance(diff, dict) and "max_ulp" in diff and not diff.get("shape_mismatch") and step is not None:
        text = f"step {step}{details.get('row_label', '')}, max ULP {diff['max_ulp']}"
        at = _step_entry(details, step)
        if at is not None and _number(at.get("kl")):
            text += f", KL {at['kl']:.2g}, top-1 {'agrees' if at.get('top1') else 'differs'}"
    else:
        text = clip(r.summary.split(_MODULE_MARK)[0])
    where = details.get("localization")
    if isinstance(where, dict):
        if where.get("module"):
            text += f" — first diverging module {where['module']}"
        else:
            text += f" — all {where.get('modules_compared')} module outputs agree (outside the model graph)"
        if where.get("row") is not None and where["row"] != step:
            text += f" (localized at step {where['row']}, the scenario's earliest)"
    elif _MODULE_MARK in r.summary:  # e.g. "unavailable (... has no module taps)": said, not clipped away
        text += " — first diverging module:" + clip(r.summary.split(_MODULE_MARK, 1)[1], 100)
    return text


def _step_entry(details: dict[str, Any], step: int) -> dict[str, Any] | None:
    return next((s for s in details.get("per_step") or [] if isinstance(s, dict) and s.get("step") == step), None)


def _number(value: Any) -> bool:
    """A JSON number (a report writes a non-finite float as a string, a missing KL as null)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
