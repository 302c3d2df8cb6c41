"""No false verdicts (issue 15, part 1): every collected item ends as a row of the verdict.

Through the real command line, with checks scripted by tests/fault_plugin.py (no model is
loaded): a crash of any kind, an interrupted run, a failing teardown, a profile that does not
collect, an unwritable report, NaN in a result, a model no scenario of which runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checks import registry
from harness.paths import REPO_ROOT
from tests.conftest import VALID_PROFILE, write_profile


def _cli(*args: str, faults: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT), "MLX_PARITY_TEST_FAULTS": json.dumps(faults or {})}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300
    )


def _parity(root: Path, faults: dict[str, str], *extra: str, report: Path | None = None):
    report = report or root / "reports" / f"r{len(list((root / 'reports').iterdir()))}.json"
    out = _cli(
        "parity", "--model", "tiny", "--report", str(report), "--", "-p", "tests.fault_plugin", *extra, faults=faults
    )
    data = json.loads(report.read_text(), parse_constant=_no_constant) if report.exists() else None
    return out, data


def _no_constant(name: str):
    raise AssertionError(f"the report holds the bare JSON constant {name}: not strict JSON")


def _rows(data: dict) -> dict[str, tuple[str, str]]:
    return {f"{r['scenario']}/{r['check']}": (r["outcome"], r["summary"]) for r in data["results"]}


def test_all_scripted_passes_pass(isolated: Path) -> None:
    write_profile(isolated)
    out, data = _parity(isolated, {})
    assert out.returncode == 0, out.stdout[-2000:]
    assert data["verdict"] == "PASS" and data["counts"]["error"] == 0 and data["context"]["exit_status"] == 0
    assert len(data["results"]) >= 4


def test_crashes_nan_and_teardown_errors_are_error_rows_and_block_the_signoff(isolated: Path) -> None:
    """One run: three checks crash (three kinds of exception), one puts NaN in its result, one
    passes and then its profile's teardown fails. Each is a row; the report is strict JSON."""
    write_profile(isolated)
    last = f"chat/{registry.defaults()[-1]}"  # the profile is released after its last check
    faults = {
        "plain/decode_logits": "ValueError",
        "plain/greedy_tokens": "StopIteration",
        "chat/decode_logits": "ZeroDivisionError",
        "chat/prefill_logits": "nan",
        last: "teardown:RuntimeError",
    }
    out, data = _parity(isolated, faults)  # _parse refuses NaN / Infinity constants
    assert out.returncode == 1
    rows = _rows(data)
    for key in ("plain/decode_logits", "plain/greedy_tokens", "chat/decode_logits"):
        exception = faults[key]
        assert rows[key] == ("error", f"{exception}: scripted {exception} in {key}"), rows[key]
    nan = next(r for r in data["results"] if (r["scenario"], r["check"]) == ("chat", "prefill_logits"))
    assert (
        nan["outcome"] == "failed" and nan["details"]["max_abs_diff"] == "NaN" and nan["details"]["inf"] == "-Infinity"
    )
    outcome, summary = rows[last]
    assert outcome == "error"
    assert summary.endswith("then teardown failed: RuntimeError: scripted RuntimeError while releasing tiny")
    assert data["verdict"] == "FAIL" and data["counts"] == {"passed": len(rows) - 5, "failed": 1, "error": 4}
    screen = out.stdout.splitlines()
    shown = "\n".join(line for line in screen if line.startswith("ERROR "))
    for key in ("plain/decode_logits", "plain/greedy_tokens", "chat/decode_logits", last):  # each error, named
        scenario, check = key.split("/")
        assert f"ERROR tiny/{scenario} {check} " in shown or f"ERROR {scenario}/{check}: " in shown, key
    assert screen[-1].startswith("FAIL tiny: 1 failed, 4 errors")  # the verdict, last
    report = next((isolated / "reports").glob("r*.json"))
    waivers = str(_no_waivers(isolated))
    signed = _cli("signoff", "--from-report", str(report), "--out", str(isolated / "so"), "--waivers", waivers)
    assert signed.returncode == 1 and "sign-off: BLOCKED" in signed.stdout
    assert "blocking check tiny/plain/decode_logits" in signed.stdout


def _no_waivers(root: Path) -> Path:
    (root / "waivers.yaml").write_text("[]\n")
    return root / "waivers.yaml"


def test_an_interrupted_run_leaves_no_check_unreported(isolated: Path) -> None:
    write_profile(isolated)
    out, data = _parity(isolated, {"plain/greedy_tokens": "KeyboardInterrupt"})
    assert out.returncode == 2
    rows = _rows(data)
    assert len(rows) == len(data["results"]) >= 4  # every collected item, run or not
    never = [k for k, (o, s) in rows.items() if s.startswith("no result recorded")]
    assert never and all(rows[k][0] == "error" for k in never)
    assert data["verdict"] == "FAIL" and data["context"]["exit_status"] == 2


def test_stopping_early_marks_the_rest(isolated: Path) -> None:
    write_profile(isolated)
    out, data = _parity(isolated, {"plain/decode_logits": "fail"}, "-x")
    assert out.returncode == 1
    outcomes = [o for o, _ in _rows(data).values()]
    # -x stops on purpose: the items it left are listed as not run, not turned into ERROR rows.
    assert outcomes.count("failed") == 1 and "error" not in outcomes and data["verdict"] == "FAIL"
    assert data["context"]["not_run"] and all("::" in n for n in data["context"]["not_run"])


def test_a_profile_that_does_not_collect_is_an_error_row(isolated: Path) -> None:
    path = write_profile(isolated, text=VALID_PROFILE.format(name="tiny").replace("tier: L1", "tier: gold"))
    out, data = _parity(isolated, {})
    assert out.returncode == 2
    assert data["verdict"] == "FAIL"
    ((key, (outcome, summary)),) = _rows(data).items()
    assert key == "(profile)/collect" and outcome == "error"
    assert f"{path}: tier: expected one of 'L1' | 'L2', got 'gold'" in summary


def test_an_unwritable_report_is_one_line_naming_the_path(isolated: Path) -> None:
    write_profile(isolated)
    (isolated / "afile").write_text("")
    target = isolated / "afile" / "r.json"
    out, data = _parity(isolated, {}, report=target)
    assert out.returncode == 3 and data is None
    lines = [line for line in out.stdout.splitlines() if "parity report" in line]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write the parity report {target}: "), lines
    assert "Traceback" not in out.stdout + out.stderr
    existing = isolated / "reports" / "kept.json"
    existing.write_text("{}")
    out, _ = _parity(isolated, {}, report=existing)
    assert out.returncode == 3 and existing.read_text() == "{}"
    assert f"error: the parity report {existing} exists and is never replaced" in out.stdout


def test_a_model_with_no_scenario_for_this_backend_is_listed_not_passed(isolated: Path) -> None:
    text = VALID_PROFILE.format(name="tiny")
    for sid in ("plain", "chat"):
        text = text.replace(f"  - id: {sid}\n", f"  - id: {sid}\n    backends: [gpu]\n")
    write_profile(isolated, text=text)
    out, data = _parity(isolated, {})
    assert out.returncode == 5, out.stdout[-2000:]  # pytest: nothing collected
    assert data["results"] == [] and data["verdict"] == "NO CHECKS RAN"
    assert data["context"]["not_run_here"] == ["tiny"]
    assert "tiny: not run on this backend (cpu): no scenario of it runs here" in out.stdout
    signed = _cli(
        "signoff",
        "--model",
        "tiny",
        "--out",
        str(isolated / "so"),
        "--waivers",
        str(_no_waivers(isolated)),
        "--",
        "-p",
        "tests.fault_plugin",
    )
    summary = next((isolated / "so").glob("signoff-*/summary.md")).read_text()
    assert "not run on this backend (no scenario of it runs here): tiny" in summary
    assert "tiny/plain (gpu only)" in summary
    # Nothing ran at all, so it is not signed off either: "no checks ran" blocks, the model does not.
    assert (
        signed.returncode == 1
        and "blocking model" not in signed.stdout
        and "blocking run parity: no checks ran" in signed.stdout
    )


def test_an_oracle_failure_outside_the_gates_is_reported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing a golden (or a vanished venv interpreter) is one ERROR message for
    every check of the profile, and the oracle is not run again for each of them."""
    from harness.errors import GoldenError
    from harness.goldens.lifecycle import GoldenLifecycle
    from harness.session import ParitySession

    calls = []

    def full_disk(self, profile, regenerate):
        calls.append(profile.name)
        raise OSError(28, "No space left on device", "/cache/goldens/blob.tmp")

    monkeypatch.setattr(GoldenLifecycle, "_load_goldens", full_disk)
    session = ParitySession()
    profile = session.profile("smollm2-135m")
    messages = set()
    for _ in range(6):
        with pytest.raises(GoldenError) as e:
            session.goldens(profile)
        messages.add(str(e.value))
    assert calls == ["smollm2-135m"]
    assert messages == {
        "the goldens of smollm2-135m could not be made or read: OSError: [Errno 28] No space left on device: "
        "'/cache/goldens/blob.tmp'; nothing compared"
    }


def test_a_corrupt_manifest_of_an_unselected_scenario_does_not_stop_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.model_provenance import model_provenance
    from harness.session import ParitySession

    monkeypatch.setenv("MLX_PARITY_GOLDENS", str(tmp_path))
    session = ParitySession()
    profile = session.profile("smollm2-135m")
    scenario = profile.scenarios[0]
    path = session.store(profile.oracle_of(scenario)).manifest_path(profile.name, scenario.id)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff{not json")
    provenance = model_provenance("smollm2-135m")
    assert "corrupted golden manifest" in provenance["goldens"][scenario.id]["error"]
    assert str(path) in provenance["goldens"][scenario.id]["error"]
    path.write_text("[1, 2]")
    assert "expected a JSON object, got list" in model_provenance("smollm2-135m")["goldens"][scenario.id]["error"]


def test_a_check_whose_paths_no_scenario_walked_is_an_error_nothing_exercised(isolated: Path) -> None:
    """Issue 31 part 1: `eos_stop` declares "stops on an EOS id"; when every scenario naming it
    ran and none stopped, the check proved nothing: an ERROR row for the profile, exit 1."""
    write_profile(isolated)
    out, data = _parity(isolated, {"plain/eos_stop": "walked:", "chat/eos_stop": "walked:"})
    assert out.returncode == 1, out.stdout[-2000:]
    outcome, summary = _rows(data)["(profile)/eos_stop"]
    assert outcome == "error" and summary.startswith(
        "nothing exercised: no scenario of tiny walked 'stops on an EOS id'"
    )
    assert "exercise tiny eos_stop: stops on an EOS id: not walked (NOTHING EXERCISED)" in out.stdout
    # One scenario that stops is enough: the coverage line names it, the run passes.
    out, data = _parity(isolated, {"plain/eos_stop": "walked:", "chat/eos_stop": "walked:stops on an EOS id"})
    assert out.returncode == 0 and "(profile)/eos_stop" not in _rows(data), out.stdout[-2000:]
    assert "exercise tiny eos_stop: stops on an EOS id: chat" in out.stdout
    # A selection that leaves a scenario out cannot judge it: said, neither an error nor a pass.
    out, data = _parity(isolated, {"plain/eos_stop": "walked:"}, "-k", "plain")
    assert out.returncode == 0 and "(profile)/eos_stop" not in _rows(data), out.stdout[-2000:]
    assert "stops on an EOS id: not walked (not judged: 1 scenario(s) not run or without a result (chat))" in out.stdout
