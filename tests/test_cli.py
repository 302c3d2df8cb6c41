"""Bad input through the real command line: one clear message, non-zero exit, nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from harness.report import build_report, write_report
from tests.conftest import VALID_PROFILE, write_profile


def harness_cli(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120
    )


def test_unknown_model_exits_non_zero_naming_it(isolated: Path) -> None:
    write_profile(isolated)
    out = harness_cli("parity", "--model", "no-such-model")
    assert out.returncode != 0
    assert "unknown model 'no-such-model'" in out.stdout + out.stderr
    assert "known models: tiny" in out.stdout + out.stderr
    out = harness_cli("parity", "--model", "tinny")
    assert out.returncode != 0 and "did you mean 'tiny'?" in out.stdout + out.stderr
    out = harness_cli("goldens", "--model", "no-such-model")
    assert out.returncode == 2 and "unknown model 'no-such-model'" in out.stderr


def test_malformed_profile_exits_non_zero_naming_file_and_key(isolated: Path) -> None:
    path = write_profile(isolated, text=VALID_PROFILE.format(name="tiny").replace("tier: L1", "tier: gold"))
    out = harness_cli("parity", "--model", "tiny")
    assert out.returncode != 0
    assert f"{path}: tier: expected one of 'L1' | 'L2', got 'gold'" in out.stdout
    (report,) = (isolated / "reports").glob("*.json")  # the profile's collection error is the report's one row
    data = json.loads(report.read_text())
    assert data["verdict"] == "FAIL" and [r["outcome"] for r in data["results"]] == ["error"]
    assert not list((isolated / "goldens").rglob("*.json"))


def test_missing_artifact_exits_non_zero_and_writes_no_golden(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(isolated)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(isolated / "empty-hf-cache"))
    out = harness_cli("goldens", "--model", "tiny")
    assert out.returncode == 2
    assert "missing artifact example-org/tiny-llama@0123456789abcdef0123456789abcdef01234567" in out.stderr
    assert not list((isolated / "goldens").rglob("*.json"))
    out = harness_cli("parity", "--model", "tiny")
    assert out.returncode == 1 and "ERROR tiny/plain" in out.stdout
    assert "detail   missing artifact example-org/tiny-llama@0123456789abcdef0123456789abcdef01234567" in out.stdout


def test_reports_are_never_clobbered(isolated: Path) -> None:
    report = build_report([], {}, __import__("datetime").datetime.now())
    path = write_report(report, isolated / "reports" / "r.json")
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        write_report(report | {"verdict": "FAIL"}, path)
    assert path.read_bytes() == before
