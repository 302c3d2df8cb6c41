"""make mutate (harness/mutate/): cosmic-ray over a small module in a throwaway repository,
judged by its tests; survivors listed, triaged as equivalent or gap, stale triage reported."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from harness.mutate import report
from harness.mutate.cli import run as mutate_cli
from harness.mutate.session import Session
from harness.mutate.targets import MutationConfigError, Target, Triage, load

CLAMP = """def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x
"""
WEAK = (
    "from calc import clamp\n\n\n"
    "def test_inside():\n    assert clamp(5, 0, 10) == 5\n    assert clamp(-1, 0, 10) == 0\n"
)
STRONG = WEAK + "\n\ndef test_edges():\n    assert clamp(11, 0, 10) == 10\n    assert clamp(10, 0, 10) == 10\n"


def _repo(root: Path, tests: str) -> Path:
    root.mkdir()
    (root / "calc.py").write_text(CLAMP)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(tests)
    (root / "conftest.py").write_text("")  # the tree's root on sys.path (pytest's rootdir conftest)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _run(root: Path, sessions: Path) -> list[report.Mutant]:
    target = Target("calc.py", tests=("tests/test_calc.py",))
    return report.mutants(Session(target, root, sessions).run(), CLAMP)


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
def test_survivors_are_listed_and_triaged(tmp_path: Path) -> None:
    found = _run(_repo(tmp_path / "weak", WEAK), tmp_path / "sessions")
    by_id = {m.id: m for m in found}
    assert found and all(m.outcome in ("killed", "survived", "incompetent", "timeout") for m in found)
    survivors = {m.id for m in found if m.outcome == "survived"}
    # x < low -> x <= low returns low == x at the boundary: equivalent; the `high` branch is never tested.
    equivalent = "core/ReplaceComparisonOperator_Lt_LtE#0"
    assert equivalent in survivors and by_id[equivalent].at == "2: if x < low:"
    assert any(by_id[s].line == 4 for s in survivors)
    target = Target("calc.py", tests=("tests/test_calc.py",))
    triage = {equivalent: Triage("calc.py", equivalent, "2: if x < low:", "equivalent", "same value at x == low")}
    result = report.judge(target, found, triage)
    assert result.equivalent == [equivalent] and equivalent not in result.untriaged
    assert result.untriaged and not result.clean
    killed = result.count("killed", "timeout")
    assert result.kill_rate == killed / (killed + len(survivors) - 1)
    assert any("SURVIVED" in line for line in report.lines(result))
    stale = report.judge(target, found, {equivalent: Triage("calc.py", equivalent, "2: if x<low:", "gap", "moved")})
    assert stale.stale and equivalent in stale.untriaged
    # The same session resumes: nothing left to run, the same outcomes.
    again = _run(tmp_path / "weak", tmp_path / "sessions")
    assert [(m.id, m.outcome) for m in again] == [(m.id, m.outcome) for m in found]


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
def test_strong_tests_kill_every_non_equivalent_mutant(tmp_path: Path) -> None:
    found = _run(_repo(tmp_path / "strong", STRONG), tmp_path / "sessions")
    survivors = sorted(m.id for m in found if m.outcome == "survived")
    # Only the boundary swaps that return the same value survive.
    assert survivors == ["core/ReplaceComparisonOperator_Gt_GtE#0", "core/ReplaceComparisonOperator_Lt_LtE#0"]


def test_a_failing_unmutated_run_is_an_error(tmp_path: Path) -> None:
    root = _repo(tmp_path / "broken", "def test_no():\n    assert False\n")
    with pytest.raises(Exception, match="the unmutated run must pass"):
        _run(root, tmp_path / "sessions")


def test_bad_mutation_yaml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "mutation.yaml"
    (tmp_path / "m.py").write_text("x = 1\n")
    for text, expected in (
        ("targets: {m.py: {parity: {k: x}}}\n", "expected {model: NAME"),
        ("targets: {m.py: {parity: [{model: a}, {model: b, k: 3}]}}\n", "parity.1..k: expected a -k"),
        ("targets: {m.py: {parity: []}}\n", "parity: expected a selection or a non-empty list"),
        ("targets: {nope.py: {tests: [m.py]}}\n", "expected a Python module"),
        ("targets: {m.py: {tests: [t.py]}}\n", "no such test file: t.py"),
        (
            "targets: {m.py: {tests: [m.py]}}\ntriaged: [{module: m.py, mutant: a, at: b, verdict: ok, reason: r}]\n",
            "verdict: expected one of equivalent, gap",
        ),
    ):
        path.write_text(text)
        with pytest.raises(MutationConfigError, match=expected.replace("{", r"\{").replace("(", r"\(")):
            load(path, tmp_path)
    path.write_text("targets: {m.py: {parity: [{model: a}, {model: b, k: long}]}}\n")
    commands = load(path, tmp_path).targets["m.py"].commands("py")
    assert commands == [["py", "-m", "harness", "parity", "--model", "a", "-x"],
                        ["py", "-m", "harness", "parity", "--model", "b", "-k", "long", "-x"]]  # fmt: skip
    args = argparse.Namespace(config=path, module=["other.py"], out=tmp_path / "out", list=False)
    path.write_text("targets: {m.py: {tests: [m.py]}}\n")
    assert mutate_cli(args) == 2 and not (tmp_path / "out").exists()
