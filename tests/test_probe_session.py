"""Hostile-probe defects of the session and the oracle runner (issue 31 part 4; the probe is
../shared/reviews/hostile-probe.md, items 5, 7, 8 and 9), each reproduced first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.errors import InTreeRunError, OracleError
from harness.oracle import process as process_module
from harness.oracle.process import OWNER_FILE, sweep_stale_work_dirs
from harness.progress import progress
from harness.records import ScenarioRecord
from harness.runners.oracle import OracleRunner
from harness.settings import BY_NAME
from tests.conftest import write_profile
from tests.fakes import FakeOracle, fake_session


@pytest.fixture(autouse=True)
def _no_localization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")


class _CrashOnce:
    """An in-tree side whose first run raises (a one-off crash), later runs replay the oracle."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, spec, forced=None) -> ScenarioRecord:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("in-tree crash")
        record = FakeOracle.records([spec])[spec["id"]]
        record.mode = "teacher_forced" if forced is not None else "free"
        return record


def test_item5_an_intree_crash_is_remembered_not_retried_per_check(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    runner = session._runners["tiny"] = _CrashOnce()
    profile = session.profile("tiny")
    plain = profile.scenario("plain")
    with pytest.raises(RuntimeError, match="in-tree crash"):
        session.run_check(profile, plain, "decode_logits")
    for check in ("decode_logits", "teacher_forced_logits", "greedy_tokens"):
        with pytest.raises(
            InTreeRunError, match=r"tiny/plain: the in-tree run already failed .*RuntimeError: in-tree crash"
        ):
            session.run_check(profile, plain, check)
    assert runner.runs == 1  # one run, one traceback; the retries did not pass
    assert session.run_check(profile, profile.scenario("chat"), "decode_logits").passed  # other scenarios run


def test_item8_a_golden_that_does_not_reproduce_runs_the_oracle_once(isolated: Path, monkeypatch) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    manifest = json.loads(golden.manifest_path.read_text())
    manifest["compact"]["logits"]["row_sha256"][2] = "0" * 64  # as a golden that no longer reproduces
    golden.manifest_path.write_text(json.dumps(manifest))
    import shutil

    shutil.rmtree(isolated / "cache" / "blobs", ignore_errors=True)
    monkeypatch.setattr(FakeOracle, "counter", isolated / "oracle-runs")
    fresh = fake_session(isolated)
    fresh._runners["tiny"] = _CrashOnce()
    fresh._runners["tiny"].runs = 1  # no crash: replays the oracle
    profile = fresh.profile("tiny")
    for check in ("decode_logits", "teacher_forced_logits"):
        with pytest.raises(OracleError, match="not reproducible"):
            fresh.run_check(profile, profile.scenario("plain"), check)
    assert len((isolated / "oracle-runs").read_text().splitlines()) == 1


class _Env:
    """An oracle venv whose generator is any command."""

    def __init__(self, code: str):
        self.generator = "generate.py"
        self.code = code

    def command(self, *args: str):
        return [sys.executable, "-c", self.code], dict(os.environ)


def test_item9_a_generator_that_dies_is_said_failed_never_done(isolated: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MLX_PARITY_QUIET", "0")
    monkeypatch.setattr(process_module, "check_same_mlx", lambda env, mlx: None)
    runner = OracleRunner("mlx-lm")
    runner.process._env = _Env("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    monkeypatch.setattr(progress.console, "file", sys.stderr)
    with pytest.raises(OracleError, match=r"mlx-lm generate.py failed \(exit -9\)"):
        runner.run(isolated, [{"id": "plain"}])
    err = capsys.readouterr().err
    assert "generating goldens for plain: failed after" in err and ": done in" not in err, err


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_item7_work_dirs_of_a_killed_harness_are_swept(tmp_path: Path) -> None:
    dead, live, legacy = tmp_path / "oracle-dead", tmp_path / "oracle-live", tmp_path / "oracle-legacy"
    for work in (dead, live, legacy):
        (work / "out").mkdir(parents=True)
    (dead / OWNER_FILE).write_text(f"{_dead_pid()}\n")
    (live / OWNER_FILE).write_text(f"{os.getpid()}\n")
    assert sweep_stale_work_dirs(tmp_path) == [dead]
    assert live.exists() and legacy.exists()  # a fresh directory without an owner may be being made
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    assert sweep_stale_work_dirs(tmp_path) == [legacy]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_item7_the_generator_dies_with_a_killed_harness(tmp_path: Path) -> None:
    """A 'harness' process starts a script the way OracleProcess does and is SIGKILLed."""
    pid_file = tmp_path / "generator.pid"
    harness = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""\
                import subprocess, sys
                from harness.oracle.process import _parent_death_signal
                subprocess.run([sys.executable, "-c",
                    "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"],
                    preexec_fn=_parent_death_signal())
            """),
        ],
        cwd=Path(__file__).resolve().parent.parent,
    )
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    generator = int(pid_file.read_text())
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(generator, 0)
            if Path(f"/proc/{generator}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return  # dead, waiting for a PID 1 that does not reap
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.05)
    os.kill(generator, signal.SIGKILL)
    pytest.fail(f"the generator {generator} ran on after its harness was killed")


@pytest.mark.parametrize("name", ["MLX_PARITY_OVERLAP", "MLX_PARITY_LOCALIZE", "MLX_PARITY_QUIET"])
def test_item14_a_nonsense_flag_is_an_error_not_on(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.settings import SettingError, read

    field = BY_NAME[name].field
    monkeypatch.setenv(name, "banana")
    with pytest.raises(SettingError, match=rf"{name}='banana': expected one of 1/true/yes/on .* or 0/false/no/off"):
        read()
    for value, on in (
        ("0", False),
        ("off", False),
        ("FALSE", False),
        ("1", True),
        ("yes", True),
        ("", BY_NAME[name].default),
    ):
        monkeypatch.setenv(name, value)
        assert getattr(read(), field) is on


def test_item14_and_item4_the_cli_refuses_bad_settings_before_it_starts(isolated: Path) -> None:
    for env, message in (
        ({"MLX_PARITY_LOCALIZE": "maybe"}, "MLX_PARITY_LOCALIZE='maybe': expected one of"),
        ({"MLX_PARITY_GOLDENS": ""}, "MLX_PARITY_GOLDENS is set but empty: unset it for the default"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "harness", "parity", "--model", "tiny"],
            env=os.environ | env,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_item4_an_empty_goldens_setting_never_means_the_current_directory(monkeypatch, tmp_path: Path) -> None:
    from harness.paths import goldens_dir
    from harness.settings import SettingError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLX_PARITY_GOLDENS", "")
    with pytest.raises(SettingError, match="MLX_PARITY_GOLDENS is set but empty"):
        goldens_dir()
    assert list(tmp_path.iterdir()) == []
