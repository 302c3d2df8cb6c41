"""`python -m harness parity` behaves as pytest does: node ids round-trip, --lf, --collect-only,
-x; SCENARIO/CHECK select exactly one check, and so does a failure's printed rerun command.

Each run is the parity verb's own pytest command line (harness/cli/select.py) on a fake
session (the fake oracle, an in-tree side replaying it), in a temporary tree.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cli import build_parser
from harness.cli.select import pytest_arguments
from harness.errors import UsageError
from harness.paths import REPO_ROOT
from harness.records import ScenarioRecord
from tests.conftest import write_profile
from tests.fakes import FakeOracle, FakeSessionPlugin


class _Runner:
    """The fake oracle's records, one logit nudged by one ULP on row 1 of the `bad` scenarios."""

    bad: set[str] = set()

    def run(self, spec: dict[str, Any], forced: ScenarioRecord | None = None) -> ScenarioRecord:
        record = FakeOracle.records([spec])[spec["id"]]
        record.mode = "teacher_forced" if forced is not None else "free"
        if spec["id"] in _Runner.bad:
            record.logits[1, 3] = np.nextafter(record.logits[1, 3], np.float32(np.inf))
        return record


@pytest.fixture
def tree(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")  # the fake in-tree side has no module taps
    monkeypatch.setattr("harness.pytest_plugin.model_provenance", lambda name: {})
    monkeypatch.setattr(_Runner, "bad", set())
    write_profile(isolated)
    return isolated


def parity(root: Path, capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, list[dict]]:
    """Run the parity verb's pytest command line; its exit code, output and report rows."""
    code, out, _, rows = parity_streams(root, capsys, *argv)
    return code, out, rows


def parity_streams(root: Path, capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str, list[dict]]:
    """`parity`, with what the run wrote on stderr too (the progress lines)."""
    parser, _ = build_parser()
    args, extra = parser.parse_known_args(["parity", *argv])
    args.extra = extra
    before = set((root / "reports").glob("*.json"))
    code = int(pytest.main(pytest_arguments(args), plugins=[FakeSessionPlugin(root, _Runner())]))
    captured = capsys.readouterr()
    written = sorted(set((root / "reports").glob("*.json")) - before)
    rows = json.loads(written[-1].read_text())["results"] if written else []
    return code, captured.out, captured.err, rows


def test_collect_only_lists_node_ids_that_each_rerun_exactly_one_check(tree: Path, capsys) -> None:
    code, out, rows = parity(tree, capsys, "--model", "tiny", "--collect-only")
    assert code == 0, out
    assert rows == [] and not list((tree / "reports").iterdir()), "--collect-only wrote a report"
    assert "FAIL" not in out and "ERROR" not in out
    ids = [line for line in out.splitlines() if line.count("::") == 2]
    assert len(ids) >= 6 and any("detokenize" in i for i in ids)
    ids = [
        i for i in ids if "logits" in i
    ]  # the fake records judge only the logits checks and all(i.split("::")[0].endswith("tiny.yaml") for i in ids)
    for node in (ids[0], ids[-1]):
        code, out, rows = parity(tree, capsys, node)
        assert code == 0, out
        assert [(r["scenario"], r["check"]) for r in rows] == [tuple(node.split("::")[1:])]


def test_collect_only_of_a_broken_profile_says_why_and_writes_no_report(tree: Path, capsys) -> None:
    """Hostile probe 2, L15 (Pr4): only '1 error during collection' was printed, no reason."""
    (tree / "profiles" / "broken.yaml").write_bytes(b"\xff\xfebroken: [\n")
    code, out, err, rows = parity_streams(tree, capsys, "--model", "broken", "--collect-only")
    assert code != 0 and rows == [] and not list((tree / "reports").iterdir())
    assert "broken.yaml: not UTF-8" in out + err


def test_a_failure_prints_a_rerun_command_that_reruns_exactly_that_check(tree: Path, capsys) -> None:
    _Runner.bad = {"plain"}
    code, out, rows = parity(tree, capsys, "--model", "tiny", "-k", "logits")
    failed = [r for r in rows if r["outcome"] == "failed"]
    assert code == 1 and failed, out
    commands = re.findall(r"^ {2}(?:rerun {4}| {2})(make parity .*)$", out, re.MULTILINE)
    first = failed[0]
    assert commands[0] == f"make parity MODEL=tiny SCENARIO=plain CHECK={first['check']}"
    # What make runs for it (make -n prints the recipe), run as the harness's own command line.
    shown = subprocess.run(
        ["make", "-n", "-C", str(REPO_ROOT), *shlex.split(commands[0])[1:]], capture_output=True, text=True
    )
    line = next(ln for ln in shown.stdout.splitlines() if "-m harness parity" in ln)
    argv = shlex.split(line)
    code, out, rows = parity(tree, capsys, *argv[argv.index("parity") + 1 :])
    assert code == 1
    assert [(r["scenario"], r["check"], r["outcome"]) for r in rows] == [("plain", first["check"], "failed")]


def test_last_failed_reruns_only_the_failures(tree: Path, capsys) -> None:
    _Runner.bad = {"plain"}
    code, _, rows = parity(tree, capsys, "--model", "tiny", "-k", "logits")
    failed = {(r["scenario"], r["check"]) for r in rows if r["outcome"] != "passed"}
    assert code == 1 and failed and len(failed) < len(rows)
    _Runner.bad = set()  # fixed
    code, out, rows = parity(tree, capsys, "--model", "tiny", "-k", "logits", "--lf")
    assert code == 0, out
    assert {(r["scenario"], r["check"]) for r in rows} == failed


def test_x_stops_at_the_first_failure_and_lists_the_rest_as_not_run(tree: Path, capsys) -> None:
    _Runner.bad = {"plain", "chat"}
    code, out, rows = parity(tree, capsys, "--model", "tiny", "-k", "logits", "-x")
    assert code == 1
    assert [r["outcome"] for r in rows if r["outcome"] != "passed"] == ["failed"], "unrun items became rows"
    report = json.loads(sorted((tree / "reports").glob("*.json"))[-1].read_text())
    not_run = report["context"]["not_run"]
    assert not_run and f"the run stopped early (-x / --maxfail): {len(not_run)} checks: " in out
    assert "/".join(not_run[0].split("::")[1:]) in out  # which ones, by name
    assert out.rstrip().splitlines()[-1].startswith("FAIL tiny: 1 failed")


def test_every_run_writes_junit_beside_its_report(tree: Path, capsys) -> None:
    code, out, rows = parity(
        tree, capsys, "--model", "tiny", "-k", "logits", "--report", str(tree / "reports" / "run.json")
    )
    assert code == 0 and rows, out
    junit = (tree / "reports" / "run.junit.xml").read_text()
    assert f'tests="{len(rows)}"' in junit and 'failures="0"' in junit
    assert out.rstrip().splitlines()[-2] == f"report: {tree}/reports/run.json · JUnit: {tree}/reports/run.junit.xml"
    with pytest.raises(UsageError, match="run.junit.xml exists and is never replaced"):
        parity(tree, capsys, "--model", "tiny", "-k", "logits", "--report", str(tree / "reports" / "run.json"))


def test_scenario_and_check_are_checked_against_the_profile(tree: Path, capsys) -> None:
    with pytest.raises(UsageError, match="unknown scenario of tiny 'plian': did you mean 'plain'"):
        parity(tree, capsys, "--model", "tiny", "--scenario", "plian")
    with pytest.raises(UsageError, match="unknown check of tiny/plain 'decode_logit': did you mean 'decode_logits'"):
        parity(tree, capsys, "--model", "tiny", "--scenario", "plain", "--check", "decode_logit")
    with pytest.raises(UsageError, match="give --scenario"):
        parity(tree, capsys, "--model", "tiny", "--check", "decode_logits")
    code, out, rows = parity(tree, capsys, "--model", "tiny", "--scenario", "chat", "-k", "logits")
    assert code == 0 and rows and {r["scenario"] for r in rows} == {"chat"}


def test_parity_help_says_other_arguments_go_to_pytest(capsys) -> None:
    parser, verbs = build_parser()
    text = verbs["parity"].format_help()
    assert "Every other argument goes to pytest" in text and "--lf" in text and "SCENARIO=" in text


class _OnceBad:
    """Nudges the `bad` scenarios' first attempt only: a flake (its `run` replaces _Runner's)."""

    runs: dict[str, int] = {}

    def run(self, spec, forced=None):
        n = _OnceBad.runs[spec["id"]] = _OnceBad.runs.get(spec["id"], 0) + 1
        record = FakeOracle.records([spec])[spec["id"]]
        record.mode = "teacher_forced" if forced is not None else "free"
        if spec["id"] in _Runner.bad and n <= 2:  # the first attempt's free and teacher-forced runs
            record.logits[1, 3] = np.nextafter(record.logits[1, 3], np.float32(np.inf))
        return record


def test_rerun_flaky_calls_a_check_that_fails_then_passes_flaky_never_passed(
    tree: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Runner.bad = {"plain"}
    monkeypatch.setattr(_OnceBad, "runs", {})
    monkeypatch.setattr(_Runner, "run", _OnceBad.run)
    args = ("--model", "tiny", "--scenario", "plain", "-k", "decode", "--rerun-flaky", "1")
    code, out, rows = parity(tree, capsys, *args)
    (row,) = rows
    assert code == 1 and row["outcome"] == "error", row["summary"]
    assert row["summary"].startswith("flaky (an L1 check: a harness or backend bug): failed, passed over 2 runs")


def test_rerun_flaky_confirms_a_check_that_fails_every_time(tree: Path, capsys) -> None:
    _Runner.bad = {"plain"}
    args = ("--model", "tiny", "--scenario", "plain", "-k", "decode", "--rerun-flaky", "2")
    code, out, rows = parity(tree, capsys, *args)
    (row,) = rows
    assert code == 1 and row["outcome"] == "failed" and row["summary"].endswith("failed again in each of 2 rerun(s)")


@pytest.mark.parametrize("count", ["-1", "11", "999999"])
def test_l23_f1_f5_f9_rerun_flaky_outside_0_to_10_is_a_usage_error_before_any_check(
    tree: Path, capsys, monkeypatch: pytest.MonkeyPatch, count: str
) -> None:
    """Hostile probe 2, L23 (F1, F5, F9): `--rerun-flaky -1` (make parity RERUN_FLAKY=-1) said
    "failed again in each of -1 rerun(s)", 999999 was taken. Outside 0 (off)..10 it is a usage
    error naming the option, before any check runs: no oracle call, no report."""
    calls = []
    monkeypatch.setattr(_Runner, "run", lambda self, spec, forced=None: calls.append(spec) or 1 / 0)
    _Runner.bad = {"plain"}
    args = ("--model", "tiny", "--scenario", "plain", "--rerun-flaky", count)
    code, out, err, rows = parity_streams(tree, capsys, *args)
    assert code == pytest.ExitCode.USAGE_ERROR
    assert f"argument --rerun-flaky: expected 0 (off) to 10 reruns, got {count}" in err
    assert calls == [] and rows == [] and not list((tree / "reports").iterdir())
