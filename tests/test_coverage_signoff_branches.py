"""Two profile-level judgements on synthetic inputs: exercise coverage (harness/coverage.py) when
every scenario naming a check is scoped to another backend ("not judged", never an error), and the
sign-off's blockers (harness/signoff/verdict.py) when one model's parity run exits 1 although every
one of its checks passed."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from harness.coverage import judge_coverage
from harness.profile.load import find_profile
from harness.report import ItemResult, build_report
from harness.signoff.model import BLOCKED, SIGNED_OFF, ParityReport
from harness.signoff.verdict import evaluate
from tests.conftest import VALID_PROFILE, write_profile

TODAY = dt.date(2026, 1, 1)


def test_a_path_unwalked_where_every_scenario_runs_elsewhere_is_not_judged(isolated: Path) -> None:
    """Both scenarios naming eos_stop run on gpu only: on cpu the path is "not judged", no ERROR row."""
    text = re.sub(r"\n( *)- id: ", r"\n\1- backends: [gpu]\n\1  id: ", VALID_PROFILE.format(name="tiny"))
    write_profile(isolated, text=text)
    profile = find_profile("tiny")
    (eos,) = [c for c in judge_coverage([profile], [], "cpu") if c.check == "eos_stop"]
    assert eos.row is None
    assert (
        eos.line == "exercise tiny eos_stop: stops on an EOS id: not walked (not judged: 2 scoped to another backend)"
    )
    (here,) = [c for c in judge_coverage([profile], [], "gpu") if c.check == "eos_stop"]
    assert here.line.endswith("(not judged: 2 scenario(s) not run or without a result (plain, chat))")


def _report(runs: dict[str, int], *outcomes: tuple[str, str]) -> ParityReport:
    """A merged parity report: one eos_stop row per (model, outcome), and each model's exit code."""
    results = [ItemResult(m, "s", "eos_stop", "L1", "mlx-lm", o, f"eos_stop {o}") for m, o in outcomes]
    context = {"device": {"key": "cpu-test-device"}, "harness_commit": "abc", "provenance": {}, "runs": runs}
    return ParityReport.from_dict(build_report(results, context, dt.datetime.now(dt.UTC)), "synthetic")


def _blockers(report: ParityReport) -> dict[tuple[str, str], str]:
    signoff = evaluate(report, [], today=TODAY, generated="now", requested_models=["a", "b"])
    return {(b.kind, b.subject): b.reason for b in signoff.blockers}


def test_a_run_that_failed_with_every_check_passed_blocks() -> None:
    """Model b's run exited 1 and none of its checks failed: a blocker for b's run, not for a."""
    report = _report({"a": 0, "b": 1}, ("a", "passed"), ("b", "passed"))
    assert _blockers(report) == {("run", "b"): "its parity run failed (exit code 1) although every check passed"}
    assert evaluate(report, [], today=TODAY, generated="now", requested_models=["a", "b"]).verdict == BLOCKED


def test_a_run_that_failed_on_a_failed_check_blocks_only_by_that_check() -> None:
    """The contrast: exit 1 explained by b's failed check is that check's blocker alone."""
    report = _report({"a": 0, "b": 1}, ("a", "passed"), ("b", "failed"))
    assert set(_blockers(report)) == {("check", "b/s/eos_stop")}
    passing = _report({"a": 0, "b": 0}, ("a", "passed"), ("b", "passed"))
    assert evaluate(passing, [], today=TODAY, generated="now", requested_models=["a", "b"]).verdict == SIGNED_OFF
