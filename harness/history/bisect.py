"""`python -m harness bisect --model M --check SCENARIO/CHECK --good REV --bad REV`: the first
commit that broke one check, found by `git bisect run` driving the harness.

The bisection runs in a worktree of its own under the cache (the user's checkout is never
touched), each step a `python -m harness parity --model M --scenario S --check C` of that
commit's code, sharing this checkout's cache (venvs, artifacts, golden blobs). A step is
flake-checked: the check runs 1 + `--reruns` times and must say the same every time; a step
that disagrees with itself stops the bisection and is named (at L1 a flake is a harness or
backend bug, never a verdict), and a step whose check cannot run there (an error, a profile
that does not exist yet) is skipped (`git bisect skip`).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from harness.errors import HarnessError, UsageError
from harness.paths import REPO_ROOT, cache_root

GOOD, BAD, SKIP, STOP = 0, 1, 125, 128  # git bisect run's exit codes


def run_command(
    cmd: list[str], cwd: Path | None = None, capture: bool = False, quiet: bool = False
) -> subprocess.CompletedProcess:
    """git, or the harness's own parity run of one commit (never an oracle's process)."""
    out = subprocess.PIPE if capture or quiet else None
    return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if capture else out, text=True)


def step_verdict(outcomes: list[str]) -> tuple[int, str]:
    """A step's exit code for git bisect run from the outcomes of its runs of the check."""
    if len(set(outcomes)) > 1:
        return STOP, f"flaky: the check said {', '.join(outcomes)} on one commit"
    outcome = outcomes[0]
    if outcome == "passed":
        return GOOD, "passed"
    if outcome == "failed":
        return BAD, "failed"
    return SKIP, f"{outcome}: cannot judge this commit"


def run_step(args: argparse.Namespace) -> int:
    """One bisection step, in the commit's worktree (the hidden verb `bisect-step`)."""
    scenario, check = args.check.split("/", 1)
    outcomes, out = [], Path(args.work)
    for attempt in range(1 + args.reruns):
        report = out / f"step-{uuid.uuid4().hex}-{attempt}.json"
        command = [sys.executable, "-m", "harness", "parity", "--model", args.model, "--scenario", scenario]
        command += ["--check", check, "--report", str(report), *shlex.split(args.pytest_args or "")]
        run_command(command, cwd=Path.cwd())
        if not report.exists():
            outcomes.append("error")
            continue
        results = json.loads(report.read_text())["results"]
        rows = [r for r in results if (r["scenario"], r["check"]) == (scenario, check)]
        outcomes.append(rows[0]["outcome"] if rows else "error")
    code, why = step_verdict(outcomes)
    print(f"bisect step: {args.model}/{args.check}: {why}", flush=True)
    return code


def run(args: argparse.Namespace) -> int:
    if args.oracle_versions:
        from harness.history.oracle_bisect import run as over_releases

        return over_releases(args)
    if not (args.good and args.bad):
        raise UsageError("give --good and --bad revisions (or --oracle-versions DIST=FIRST..LAST)")
    if "/" not in args.check:
        raise UsageError("--check names one check of one scenario: SCENARIO/CHECK (as the rerun command's)")
    repo = Path(args.repo).resolve() if args.repo else REPO_ROOT
    for rev in (args.good, args.bad):
        if run_command(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, quiet=True).returncode:
            raise UsageError(f"{rev!r} is not a commit of {repo}")
    (cache_root() / "bisect").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bisect-", dir=cache_root() / "bisect"))
    tree = work / "tree"
    git = ["git", "-C", str(tree)]
    if run_command(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), args.bad]).returncode:
        raise HarnessError(f"cannot make a worktree of {repo} at {args.bad} in {tree}")
    try:
        run_command([*git, "bisect", "start", args.bad, args.good])
        step = [sys.executable, "-m", "harness", "bisect-step", "--model", args.model, "--check", args.check]
        step += ["--reruns", str(args.reruns), "--work", str(work), f"--pytest-args={args.pytest_args or ''}"]
        result = run_command([*git, "bisect", "run", *step], capture=True)
        print(result.stdout[-4000:])
        found = re.search(r"^([0-9a-f]{7,40}) is the first bad commit", result.stdout, re.MULTILINE)
        flaky = re.search(r"bisect step: .*flaky.*", result.stdout)
        if flaky:
            print(f"bisect stopped: {flaky.group(0)} (at {_current(tree)})")
            return 1
        if not found:
            print("bisect found no first bad commit (every step skipped, or good and bad agree)")
            return 1
        subject = run_command([*git, "log", "-1", "--format=%h %s", found.group(1)], capture=True).stdout.strip()
        print(f"first bad commit for {args.model}/{args.check}: {subject}")
        return 0
    finally:
        run_command([*git, "bisect", "reset"], quiet=True)
        run_command(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], quiet=True)


def _current(tree: Path) -> str:
    return run_command(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture=True).stdout.strip()
