"""A real failing run signed off: its Blocking entries name the module, its plots have content.

smollm2-135m with every RMSNorm's eps changed (tests/test_gate_fails.py's perturbation, which
localizes to model.layers.0.input_layernorm there) is judged by the session, localization
included, against the real goldens; the rows are written as the pytest items write them
(harness/pytest_items.py `_details`) and signed off.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
from pathlib import Path

import pytest

from harness.pytest_items import _details
from harness.report import ItemResult, build_report
from harness.session import ParitySession
from harness.signoff.cli import sign_off
from harness.signoff.model import BLOCKED, ParityReport
from harness.signoff.plots import scenario_plots

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2-135m")]

MODEL = "smollm2-135m"
LOGITS = ("prefill_logits", "decode_logits", "teacher_forced_logits")


def _eps_changed(model) -> None:
    for layer in model.model.layers:
        layer.input_layernorm.eps = layer.post_attention_layernorm.eps = 1e-6
    model.model.norm.eps = 1e-6


def test_a_real_failing_runs_signoff_names_the_module_and_plots_kl_and_relative_difference(tmp_path: Path) -> None:
    session = ParitySession(model_hook=_eps_changed)
    profile = session.profile(MODEL)
    items = []
    for check in LOGITS:
        r = session.run_check(profile, profile.scenario("plain"), check)
        outcome = "passed" if r.passed else "failed"
        items.append(
            ItemResult(MODEL, "plain", check, "L1", "mlx-lm", outcome, r.summary, r.first_bad_step, 0.0, _details(r))
        )
    context = {"device": {"key": "cpu-test-device"}, "harness_commit": "abc", "provenance": {}}
    data = json.loads(json.dumps(build_report(items, context, dt.datetime.now(dt.UTC))))
    directory, doc = sign_off(ParityReport.from_dict(data, "real"), [], out=tmp_path, today=dt.date(2026, 6, 1))
    assert doc.signoff.verdict == BLOCKED

    modules = {r.check: r.details["localization"]["module"] for r in items}
    assert set(modules) == set(LOGITS) and all(modules.values()), modules
    page = (directory / "index.html").read_text()
    blocking = re.search(r'<section id="blocking".*?</section>', page, re.S).group(0)
    summary = (directory / "summary.md").read_text()
    for r in items:
        entry = html.unescape(re.search(rf"<b>check {MODEL}/plain/{r.check}</b> — <span>(.*?)</span>", blocking)[1])
        assert entry.startswith(f"FAIL: step {r.first_bad_step}, max ULP ")
        assert f"— first diverging module {modules[r.check]}" in entry
        assert entry in summary

    (figure,) = scenario_plots(doc.parity.results).figures
    assert figure.png and figure.legend == list(LOGITS)
    assert figure.panels[0] == "KL(p_oracle ‖ p_in-tree) per step"
    assert "max |Δ| / oracle logit range per step" in figure.panels
    relative = [s["max_abs_diff"] / s["logit_range"] for r in items for s in r.details["per_step"]]
    assert 0 < max(relative) < 1  # a small difference against the row's range, where ULP reads billions
