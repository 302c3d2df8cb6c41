"""The real thing: `make parity` on smollm2-135m, goldens from the real mlx-lm oracle venv.

Uses the repository's cache and goldens. On a fresh clone the tracked manifests have no
blobs in the cache yet: the oracle regenerates them during this run and the store checks
they hash to what the manifests recorded. Runs with two xdist workers, so golden locking
is exercised for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2-135m")]


def test_make_parity_passes_for_smollm2_in_both_modes(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_PARITY_")} | {"MLX_PARITY_QUIET": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "harness", "parity", "--model", "smollm2-135m", "--report", str(report_path), "-n", "2"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=1800,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "PASS"
    results = report["results"]
    scenarios = {r["scenario"] for r in results}
    assert {"plain", "chat", "multi-turn"} <= scenarios
    for scenario in scenarios:
        checks = {r["check"]: r for r in results if r["scenario"] == scenario}
        assert set(checks) == {
            "prompt_identity",
            "prefill_logits",
            "decode_logits",
            "teacher_forced_logits",
            "greedy_tokens",
            "eos_stop",
        }
        assert len(checks["decode_logits"]["details"]["per_step"]) >= 32  # free-running
        assert len(checks["teacher_forced_logits"]["details"]["per_step"]) >= 33  # teacher-forced
        assert all(s["n_differing"] == 0 for s in checks["decode_logits"]["details"]["per_step"])
    assert "Parity verdict: PASS" in out.stdout
