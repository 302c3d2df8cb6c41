"""The end-of-run screen is what the code prints: docs/screens/ holds two 80-column tmux
captures of `make parity` (a passing run, and the same clone with every in-tree RMSNorm output
nudged by 2^-20, where every scenario fails), and tests/fixtures/screens/ the JSON reports those
very runs wrote. Rendering each report at 80 columns gives the capture's last lines exactly.
"""

from __future__ import annotations

import gzip
import json
import re
import textwrap
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from harness.screen import FULL_BLOCKS, MATRIX_ROWS, matrix, render

SCREENS = REPO_ROOT / "docs" / "screens"
FIXTURES = Path(__file__).parent / "fixtures" / "screens"


def _as_displayed(text: str, width: int = 80) -> list[str]:
    """A line as an 80-column terminal shows it: cut every `width` characters."""
    return [text[i : i + width].rstrip() for i in range(0, max(len(text), 1), width)] or [""]


def _capture_and_report(name: str) -> tuple[list[str], dict]:
    capture = [line.rstrip() for line in (SCREENS / f"parity-{name}.txt").read_text().splitlines()]
    while capture and (capture[-1] in ("", "$") or capture[-1].startswith("make: *** ")):
        capture.pop()  # the shell's prompt after the run, and make's own line after a failing one
    with gzip.open(FIXTURES / f"parity-{name}.json.gz", "rt") as f:
        return capture, json.load(f)


@pytest.mark.parametrize("name", ["pass", "fail"])
def test_the_capture_ends_with_what_the_report_renders(name: str) -> None:
    capture, report = _capture_and_report(name)
    where = next(line for line in reversed(capture) if line.startswith("report: "))
    where_full = where
    i = capture.index(where)  # a long path wraps onto the next displayed line(s)
    while i + 1 < len(capture) and not capture[i + 1].startswith(("PASS ", "FAIL ")):
        i += 1
        where_full += capture[i]
    lines = [d for line in render(report, 80, where_full) for d in _as_displayed(line.text)]
    assert capture[-len(lines) :] == lines


def test_a_passing_screen_is_a_matrix_and_a_verdict() -> None:
    capture, report = _capture_and_report("pass")
    assert report["verdict"] == "PASS" and capture[-1].startswith("PASS smollm2-135m: all 99 checks passed")
    end = max(i for i, line in enumerate(capture) if re.match(r"\d+ passed in ", line))  # pytest's last line
    screen = capture[end + 1 :]
    assert len(screen) <= 40, f"{len(screen)} lines: more than one screen"
    assert not any(line.startswith(("FAIL ", "ERROR ")) for line in screen)


def test_a_failing_screen_explains_each_failure_and_ends_with_the_verdict() -> None:
    capture, report = _capture_and_report("fail")
    failed = [r for r in report["results"] if r["outcome"] != "passed"]
    assert report["verdict"] == "FAIL" and len({r["scenario"] for r in failed}) >= FULL_BLOCKS
    text = "\n".join(capture)
    blocks = re.findall(r"^FAIL smollm2-135m/\S+ \S+ · L\d vs \S+$", text, re.MULTILINE)
    assert len(blocks) == FULL_BLOCKS
    for label in ("differs", "by", "first", "module", "oracle", "in-tree", "at step"):
        assert re.search(rf"^  {label}\s", text, re.MULTILINE), label
    assert "model.layers.0.input_layernorm" in text  # every norm nudged: the first one diverges first
    commands = re.findall(r"^ .*(make parity MODEL=smollm2-135m SCENARIO=\S+ CHECK=\S+)$", text, re.MULTILINE)
    assert len(commands) == FULL_BLOCKS
    assert "regenerate this machine's goldens" not in text  # the oracle reproduced them here
    assert capture[-1].startswith(f"FAIL smollm2-135m: {len(failed)} failed")


def test_rendering_wraps_long_labelled_text_and_never_the_rerun_command() -> None:
    _, report = _capture_and_report("fail")
    row = next(r for r in report["results"] if r["outcome"] == "failed")
    row = dict(row, scenario="a-very-long-scenario-name-that-makes-the-command-longer-than-eighty")
    out = [line.text for line in render({"results": [row], "counts": {"failed": 1}, "verdict": "FAIL"}, 80)]
    command = next(line for line in out if line.startswith("    make parity"))  # too long: a line of its own
    assert len(command) > 80 and command.endswith(f"CHECK={row['check']}")
    wrapped = [line for line in out if line.startswith("  ") and not line.startswith("    make")]
    assert all(len(line) <= 80 for line in wrapped), textwrap.shorten(str(wrapped), 200)


def _rows(outcomes: dict[str, str], n: int) -> list[dict]:
    """n scenarios x 3 checks, all passing but for `outcomes` (scenario: outcome of its 2nd check)."""
    return [
        {
            "model": "big",
            "scenario": f"s{i:02d}",
            "check": check,
            "tier": "L1",
            "outcome": outcomes.get(f"s{i:02d}", "passed") if check == "c2" else "passed",
        }
        for i in range(n)
        for check in ("c1", "c2", "c3")
    ]


def test_a_large_profile_s_matrix_keeps_to_its_rows_failing_scenarios_first() -> None:
    shown = [line.text for line in matrix(_rows({}, MATRIX_ROWS), 80)]
    assert sum(line.startswith("s") for line in shown) == MATRIX_ROWS and not any("more scenarios" in x for x in shown)
    lines = [line.text for line in matrix(_rows({"s20": "failed", "s25": "error"}, 30), 80)]
    rows = [line.split()[0] for line in lines if line.startswith("s")]
    assert len(rows) == MATRIX_ROWS and {"s20", "s25"} <= set(rows) and rows == sorted(rows)  # run order kept
    assert "s20 L1   ✓  F  ✓" in lines and "s25 L1   ✓  E  ✓" in lines
    (folded,) = [x for x in lines if "more scenarios" in x]
    hidden = sorted({f"s{i:02d}" for i in range(30)} - set(rows))
    assert folded == f"+ {len(hidden)} more scenarios where every planned check passed: {', '.join(hidden)}"
    lines = [line.text for line in matrix(_rows({f"s{i:02d}": "failed" for i in range(20)}, 20), 80)]
    assert sum(line.startswith("s") for line in lines) == MATRIX_ROWS
    assert "+ 4 more scenarios where a check did not pass: s16, s17, s18, s19" in lines


def _non_finite_report(case: str) -> dict:
    """The report of a run whose in-tree logits hold NaN or ±Infinity, as the hostile probe's
    plug-in sent them (FAKE_MODE nan, nan_all, nan_top, inf, neginf_row), written as a report is."""
    import datetime as dt
    import warnings

    import numpy as np

    from harness.checks.compare import compare_steps
    from harness.pytest_items import _details
    from harness.records import ScenarioRecord
    from harness.report import ItemResult, build_report

    oracle = np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32)
    in_tree = oracle.copy()
    if case == "nan":
        in_tree[3, 7] = np.nan
    elif case == "nan_all":
        in_tree[:] = np.nan
    elif case == "nan_top":
        in_tree[3, int(np.argmax(in_tree[3]))] = np.nan
    elif case == "inf":
        in_tree[3, 7] = np.inf
    elif case == "neginf_row":
        in_tree[5] = -np.inf
    records = [ScenarioRecord("plain", None, [1, 2], list(range(6)), x, [0]) for x in (oracle, in_tree)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "All-NaN slice encountered"
        result = compare_steps("decode_logits", *records, range(6))
    row = ItemResult(
        "fakeplug",
        "plain",
        "decode_logits",
        "L1",
        "mlx-lm",
        "failed",
        result.summary,
        result.first_bad_step,
        details=_details(result),
    )
    report = build_report([row], {"models": ["fakeplug"]}, dt.datetime.now(dt.UTC))
    return json.loads(json.dumps(report, allow_nan=False))  # as the file holds it: strict JSON


@pytest.mark.parametrize(
    ("case", "mode", "spelled"),
    [
        ("P13", "nan", "NaN"),
        ("P14", "nan_all", "NaN"),
        ("P15", "nan_top", "NaN"),
        ("P16", "inf", "Infinity"),
        ("P17", "neginf_row", "Infinity"),
    ],
)
def test_m1_p13_p17_non_finite_logits_render_the_whole_screen(case: str, mode: str, spelled: str) -> None:
    """M1 (P13-P17): a report holds non-finite numbers as "NaN"/"Infinity" strings; the screen
    renders every part (failure block, matrix, verdict) and says the values are non-finite."""
    report = _non_finite_report(mode)
    assert report["results"][0]["details"]["first_step_diff"]["max_abs_diff"] == spelled  # a string in the file
    text = [line.text for line in render(report, 80, "report: reports/x.json")]
    assert text[0] == "FAIL fakeplug/plain decode_logits · L1 vs mlx-lm", case
    by = next(line for line in text if line.startswith("  by "))
    assert f"max |Δ| {spelled} (non-finite logits)" in by, by
    first = next(line for line in text if line.startswith("  first "))
    assert first.endswith("(non-finite)") and "'" not in first, first
    assert any(line.startswith("  rerun ") for line in text)
    assert "plain L1   F" in text  # the matrix
    assert text[-1] == "FAIL fakeplug: 1 failed, 0 passed of 1"
    if mode in ("nan_all", "neginf_row"):  # no logit finite on both sides: no KL, said so
        assert any("KL(oracle‖in-tree) none" in line for line in text), text


def test_ext2_f11_a_tensor_failure_speaks_of_values_not_logits() -> None:
    """external-2 F11: the encoder_output failure read "max |diff| 15.2 (0.665 of the logit range
    22.9)" and listed a top-5 over the flattened 1x1500x384 tensor; a tensor's block speaks of its
    value range and shows no top-5, in the screen and in the summary."""
    import datetime as dt

    import numpy as np

    from harness.checks.compare import compare_array
    from harness.pytest_items import _details
    from harness.records import ScenarioRecord
    from harness.report import ItemResult, build_report

    oracle = np.random.default_rng(1).standard_normal((1, 30, 8)).astype(np.float32)
    in_tree = oracle.copy()
    in_tree[0, 4, 2] += 0.5
    records = [
        ScenarioRecord("fox", None, [1], [1], np.zeros((1, 4), np.float32), [0], arrays={"enc": x})
        for x in (oracle, in_tree)
    ]
    result = compare_array("encoder_output", *records, "enc")
    assert not result.passed and "top-5" not in result.summary, result.summary
    row = ItemResult(
        "fakeplug", "fox", "encoder_output", "L1", "mlx-whisper", "failed", result.summary, 0, details=_details(result)
    )
    report = json.loads(json.dumps(build_report([row], {"models": ["fakeplug"]}, dt.datetime.now(dt.UTC))))
    text = [line.text for line in render(report, 100, "report: reports/x.json")]
    by = next(line for line in text if line.startswith("  by "))
    assert "of the value range" in by and "logit" not in by, by
    assert not any("top-5" in line for line in text), text
