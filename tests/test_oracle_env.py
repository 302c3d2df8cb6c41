"""Oracle isolation and the one-mlx rule: refuse to generate or compare across mlx versions."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from harness.errors import OracleError, OracleVersionError
from harness.oracle.descriptor import MLX_FREE_ORACLES, oracle_family
from harness.oracle.pins import NODEPS_MARKER, pins_hash, read_pins
from harness.oracle.venvs import OracleEnv, check_same_mlx
from harness.paths import oracles_dir
from harness.runners.oracle import OracleRunner
from tests.conftest import write_profile
from tests.fakes import fake_session


def fake_env(root: Path, mlx: str) -> OracleEnv:
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\necho '{json.dumps({'mlx': mlx, 'mlx-lm': '0.32.2'})}'\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return OracleEnv(name="mlx-lm", root=root, pins_hash="x", pins="")


def test_oracle_with_other_mlx_is_refused_naming_both(tmp_path: Path) -> None:
    env = fake_env(tmp_path / "venv", "0.31.0")
    with pytest.raises(OracleVersionError, match=r"has mlx 0\.31\.0, its comparisons run mlx 0\.32\.4"):
        check_same_mlx(env, "0.32.4")
    assert check_same_mlx(env, "0.31.0")["mlx"] == "0.31.0"


def test_generation_is_refused_before_the_generator_runs(tmp_path: Path) -> None:
    runner = OracleRunner("mlx-lm")
    runner.process._env = fake_env(tmp_path / "venv", "0.31.0")
    with pytest.raises(OracleVersionError):
        runner.run(tmp_path, [{"id": "x"}])


def test_golden_from_another_mlx_is_not_compared(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    manifest = json.loads(golden.manifest_path.read_text())
    manifest["oracle_environment"]["mlx"] = "0.31.0"
    golden.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(OracleVersionError, match=r"made by an oracle running mlx 0\.31\.0"):
        fake_session(isolated).goldens(session.profile("tiny"))


def test_pins_change_the_venv_key_and_comments_do_not() -> None:
    pins = (oracles_dir() / "mlx-lm" / "requirements.txt").read_text()
    assert pins_hash(pins) != pins_hash(pins.replace("mlx-lm==0.32.2", "mlx-lm==0.32.1"))
    assert "#" in pins
    edited = "# a new comment line\n\n" + pins.replace("mlx-lm==0.32.2", "  mlx-lm==0.32.2   # the oracle") + "\n\n"
    assert pins_hash(edited) == pins_hash(pins)  # comments, blank lines, spaces: the same venv
    nodeps = read_pins("mlx-whisper")
    moved = nodeps.replace("\nmlx-whisper==0.4.3", "").replace(NODEPS_MARKER, "mlx-whisper==0.4.3\n" + NODEPS_MARKER)
    assert pins_hash(moved) != pins_hash(nodeps)  # which file a pin is in still counts


def test_the_mlx_pin_is_checked_before_a_venv_is_built(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong mlx pin is refused before minutes of pip, naming the file and both versions."""
    import harness.oracle.venvs as venvs

    tracked = {oracle: read_pins(oracle) for oracle in ("mlx-lm", "mlx-optiq", "mlx-whisper")}
    for oracle, pins in tracked.items():
        venvs.check_mlx_pin(oracle, pins, "0.32.4")  # the tracked pins pass
    with pytest.raises(OracleVersionError, match="no exact mlx pin"):
        venvs.check_mlx_pin("mlx-lm", "mlx-lm==0.32.2\n", "0.32.4")
    with pytest.raises(OracleVersionError, match="it must run without mlx"):
        venvs.check_mlx_pin("silero-vad", "mlx==0.32.4\n", "0.32.4")
    monkeypatch.setattr(venvs, "_build", lambda env, *how: pytest.fail("built a venv with a wrong mlx pin"))
    oracles = isolated / "oracles"
    (oracles / "mlx-lm").mkdir(parents=True)
    (oracles / "mlx-lm" / "requirements.txt").write_text(tracked["mlx-lm"].replace("==0.32.4", "==0.31.0"))
    import harness.oracle.pins as pins_module

    monkeypatch.setattr(pins_module, "oracles_dir", lambda: oracles)
    with pytest.raises(
        OracleVersionError,
        match=r"oracle mlx-lm: its pins install mlx 0.31.0 on this platform, the project runs mlx 0.32.4: "
        r"pin mlx==0.32.4 in .*mlx-lm/requirements.txt \(nothing was built\)",
    ):
        venvs.ensure_oracle_env("mlx-lm")


# Oracles that compute with PyTorch (judged on tokens, or within a declared tolerance).
TORCH_ORACLES = tuple(o for o in MLX_FREE_ORACLES if oracle_family(o) == "torch")


def test_oracle_and_project_pin_the_same_mlx() -> None:
    def mlx_pins(path: Path) -> list[str]:
        return sorted(
            line for line in path.read_text().splitlines() if line.startswith("mlx[") or line.startswith("mlx==")
        )

    project = mlx_pins(oracles_dir().parent / "requirements.txt")
    assert project and all("0.32.4" in line for line in project)
    for pins in oracles_dir().glob("*/requirements.txt"):
        if pins.parent.name in MLX_FREE_ORACLES:
            assert mlx_pins(pins) == [], pins  # PyTorch oracles and native runtimes: no mlx in their venv
        else:
            assert mlx_pins(pins) == project, pins


def test_generator_imports_only_its_venv() -> None:
    """The generator must not reach into the harness or the in-tree models."""
    for script in oracles_dir().glob("*/*.py"):
        text = script.read_text()
        assert "import harness" not in text and "from harness" not in text, script
        assert "import models" not in text and "from models" not in text, script


# -- PyTorch oracles run PyTorch's CPU build -----------------------------------------------------


def test_a_cuda_torch_resolution_is_refused_naming_the_cpu_wheel_index() -> None:
    from harness.oracle.pins import cpu_wheel_index, refuse_cuda_torch

    pins = oracles_dir() / "silero-vad" / "requirements.txt"
    assert cpu_wheel_index(pins) == "https://download.pytorch.org/whl/cpu"
    refuse_cuda_torch("silero-vad", pins, {"torch": "2.13.0+cpu", "numpy": "2.4.6"}, "resolved")  # the CPU build
    cuda = {"torch": "2.13.0", "nvidia-cublas": "13.1.0.3", "triton": "3.6.0"}
    with pytest.raises(
        OracleError,
        match=r"resolved a CUDA build, torch 2.13.0 with nvidia-cublas, triton.*download\.pytorch\.org/whl/cpu",
    ):
        refuse_cuda_torch("silero-vad", pins, cuda, "resolved")
    with pytest.raises(OracleError, match=r"installed a CUDA build, torch 2.13.0\+cu130 built for CUDA 13.0"):
        refuse_cuda_torch("silero-vad", pins, {"torch": "2.13.0+cu130"}, "installed", cuda="13.0")


@pytest.mark.parametrize("oracle", TORCH_ORACLES)
def test_built_torch_venvs_hold_no_cuda(oracle: str) -> None:
    import json
    import subprocess

    from harness.oracle.venvs import _CUDA_PROBE, ensure_oracle_env, refuse_cuda_torch

    env = ensure_oracle_env(oracle)
    cmd, run_env = env.command("-c", _CUDA_PROBE)
    facts = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=run_env, check=True).stdout)
    assert "torch" in facts["dists"] and facts["cuda"] is None
    refuse_cuda_torch(oracle, env.root, facts["dists"], "installed", cuda=facts["cuda"])


def test_a_venv_whose_interpreter_vanished_is_built_again(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.oracle.venvs as venvs

    built = []
    monkeypatch.setattr(venvs, "_build", lambda env, *how: built.append(env.root))
    root = isolated / "cache" / "venvs" / f"mlx-lm-{pins_hash(read_pins('mlx-lm'))}"
    (root / "bin").mkdir(parents=True)
    (root / ".complete").write_text("x\n")  # finished once; its interpreter is gone since
    venvs.ensure_oracle_env("mlx-lm")
    assert built == [root] and not (root / ".complete").exists()


def test_every_oracle_folder_has_a_descriptor_whose_scripts_take_one_command_line() -> None:
    """One row per oracles/<name>/ folder; every script there is declared, exists, and parses
    the one command line (`--job JOB.json --out DIR`, oracles/common/oracle_base.py)."""
    from harness.oracle.descriptor import ORACLES

    folders = {p.name for p in oracles_dir().iterdir() if (p / "requirements.txt").is_file()}
    assert folders == set(ORACLES)
    for name, oracle in ORACLES.items():
        assert {p.name for p in (oracles_dir() / name).glob("*.py")} == set(oracle.scripts), name
        for script in oracle.scripts:
            text = oracle.script(script).read_text()
            # fuzz_serve.start parses with base.parser for both warm fuzz servers (oracles/common/fuzz_serve.py)
            parses = ("base.job_and_out(", "base.read_job(", "base.parser(", "fuzz_serve.start(")
            assert any(call in text for call in parses), f"{name}/{script}: not --job/--out"
            assert "argparse" not in text, f"{name}/{script}: a command line of its own"


def test_an_undeclared_script_or_oracle_is_an_error_naming_what_there_is() -> None:
    from harness.oracle.descriptor import descriptor

    with pytest.raises(OracleError, match=r"oracle mlx-lm has no script 'calibrate.py': it runs \['generate.py'"):
        descriptor("mlx-lm").script("calibrate.py")
    with pytest.raises(OracleError, match=r"unknown oracle 'xyzzy': expected one of: ctranslate2, llama-cpp, mlx-lm, "):
        descriptor("xyzzy")


@pytest.mark.parametrize("uv_works", [True, False])
def test_a_venv_is_built_with_uv_and_with_pip_when_uv_fails(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, uv_works: bool
) -> None:
    import shutil

    import harness.oracle.venvs as venvs

    pins = isolated / "pins.txt"
    pins.write_text("six==1.17.0\n")
    if not uv_works:  # an uv that fails: pip builds the venv, and the log says why
        broken = isolated / "bin" / "uv"
        broken.parent.mkdir()
        broken.write_text("#!/bin/sh\necho 'uv: no solution' >&2\nexit 2\n")
        broken.chmod(0o755)
        which = shutil.which
        monkeypatch.setattr(venvs.shutil, "which", lambda name, path=None: str(broken) if name == "uv" else which(name))
    env = OracleEnv(name="six-probe", root=isolated / "cache" / "venvs" / "six-probe-x", pins_hash="x", pins="")
    venvs.ensure_built(env, lambda: None, venvs.Pins(pins))
    probe = f"{env.python} -I -c 'import six; print(six.__version__)'"
    assert __import__("subprocess").run(probe, shell=True, capture_output=True, text=True).stdout.strip() == "1.17.0"
    log = (env.root.parent / f"{env.root.name}.build.log").read_text()
    if uv_works:
        assert " pip install --python " in log and " -m pip install" not in log
    else:
        assert "uv could not build it" in log and " -m pip install" in log


def test_an_interrupted_venv_build_leaves_nothing_and_a_killed_ones_folder_is_swept(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile probe 2, L11 (A6): Ctrl-C during a venv build left `<venv>.building-<pid>` behind
    for good, and printed a KeyboardInterrupt traceback."""
    import harness.oracle.venvs as venvs

    root = isolated / "cache" / "venvs" / "probe-x"
    root.parent.mkdir(parents=True)
    env = OracleEnv(name="probe", root=root, pins_hash="x", pins="")
    killed = root.with_name("probe-x.building-999999")  # a build whose process was killed
    (killed / "bin").mkdir(parents=True)

    def interrupted(env, how, tmp, out, log):
        (tmp / "bin").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(venvs, "_install", interrupted)
    with pytest.raises(KeyboardInterrupt):
        venvs.ensure_built(env, lambda: None, venvs.Pins(isolated / "pins.txt"))
    assert not killed.exists()  # swept under the lock, before building
    assert not list(root.parent.glob("probe-x.building-*")) and not root.exists()  # its own, removed


def test_ctrl_c_in_a_verb_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import harness.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    from harness.cli.verbs import BY_NAME

    verb = next(v for v in BY_NAME.values() if v.name == "list")
    module, function = verb.target.split(":")
    monkeypatch.setattr(__import__("importlib").import_module(module), function, interrupted)
    assert cli.main(["list"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted: python -m harness list stopped"
