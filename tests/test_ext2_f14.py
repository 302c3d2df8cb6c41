"""external-2 F14: a logits gate failing on a scenario whose prompts differ says its rows were
compared on different inputs (prompt_identity names where), so the logits failure is not read as a
cause of its own; with equal prompts it says nothing of the kind."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from harness.checks import registry
from harness.records import ScenarioRecord


def _context(golden: ScenarioRecord, actual: ScenarioRecord) -> SimpleNamespace:
    return SimpleNamespace(golden=lambda: golden, full_golden=lambda: golden, intree=lambda run: actual)


def _record(prompt: list[int], shift: float) -> ScenarioRecord:
    logits = np.arange(12, dtype=np.float32).reshape(3, 4) + np.float32(shift)
    return ScenarioRecord("chat", None, prompt, [3, 3, 3], logits, [0], mode="teacher_forced")


def test_a_logits_failure_after_different_prompts_says_so() -> None:
    golden = _record([1, 5, 6], 0.0)
    for check in ("prefill_logits", "teacher_forced_logits"):
        other = registry.get(check).judge(_context(golden, _record([1, 1, 5, 6], 0.5)))
        assert not other.passed and other.details["inputs_differ"] == "prompt_ids"
        said = "compared on different inputs: the prompts differ (prompt_identity says where)"
        assert other.summary.endswith(f"{said}, so every row differs from there")
        same = registry.get(check).judge(_context(golden, _record([1, 5, 6], 0.5)))
        assert not same.passed and "inputs_differ" not in same.details and "different inputs" not in same.summary
