"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

VALID_PROFILE = textwrap.dedent(
    """\
    name: {name}
    implementation: universal-llama
    tier: L1
    oracle: mlx-lm
    artifact:
      source: hub
      repo: example-org/tiny-llama
      revision: 0123456789abcdef0123456789abcdef01234567
    expect:
      model_type: llama
    scenarios:
      - id: plain
        prompt: "Hello"
        steps: 3
      - id: chat
        messages:
          - {{role: user, content: "Hi"}}
    """
)


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Profiles, goldens, reports and cache in a temporary tree (the real ones stay untouched)."""
    for name, sub in (("PROFILES", "profiles"), ("GOLDENS", "goldens"), ("REPORTS", "reports"), ("CACHE", "cache")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(f"MLX_PARITY_{name}", str(tmp_path / sub))
    monkeypatch.setenv("MLX_PARITY_QUIET", "1")
    return tmp_path


def parity_env() -> dict[str, str]:
    """The environment of a real `python -m harness parity` child: none of this session's
    MLX_PARITY_* settings but quiet progress, and MLX_PARITY_COVERAGE when set (the gates' runs in
    make test are what models/' branch coverage is made of: harness/branch_coverage.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_PARITY_")} | {"MLX_PARITY_QUIET": "1"}
    if "MLX_PARITY_COVERAGE" in os.environ:
        env["MLX_PARITY_COVERAGE"] = os.environ["MLX_PARITY_COVERAGE"]
    return env


def parity_passes_every_check(model: str, tmp_path: Path) -> str:
    """Run `python -m harness parity --model MODEL` as a user does (a child, parity_env) and assert
    it passes with every check its profile declares for each scenario run and passed; its stdout."""
    from harness.paths import REPO_ROOT
    from harness.profile.load import find_profile

    report_path = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "harness", "parity", "--model", model, "--report", str(report_path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=parity_env(),
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "PASS"
    profile = find_profile(model)
    for scenario in profile.scenarios:
        checks = {r["check"]: r["outcome"] for r in report["results"] if r["scenario"] == scenario.id}
        assert checks == dict.fromkeys(profile.checks(scenario), "passed"), scenario.id
    return out.stdout


def write_profile(root: Path, name: str = "tiny", text: str | None = None) -> Path:
    path = root / "profiles" / f"{name}.yaml"
    path.write_text(text if text is not None else VALID_PROFILE.format(name=name))
    return path


WORD_OPTIONS = {"word_timestamps": True, "temperature": 0.0, "fp16": False}


def fox_words_golden() -> dict:
    """mlx-whisper's generator on fox.wav with word timestamps: the extra of whisper-tiny-en's
    fox-words golden (transcript, decode calls), made by the oracle when the store has none."""
    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile("whisper-tiny-en")
    scenario = profile.scenario("fox-words")
    assert profile.scenario_spec(scenario)["options"] == WORD_OPTIONS, "fox-words no longer times words greedily"
    return session.golden(profile, scenario).record.extra


@pytest.fixture(autouse=True)
def _settings_do_not_leak():
    """A test that changes a harness setting in os.environ without monkeypatch would change every
    later test's run (e.g. MLX_PARITY_LOCALIZE=0 left behind turns localization off): restore it
    and fail the test that leaked it."""
    from harness import settings

    names = [s.name for s in settings.SETTINGS]
    before = {n: os.environ.get(n) for n in names}
    yield
    leaked = {n: os.environ.get(n) for n in names if os.environ.get(n) != before[n]}
    for n in leaked:
        if before[n] is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = before[n]
    if leaked:
        pytest.fail(f"this test left harness settings changed in os.environ: {leaked} (use monkeypatch)")
