"""Progress of a parity run: one live bar on a terminal (checks done of the total, the scenario
and phase at work, the time left), plain lines with the overall count elsewhere (CI=true), and
never pytest's dots glued onto them."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from harness.progress import Progress
from tests.test_pytest_conventions import parity_streams, tree  # noqa: F401 - tree is a fixture


def _terminal_progress(monkeypatch: pytest.MonkeyPatch) -> tuple[Progress, io.StringIO]:
    monkeypatch.delenv("MLX_PARITY_QUIET", raising=False)
    monkeypatch.delenv("CI", raising=False)
    out = io.StringIO()
    p = Progress()
    p.console = Console(file=out, force_terminal=True, width=160, color_system=None)
    return p, out


def test_on_a_terminal_one_bar_counts_the_checks_and_names_the_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    p, out = _terminal_progress(monkeypatch)
    p.start_run(4)
    assert p.live
    with p.phase("localization (row 0)"):
        p.step("tiny/plain (teacher_forced)", 3, 9, 0.0)
    p.check_done(True)
    p.check_done(False)
    with p.task("building oracle venv mlx-lm"):
        pass
    p.end_run()
    text = out.getvalue()
    assert "plain (teacher_forced) for localization (row 0): step 3/9" in text
    assert re.search(r"2/4 checks", text) and "left" in text
    assert "building oracle venv mlx-lm: done in" in text  # an event prints above the bar
    assert not p.live


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_plain_lines_carry_the_overall_count(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    p, out = _terminal_progress(monkeypatch)
    monkeypatch.setenv("CI", ci)
    p.start_run(4)
    assert not p.live
    p.step("tiny/plain (free)", 8, 9, 0.0)
    p.check_done(True)
    p.scenario_done("tiny/plain", 1, 0, 1.5)
    p.end_run()
    lines = out.getvalue().splitlines()
    assert lines == [
        "parity [0/4 checks] tiny/plain (free): step 8/9 (" + lines[0].split("(")[-1],
        "parity [1/4 checks] tiny/plain: 1 checks, all passed (1.5s)",
    ]


def test_a_run_prints_a_line_per_scenario_and_no_dots(tree, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from harness.progress import progress

    monkeypatch.delenv("MLX_PARITY_QUIET", raising=False)
    monkeypatch.setenv("CI", "true")
    lines = io.StringIO()  # the progress stream itself (pytest's nested capture cannot reroute it)
    monkeypatch.setattr(progress, "console", Console(file=lines, width=200, color_system=None))
    code, out, _, rows = parity_streams(tree, capsys, "--model", "tiny", "-k", "logits")
    err = lines.getvalue()
    assert code == 0 and len(rows) == 6
    assert "parity [3/6 checks] tiny/plain: 3 checks, all passed" in err
    assert "parity [6/6 checks] tiny/chat: 3 checks, all passed" in err
    assert "..." not in out  # the scenario lines count them: no dot per check
