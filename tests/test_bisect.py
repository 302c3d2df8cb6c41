"""`python -m harness bisect`: a commit planted in a scratch repository's history breaks one
check; git bisect run, driving the harness on each commit in a worktree of its own, names it.
A check that says two things on one commit stops the bisection as flaky.

The scratch repository is a clone of this one (its committed state) with three commits on
top; the fault is a `.test-faults.json` committed into one of them, which tests/fault_plugin.py
reads in whatever checkout runs (no model is loaded: the bisection is what is tested).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from tests.conftest import write_profile


def _git(repo: Path, *args: str) -> str:
    env = os.environ | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _scratch(tmp_path: Path, fault: str) -> tuple[Path, str, str, str]:
    """(repo, good, planted, bad): three commits on a clone; the second plants `fault`."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO_ROOT), str(repo)], check=True)
    good = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "NOTES").write_text("one\n")
    _git(repo, "add", "NOTES")
    _git(repo, "commit", "-q", "-m", "a harmless commit")
    (repo / ".test-faults.json").write_text(json.dumps({"plain/decode_logits": fault}))
    _git(repo, "add", ".test-faults.json")
    _git(repo, "commit", "-q", "-m", "the planted fault")
    planted = _git(repo, "rev-parse", "--short", "HEAD").strip()
    (repo / "NOTES").write_text("two\n")
    _git(repo, "commit", "-q", "-am", "another harmless commit")
    return repo, good, planted, _git(repo, "rev-parse", "HEAD").strip()


def _bisect(repo: Path, good: str, bad: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "harness", "bisect", "--model", "tiny", "--check", "plain/decode_logits"]
    command += ["--good", good, "--bad", bad, "--repo", str(repo), "--pytest-args=-p tests.fault_plugin"]
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600)


@pytest.fixture
def tiny(isolated: Path) -> Path:
    write_profile(isolated)
    return isolated


def test_bisect_names_the_planted_commit(tiny: Path, tmp_path: Path) -> None:
    repo, good, planted, bad = _scratch(tmp_path, "fail")
    out = _bisect(repo, good, bad)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"first bad commit for tiny/plain/decode_logits: {planted} the planted fault" in out.stdout
    assert _git(repo, "worktree", "list").count("\n") == 1  # its worktree is gone again
    assert "bisect" not in _git(repo, "status")  # and the scratch checkout was never touched


def test_a_step_that_disagrees_with_itself_stops_the_bisection_as_flaky(tiny: Path, tmp_path: Path) -> None:
    repo, good, planted, bad = _scratch(tmp_path, "flaky")
    out = _bisect(repo, good, bad)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "bisect stopped: bisect step: tiny/plain/decode_logits: flaky: the check said failed, passed" in out.stdout
    assert "first bad commit" not in out.stdout.split("bisect stopped")[-1]
