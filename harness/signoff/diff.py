"""What changed since the previous sign-off: checks that newly pass or fail, and provenance.

Outcomes are compared raw (passed vs failed/error), before waivers: a waiver changes whether
a failure blocks, not whether it happened. Provenance is compared as a tree; a subtree that
exists on one side only (a model added) is one change, not one per leaf.
"""

from __future__ import annotations

import json
from typing import Any

from harness.signoff.model import ParityReport, ProvenanceChange, ReportDiff

_MAX_VALUE_CHARS = 160


def diff_reports(current: ParityReport, previous: ParityReport, previous_path: str) -> ReportDiff:
    now, before = current.outcomes(), previous.outcomes()
    both = [c for c in now if c in before]
    previous_signoff = previous.signoff or {}
    return ReportDiff(
        previous=previous_path,
        previous_generated=str(previous_signoff.get("generated", previous.finished)),
        previous_verdict=str(previous_signoff.get("verdict", previous.verdict)),
        newly_passing=[c for c in both if now[c] == "passed" and before[c] != "passed"],
        newly_failing=[c for c in both if now[c] != "passed" and before[c] == "passed"],
        added=[c for c in now if c not in before],
        removed=[c for c in before if c not in now],
        provenance_changes=diff_trees(_provenance(previous), _provenance(current)),
    )


def _provenance(report: ParityReport) -> dict[str, Any]:
    # `models` only lists who ran: added/removed checks already say that.
    return {"harness_version": report.harness_version} | {k: v for k, v in report.context.items() if k != "models"}


def diff_trees(old: Any, new: Any, prefix: str = "") -> list[ProvenanceChange]:
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[ProvenanceChange] = []
        for key in list(old) + [k for k in new if k not in old]:
            path = f"{prefix}.{key}" if prefix else str(key)
            changes += diff_trees(old.get(key), new.get(key), path)
        return changes
    if old == new:
        return []
    return [ProvenanceChange(prefix, _show(old), _show(new))]


def _show(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, dict):
        return f"{{{len(value)} keys}}"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "…"
