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


def _bisect(
    repo: Path, good: str, bad: str, check: str = "plain/decode_logits", *more: str
) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "harness", "bisect", "--model", "tiny", "--check", check]
    command += ["--good", good, "--bad", bad, "--repo", str(repo), "--pytest-args=-p tests.fault_plugin", *more]
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


def test_h2_b9_a_check_that_passes_at_bad_is_nothing_to_bisect(tiny: Path, tmp_path: Path) -> None:
    """Hostile probe 2, H2 (B9): a check that passes everywhere named an innocent commit."""
    repo, good, planted, bad = _scratch(tmp_path, "fail")
    out = _bisect(repo, good, bad, "plain/prompt_identity")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert "nothing to bisect: tiny/plain/prompt_identity passed at --bad" in out.stdout
    assert "first bad commit" not in out.stdout
    assert _git(repo, "worktree", "list").count("\n") == 1


def test_h2_b9_a_commit_whose_harness_crashes_is_skipped_never_blamed(tiny: Path, tmp_path: Path) -> None:
    """A step that cannot run (here a commit whose harness raises on start, as one without the
    verb exits 2) is a skip: with the fault right after it, the bisection cannot tell which of
    the two broke the check and says so, instead of naming the crashing commit."""
    repo, good, planted, bad = _scratch(tmp_path, "fail")
    _git(repo, "reset", "-q", "--hard", good)
    main = repo / "harness" / "__main__.py"
    original = main.read_text()
    main.write_text("raise SystemExit(2)  # a harness that cannot run\n" + original)
    _git(repo, "commit", "-q", "-am", "a harness that cannot run")
    broken = _git(repo, "rev-parse", "--short", "HEAD").strip()
    main.write_text(original)
    (repo / ".test-faults.json").write_text(json.dumps({"plain/decode_logits": "fail"}))
    _git(repo, "add", ".test-faults.json", "harness/__main__.py")
    _git(repo, "commit", "-q", "-m", "the fault, the harness mended")
    out = _bisect(repo, good, _git(repo, "rev-parse", "HEAD").strip())
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-2000:]
    assert "cannot bisect: 1 step(s) could not run" in out.stdout
    assert f"first bad commit for tiny/plain/decode_logits: {broken}" not in out.stdout


@pytest.mark.parametrize(
    ("more", "check", "good", "bad", "said"),
    [
        (["--reruns", "-1"], "plain/decode_logits", "HEAD~1", "HEAD", "--reruns must be between 0 and 20, got -1"),
        ([], "plain/decode_logits", "HEAD", "HEAD~1", "is not an ancestor of --bad 'HEAD~1'"),
        ([], "plain/decode_logits", "HEAD", "HEAD", "are the same commit: nothing to bisect"),
        ([], "plain/decode_logits", "HEAD~1", "no-such-rev", "--bad 'no-such-rev' is not a commit"),
        ([], "nope/decode_logits", "HEAD~1", "HEAD", "has no scenario 'nope' (its scenarios: plain"),
        ([], "plain", "HEAD~1", "HEAD", "SCENARIO/CHECK"),
    ],
)
def test_h2_b10_l19_nonsense_is_refused_before_the_first_step(
    tiny: Path, tmp_path: Path, more, check, good, bad, said
) -> None:
    repo = _scratch(tmp_path, "fail")[0]  # its own history: CI's clone may be shallow
    out = _bisect(repo, good, bad, check, *more)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert said in out.stderr
    assert "bisect step" not in out.stdout
    assert not any((tiny / "cache" / "bisect").glob("bisect-*"))


def test_l19_an_unknown_model_is_refused_before_the_first_step(tiny: Path, tmp_path: Path) -> None:
    repo = _scratch(tmp_path, "fail")[0]
    command = [sys.executable, "-m", "harness", "bisect", "--model", "nope", "--check", "plain/decode_logits"]
    command += ["--good", "HEAD~1", "--bad", "HEAD", "--repo", str(repo)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 2 and "no profile 'nope' at --bad 'HEAD'" in out.stderr, out.stderr[-2000:]


def test_step_verdict_counts_only_passes_and_failures() -> None:
    from harness.history.bisect import BAD, GOOD, SKIP, STOP, step_verdict

    assert step_verdict([])[0] == SKIP
    assert step_verdict(["passed", "error"])[0] == SKIP
    assert step_verdict(["no report (the run could not start or crashed)"])[0] == SKIP
    assert step_verdict(["failed", "passed"])[0] == STOP
    assert step_verdict(["failed", "failed"]) == (BAD, "failed")
    assert step_verdict(["passed"]) == (GOOD, "passed")


def test_l20_a_killed_bisections_worktree_is_removed_by_the_next_and_a_running_ones_kept(tmp_path: Path) -> None:
    """Hostile probe 2, L20 (B16): a SIGKILLed bisection's worktree (308 MB) stayed registered
    and its folder stayed in the cache."""
    from harness.history.bisect import _sweep_killed

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    folder = tmp_path / "bisect"
    killed, running = folder / "bisect-999999999-abc", folder / f"bisect-{os.getpid()}-def"
    for work in (killed, running):
        work.mkdir(parents=True)
        _git(repo, "worktree", "add", "-q", "--detach", str(work / "tree"), "HEAD")
    _sweep_killed(repo, folder)
    assert not killed.exists() and (running / "tree").is_dir()
    listed = _git(repo, "worktree", "list")
    assert str(killed) not in listed and str(running) in listed
