"""The sign-off page's parts (issue 34 part 5): templates, Blocking headlines, plots.

Reports here are made by the harness's own code, never typed: per-step entries by
`compare_steps` on logits rows (one row perturbed where a test wants a difference), the
localization by `Localization.as_dict()` appended to the summary as the session does
(harness/session.py `_judge`). Fast: no model is loaded.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from pathlib import Path

import jinja2
import numpy as np
import pytest

from harness.checks.compare import compare_steps, diff_vectors
from harness.checks.localize import Localization
from harness.records import ScenarioRecord
from harness.report import ItemResult, build_report
from harness.signoff.cli import sign_off
from harness.signoff.headline import CLIP, headline
from harness.signoff.model import ParityReport
from harness.signoff.page import environment
from harness.signoff.plots import _STYLES, scenario_plots
from harness.signoff.waivers import Waiver

TODAY = dt.date(2026, 6, 1)
MODULE = "model.layers.7.mlp"
ROWS = 12


def _record(logits: np.ndarray) -> ScenarioRecord:
    tokens = [int(np.argmax(r)) for r in logits]
    return ScenarioRecord("s", "p", [1, 2], tokens, logits.astype(np.float32), [0])


def _logits(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((ROWS, 256)) * 4).astype(np.float32)


def _perturbed(golden: np.ndarray, bad: dict[int, float], flip: int | None = None) -> np.ndarray:
    """`golden` with step s nudged by a relative `bad[s]`, and step `flip`'s runner-up made top-1."""
    out = golden.copy()
    rng = np.random.default_rng(1)
    for step, scale in bad.items():
        out[step] += (rng.standard_normal(out.shape[1]) * scale * np.abs(out[step])).astype(np.float32)
    if flip is not None:
        out[flip, int(np.argsort(golden[flip])[-2])] = golden[flip].max() + 0.5
    return out


def _item(
    check: str,
    golden: np.ndarray,
    actual: np.ndarray,
    rows,
    scenario: str = "plain",
    localize: bool = True,
) -> ItemResult:
    """A logits check's report row as the session writes it, localized at its first bad step."""
    r = compare_steps(check, _record(golden), _record(actual), rows)
    if not r.passed and localize:
        step = r.first_bad_step
        where = Localization(step, MODULE, diff_vectors(golden[step], actual[step]), modules_compared=97)
        r.summary += f"; {where.explain()}"
        r.details["localization"] = where.as_dict()
    return ItemResult(
        model="m",
        scenario=scenario,
        check=check,
        tier="L1",
        oracle="mlx-lm",
        outcome="passed" if r.passed else "failed",
        summary=r.summary,
        first_bad_step=r.first_bad_step,
        details=r.details | {"per_step": r.per_step},
    )


def _report(items: list[ItemResult]) -> ParityReport:
    context = {"device": {"key": "cpu-test-device"}, "harness_commit": "abc", "provenance": {}}
    data = json.loads(json.dumps(build_report(items, context, dt.datetime.now(dt.UTC))))  # as read back
    return ParityReport.from_dict(data, "test report")


def _failing(flip: int | None = 6) -> list[ItemResult]:
    g = _logits()
    a = _perturbed(g, {s: 1e-6 * (s - 2) for s in range(3, ROWS)}, flip=flip)
    return [
        _item("prefill_logits", g, a, [0]),
        _item("decode_logits", g, a, range(1, ROWS)),
        _item("teacher_forced_logits", g, a, range(ROWS)),
        _item("decode_logits", g, g.copy(), range(1, ROWS), scenario="chat"),
    ]


def _section(page: str, section: str) -> str:
    match = re.search(rf'<section id="{section}"[^>]*>(.*?)</section>', page, re.S)
    assert match, f"no section {section}"
    return match.group(1)


def _render(tmp_path: Path, items: list[ItemResult], waivers: list[Waiver] | None = None) -> tuple[str, Path]:
    directory, _ = sign_off(_report(items), waivers or [], out=tmp_path, today=TODAY)
    return (directory / "index.html").read_text(), directory


# -- Blocking: the module is never cut off ----------------------------------------------------


def test_a_blocking_entry_names_the_first_diverging_module(tmp_path: Path) -> None:
    items = _failing()
    decode = items[1]
    assert decode.outcome == "failed" and decode.details["localization"]["module"] == MODULE
    # The summary is long, the module at its end: a list that clips the reason loses it.
    assert decode.summary.index(MODULE) > CLIP
    page, directory = _render(tmp_path, items)
    entries = re.findall(r"<li[^>]*><b>check (m/plain/\w+)</b> — <span>(.*?)</span></li>", _section(page, "blocking"))
    assert [cid for cid, _ in entries] == ["m/plain/decode_logits", "m/plain/teacher_forced_logits"]
    step, ulp = decode.first_bad_step, decode.details["first_step_diff"]["max_ulp"]
    for _, text in entries:
        assert text.startswith(f"FAIL: step {step}, max ULP {ulp}, KL ") and "top-1 agrees" in text
        assert text.endswith(f"— first diverging module {MODULE}")
    summary = (directory / "summary.md").read_text()
    assert f"- **check `m/plain/decode_logits`**: {entries[0][1]}" in summary
    junit = (directory / "junit.xml").read_text()
    assert f'message="{entries[0][1][len("FAIL: ") :]}"' in junit


def test_headlines_without_a_vector_difference_or_a_module() -> None:
    g = _logits()
    outside = _item("decode_logits", g, _perturbed(g, {4: 1e-5}), range(1, ROWS), localize=False)
    outside.details["localization"] = Localization(4, None, None, modules_compared=97).as_dict()
    assert headline(outside).endswith("— all 97 module outputs agree (outside the model graph)")
    later = _item("decode_logits", g, _perturbed(g, {6: 1e-5}), range(1, ROWS))
    later.details["localization"]["row"] = 2  # the scenario's earliest localization, reused
    assert headline(later).endswith(f"{MODULE} (localized at step 2, the scenario's earliest)")
    crash = ItemResult("m", "s", "greedy_tokens", "L1", "mlx-lm", "error", "x" * 400 + "; first diverging module: y")
    assert headline(crash) == "x" * (CLIP - 1) + "… — first diverging module: y"
    assert len(headline(ItemResult("m", "s", "eos_stop", "L1", "mlx-lm", "failed", "no EOS"))) == len("no EOS")


# -- plots --------------------------------------------------------------------------------------


def test_a_passing_report_has_no_flat_panels(tmp_path: Path) -> None:
    g = _logits()
    items = [_item("decode_logits", g, g.copy(), [1, 2], scenario=s) for s in ("a", "b")]
    items.append(_item("teacher_forced_logits", g, g.copy(), range(ROWS), scenario="c"))
    plots = scenario_plots(items)
    assert plots.figures == [] and plots.identical == ["m/a", "m/b", "m/c"]
    page, _ = _render(tmp_path, items)
    plots_html = _section(page, "plots")
    assert "<img" not in page and "3 scenarios bit-identical: no plot" in plots_html


def test_a_differing_scenario_plots_kl_top1_and_relative_difference() -> None:
    from PIL import Image

    items = _failing(flip=6)
    plots = scenario_plots(items)
    assert plots.identical == ["m/chat"] and [(f.model, f.scenario) for f in plots.figures] == [("m", "plain")]
    (figure,) = plots.figures
    assert figure.panels == [
        "KL(p_oracle ‖ p_in-tree) per step",
        "top-1 per step",
        "max |Δ| / oracle logit range per step",
        "ULP distance histogram (elements)",
    ]
    assert figure.notes == [] and figure.legend == ["prefill_logits", "decode_logits", "teacher_forced_logits"]
    with Image.open(io.BytesIO(figure.png)) as image:
        assert image.size[0] > 4 * 250 and image.size[1] > 200  # four panels side by side
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 50  # drawn, not blank
    # Every step entry carries what the panels read (harness/checks/compare.py).
    entry = items[1].details["per_step"][0]
    assert {"kl", "top1", "logit_range", "max_abs_diff", "max_ulp", "n_differing"} <= set(entry)


def test_a_check_without_per_step_figures_is_no_series() -> None:
    """A row decided by its sha256 digest (bit-identical, no full vectors) has no KL, top-1 or
    logit range: it is not drawn, nor named in the legend."""
    items = _failing()
    items[0] = _item("prefill_logits", _logits(), _logits(), [0])
    items[0].details["per_step"] = [{"step": 0, "max_abs_diff": 0.0, "max_ulp": 0, "n_differing": 0}]
    (figure,) = scenario_plots(items).figures
    assert figure.legend == ["decode_logits", "teacher_forced_logits"]


def test_a_panel_whose_series_are_all_zero_is_left_out_and_said() -> None:
    (figure,) = scenario_plots(_failing(flip=None)).figures
    assert "top-1 per step" not in figure.panels and "KL(p_oracle ‖ p_in-tree) per step" in figure.panels
    assert figure.notes == ["top-1 agrees at every step: no top-1 plot"]


def test_an_older_report_without_kl_or_range_plots_the_raw_difference_and_says_so() -> None:
    items = _failing()
    for r in items:
        for entry in r.details["per_step"]:
            for key in ("kl", "top1", "logit_range"):
                entry.pop(key)
    (figure,) = scenario_plots(items).figures
    assert figure.panels == [
        "max |Δ| per step (raw: no logit range in the report)",
        "ULP distance histogram (elements)",
    ]
    assert any("no KL per step in the report" in n for n in figure.notes)


def test_series_are_told_apart_by_marker_and_line_style() -> None:
    markers = [s["marker"] for s in _STYLES]
    lines = [s["linestyle"] for s in _STYLES]
    assert len(set(markers)) == len(set(lines)) == len(_STYLES)
    assert len({s["markersize"] for s in _STYLES[:3]}) == 3  # overlapping hollow markers stay visible


# -- templates ----------------------------------------------------------------------------------


def test_the_templates_autoescape_report_text(tmp_path: Path) -> None:
    hostile = "<script>alert(1)</script>"
    items = _failing()
    items[1].summary = f"{hostile} & more"
    waiver = Waiver(check="m/plain/teacher_forced_logits", reason=f"because {hostile}", owner='o"wner', expires=TODAY)
    page, _ = _render(tmp_path, items, [waiver])
    assert page.count("<script") == 1  # the page's own filter script, nothing from the report
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in _section(page, "problems")
    assert "because &lt;script&gt;alert(1)&lt;/script&gt;" in _section(page, "waivers")
    assert "o&#34;wner" in _section(page, "waivers")


def test_the_environment_escapes_and_refuses_undefined_names() -> None:
    env = environment()
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ not_given }}").render()


def test_the_page_has_every_section_and_stays_self_contained(tmp_path: Path) -> None:
    page, _ = _render(tmp_path, _failing())
    for section in ("matrix", "blocking", "diff", "waivers", "problems", "plots", "quality", "certificates"):
        _section(page, section)
    for section in ("timings", "provenance"):
        _section(page, section)
    for needle in ('id="verdict"', 'id="verdict-matrix"', 'id="only-problems"', "<footer"):
        assert needle in page
    assert page.count("<head>") == 1 and "<link" not in page and "url(" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', page)) == 1
