"""Hostile-input probe, sign-off items (docs: /work/shared/reviews/hostile-probe.md items 2, 3, 13).

- a waiver whose model part is a glob (`[a-z]*/*/[a-z]*`) must not pass the must-name-a-model
  rule and waive every failure;
- a sign-off over a deselected subset (`-- -k plain`) is INCOMPLETE, names the checks of the
  requested profiles that did not run, and exits non-zero: it never reads as a sign-off;
- an unreadable or non-UTF-8 waivers file is a one-line error naming the file, not a traceback.

The command-line tests run the real `python -m harness signoff` on a temporary profile whose
checks are scripted by tests/fault_plugin.py (no model is loaded).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from harness.profile.load import load_profile
from harness.report import ItemResult, build_report
from harness.signoff.cli import sign_off
from harness.signoff.model import BLOCKED, SIGNED_OFF, ParityReport
from harness.signoff.waivers import WaiverError, load_waivers, parse_waivers
from tests.conftest import write_profile

TODAY = dt.date(2026, 6, 1)
INCOMPLETE = "INCOMPLETE"  # the verdict of a sign-off that did not run every check it covers


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT), "MLX_PARITY_TEST_FAULTS": "{}"}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300
    )


def _entry(check: str, expires: str | None = None) -> dict:
    soon = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=30)).isoformat()  # within a waiver's horizon
    return {"check": check, "reason": "r", "owner": "o", "expires": expires or soon}


# -- item 2: the model part of a waiver names a model -----------------------------------------


@pytest.mark.parametrize(
    "check",
    [
        "[a-z]*/*/[a-z]*",  # the probe's: every model, every check
        "[a-z]*/*/decode_logits",
        "[!0-9]*/*/decode_logits",
        "?*/*/decode_logits",
        "s*/*/decode_logits",  # a one-letter prefix is no model name
        "smollm2-13?m/*/decode_logits",
        "smollm2-135[m]/*/decode_logits",
        "*-mini/*/decode_logits",
    ],
)
def test_a_glob_in_the_model_part_is_refused(check: str) -> None:
    with pytest.raises(WaiverError) as excinfo:
        parse_waivers([_entry(check)], "w.yaml")
    message = str(excinfo.value)
    assert message.startswith("w.yaml: [0].check: the model part must name a model"), message
    assert repr(check.split("/")[0]) in message and "no glob" in message


@pytest.mark.parametrize("check", ["m/*/[a-z]*", "m/*/[!x]*", "m/*/[a-z][a-z]*"])
def test_a_check_part_that_is_only_a_character_class_is_refused(check: str) -> None:
    with pytest.raises(WaiverError, match=r"\[0\]\.check: the check part must name a check"):
        parse_waivers([_entry(check)], "w.yaml")


@pytest.mark.parametrize(
    "check",
    [
        "smollm2-135m/*/decode_logits",
        "m/*/*_logits",
        "m/a/[dt]*_logits",
        "whisper-tiny-en/*/eos_stop",
        "m/plain/decode_*",  # globs anchored on whole words of the name (probe 2, M6)
        "m/multibyte-*/decode_logits",
        "m/spec-*-k2/eos_stop",
        "m/*-k5/eos_stop",
    ],
)
def test_waivers_naming_a_model_still_load(check: str) -> None:
    (w,) = parse_waivers([_entry(check)], "w.yaml")
    assert w.check == check


def test_a_glob_model_waiver_cannot_sign_off_failures_of_every_model(tmp_path: Path) -> None:
    """End to end through the file: the probe's waiver stops the sign-off before anything runs."""
    path = tmp_path / "waivers.yaml"
    path.write_text("- {check: '[a-z]*/*/[a-z]*', reason: r, owner: o, expires: 2099-01-01}\n")
    with pytest.raises(WaiverError, match="the model part must name a model"):
        load_waivers(path)


# -- item 13: an unreadable waivers file ------------------------------------------------------


def test_a_waivers_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "waivers.yaml"
    path.write_bytes(
        b"- check: smollm2-135m/plain/decode_logits\n  reason: caf\xe9\n  owner: o\n  expires: 2099-01-01\n"
    )
    with pytest.raises(WaiverError) as excinfo:
        load_waivers(path)
    message = str(excinfo.value)
    assert message.startswith(f"{path}: ") and "UTF-8" in message and "byte 0xe9" in message


def test_a_waivers_path_that_is_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    """Hostile probe 2, L25 (W21): `--waivers <a FIFO>` hung on the read."""
    path = tmp_path / "waivers.yaml"
    os.mkfifo(path)
    with pytest.raises(WaiverError, match="not a regular file"):
        load_waivers(path)


def test_a_waivers_path_that_cannot_be_read_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "waivers.yaml"
    path.mkdir()  # a directory: exists, cannot be read as a file
    with pytest.raises(WaiverError) as excinfo:
        load_waivers(path)
    assert str(excinfo.value).startswith(f"{path}: cannot read the waivers file")


@pytest.mark.parametrize("kind", ["latin-1", "directory"])
def test_cli_bad_waivers_file_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "waivers.yaml"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"- check: a/b/c\n  reason: \xff\n")
    out = _cli("signoff", "--from-report", str(tmp_path / "absent.json"), "--waivers", str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert out.stderr.startswith(f"error: {path}: "), out.stderr


# -- item 3: a sign-off over a deselected subset is INCOMPLETE --------------------------------


def _expected_ids(profile_path: Path, scenarios: set[str] | None = None) -> list[str]:
    """Every check id the profile collects (this CPU backend runs all of tiny's scenarios)."""
    profile = load_profile(profile_path)
    return [
        f"{profile.name}/{s.id}/{c}"
        for s in profile.scenarios
        if scenarios is None or s.id in scenarios
        for c in profile.checks(s)
    ]


def _signoff_cli(root: Path, *extra: str, out: str = "so") -> tuple[subprocess.CompletedProcess, dict, Path]:
    (root / "none.yaml").write_text("[]\n")
    before = set((root / out).glob("signoff-*")) if (root / out).exists() else set()
    run = _cli("signoff", "--model", "tiny", "--out", str(root / out), "--waivers", str(root / "none.yaml"), *extra)
    (directory,) = set((root / out).glob("signoff-*")) - before
    return run, json.loads((directory / "report.json").read_text()), directory


def test_a_deselected_subset_is_incomplete_names_what_did_not_run_and_exits_non_zero(isolated: Path) -> None:
    path = write_profile(isolated)
    every, plain = _expected_ids(path), _expected_ids(path, {"plain"})
    not_run = [i for i in every if i not in plain]
    assert plain and not_run  # the fixture profile has checks on both sides of `-k plain`

    run, report, directory = _signoff_cli(isolated, "--", "-p", "tests.fault_plugin", "-k", "plain")
    signoff = report["signoff"]
    assert {c["id"] for c in signoff["checks"]} == set(plain)  # every check that ran passed
    assert signoff["verdict"] == INCOMPLETE != SIGNED_OFF
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    assert signoff["not_run"] == not_run and signoff["expected_checks"] == len(every)
    assert "sign-off: INCOMPLETE" in run.stdout and "SIGNED OFF" not in run.stdout
    assert f"not run: {len(not_run)} of {len(every)} checks of the requested profiles" in run.stdout
    summary = (directory / "summary.md").read_text()
    assert summary.startswith("# Parity sign-off: INCOMPLETE")
    assert f"## Not run ({len(not_run)} of {len(every)} checks of the requested profiles)" in summary
    assert all(f"`{i}`" in summary for i in not_run)
    page = (directory / "index.html").read_text()
    assert 'class="incomplete"' in page and f"{len(not_run)} of {len(every)} checks" in page
    junit = ET.parse(directory / "junit.xml").getroot()
    assert junit.find("testsuite/properties/property[@name='verdict']").get("value") == INCOMPLETE
    suite = next(s for s in junit.iter("testsuite") if s.get("name") == "signoff.not-run")
    assert int(suite.get("failures")) == len(not_run) == len(suite.findall("testcase"))

    # The same partial parity report signed off later (--from-report) is just as incomplete.
    again, report, _ = _signoff_cli(isolated, "--from-report", str(directory / "report.json"), out="again")
    assert again.returncode == 3 and report["signoff"]["verdict"] == INCOMPLETE
    assert report["signoff"]["not_run"] == not_run


def test_the_complete_profile_still_signs_off(isolated: Path) -> None:
    path = write_profile(isolated)
    run, report, _ = _signoff_cli(isolated, "--", "-p", "tests.fault_plugin")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert report["signoff"]["verdict"] == SIGNED_OFF and report["signoff"]["not_run"] == []
    assert report["signoff"]["expected_checks"] == len(_expected_ids(path)) == len(report["signoff"]["checks"])
    assert "not run" not in run.stdout.split("sign-off:")[-1]


def _synthetic(rows: list[tuple[str, str]], outcome: dict[str, str] | None = None) -> ParityReport:
    results = [
        ItemResult(
            model="tiny",
            scenario=s,
            check=c,
            tier="L1",
            oracle="mlx-lm",
            outcome=(outcome or {}).get(f"{s}/{c}", "passed"),
            summary="x",
        )
        for s, c in rows
    ]
    context = {"device": {"key": "cpu-test-device", "backend": "cpu"}, "harness_commit": "abc", "provenance": {}}
    return ParityReport.from_dict(build_report(results, context, dt.datetime.now(dt.UTC)), "synthetic")


def test_a_blocked_partial_run_stays_blocked_and_still_lists_what_did_not_run(isolated: Path) -> None:
    path = write_profile(isolated)
    plain = [tuple(i.split("/")[1:]) for i in _expected_ids(path, {"plain"})]
    failing = f"{plain[0][0]}/{plain[0][1]}"
    _, doc = sign_off(_synthetic(plain, {failing: "failed"}), [], out=isolated / "so", today=TODAY)
    assert doc.signoff.verdict == BLOCKED
    assert doc.signoff.not_run == _expected_ids(path, {"chat"})
    _, doc = sign_off(_synthetic(plain), [], out=isolated / "so", today=TODAY, requested_models=["tiny"])
    assert doc.signoff.verdict == INCOMPLETE


def test_a_scenario_scoped_to_another_backend_is_not_counted_as_not_run(isolated: Path) -> None:
    from harness.profile.load import load_profile as load
    from tests.conftest import VALID_PROFILE

    text = VALID_PROFILE.format(name="tiny").replace("  - id: chat\n", "  - id: chat\n    backends: [gpu]\n")
    path = write_profile(isolated, text=text)
    plain = [tuple(i.split("/")[1:]) for i in _expected_ids(path, {"plain"})]
    assert load(path).scenario("chat").backends == ["gpu"]
    _, doc = sign_off(_synthetic(plain), [], out=isolated / "so", today=TODAY)
    assert doc.signoff.verdict == SIGNED_OFF and doc.signoff.not_run == []


# -- probe 2 (hostile-probe-2.md) M6: the scenario and check parts name what they waive ------------


@pytest.mark.parametrize(
    ("case", "check", "part"),
    [
        ("W1", "fakeplug/*/*o*", ("check", "*o*")),  # the probe's: waived all 7 ERROR checks
        ("W2", "smollm2-135m/*/*o*", ("check", "*o*")),
        ("W3", "smollm2-135m/*/*e*", ("check", "*e*")),
        ("W4", "smollm2-135m/**/*o*", ("scenario", "**")),
        ("W5", "smollm2-135m/*/?*t*", ("check", "?*t*")),
        ("W6", "smollm2-135m/[a-z]*/*s*", ("scenario", "[a-z]*")),
        ("W6", "smollm2-135m/plain/*s*", ("check", "*s*")),
        ("W7", "m/*/*[a-z]*", ("check", "*[a-z]*")),
        ("W9", "m/*/*_*", ("check", "*_*")),
        ("M6", "m/*/d*", ("check", "d*")),  # one letter of a name pins down nothing
        ("M6", "m/*/*s", ("check", "*s")),
        ("M6", "m/plain/*", ("check", "*")),  # every check of a scenario: name each check
        ("M6", "m/*e*/decode_logits", ("scenario", "*e*")),
    ],
)
def test_m6_w1_w6_a_part_that_matches_by_a_letter_is_refused(case: str, check: str, part: tuple[str, str]) -> None:
    """M6 (W1-W6): a scenario or check part that pins down no word of a name (`*o*`, `?*t*`,
    `**`) is refused, naming the entry, the part and what is expected, like the model part."""
    with pytest.raises(WaiverError) as excinfo:
        parse_waivers([_entry("m/a/b"), _entry(check)], "w.yaml")
    message = str(excinfo.value)
    kind, text = part
    assert message.startswith(f"w.yaml: [1].check: the {kind} part must name a {kind} literally"), (case, message)
    assert f"got {text!r} in {check!r}" in message and "anchored on whole words" in message, message


def test_m6_w1_the_probe_s_waiver_stops_the_sign_off_before_it_judges(tmp_path: Path) -> None:
    """M6 (W1): `fakeplug/*/*o*` over a report whose checks all ERRORed was SIGNED OFF (WAIVED 7);
    now the waivers file is refused (exit 2) and no sign-off is written."""
    results = [
        ItemResult("fakeplug", "plain", c, "L1", "mlx-lm", "error", "the plug-in never answered")
        for c in ("prompt_identity", "decode_logits", "greedy_tokens", "eos_stop", "prefill_logits", "detokenize")
    ]
    report = tmp_path / "report.json"
    report.write_text(json.dumps(build_report(results, {"device": {"key": "k"}}, dt.datetime.now(dt.UTC))))
    waivers = tmp_path / "w.yaml"
    waivers.write_text('- check: "fakeplug/*/*o*"\n  reason: r\n  owner: a\n  expires: 2026-12-31\n')
    out = _cli("signoff", "--from-report", str(report), "--out", str(tmp_path / "so"), "--waivers", str(waivers))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert out.stderr.startswith(f"error: {waivers}: [0].check: the check part must name a check literally")
    assert "SIGNED OFF" not in out.stdout and not (tmp_path / "so").exists()


def test_m6_l24_w10_a_waiver_expiring_more_than_a_year_ahead_is_refused() -> None:
    """L24 (W10): `expires: 9999-12-31` was a permanent waiver; a waiver expires at most a year
    after the day it is read (docs/signoff.md), and the error names the waiver and the date."""
    today = dt.date(2026, 12, 6)
    with pytest.raises(WaiverError) as excinfo:
        parse_waivers([_entry("m/plain/decode_logits", "9999-12-31")], "w.yaml", today=today)
    assert str(excinfo.value) == (
        "w.yaml: [0].expires: the waiver of 'm/plain/decode_logits' expires on 9999-12-31, more than a year "
        "ahead; a waiver is renewed at least yearly: choose a date on or before 2027-12-06"
    )
    (w,) = parse_waivers([_entry("m/plain/decode_logits", "2027-12-06")], "w.yaml", today=today)  # a year: fine
    assert w.expires == dt.date(2027, 12, 6)
    with pytest.raises(WaiverError, match="expires on 2027-12-07, more than a year ahead"):
        parse_waivers([_entry("m/plain/decode_logits", "2027-12-07")], "w.yaml", today=today)
    assert parse_waivers([_entry("m/plain/decode_logits", "2020-01-01")], "w.yaml", today=today)  # blocks later
    with pytest.raises(WaiverError, match="on or before 2029-02-28"):  # from a leap day
        parse_waivers([_entry("m/plain/decode_logits", "2029-03-01")], "w.yaml", today=dt.date(2028, 2, 29))
