"""MLX_PARITY_DEVICE (`make parity DEVICE=cpu`): every side of a comparison computes on the device
asked for, or the run stops naming why. MLX reads no variable for its default device, so each
side is made to select it: the harness's process, an oracle's script (a bootstrap that selects
the device and runs the script unchanged) and a plug-in's host. On a machine whose MLX has no GPU
(this one), asking for the GPU is the observable proof that a side really selected the device."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import harness.device as device
from harness.device import check_real_device, paravirtual_metal, passed_over_gpu
from harness.errors import HarnessError
from harness.oracle.plugin import HOST
from harness.oracle.venvs import OracleEnv
from harness.paths import REPO_ROOT
from harness.provenance import DeviceFacts
from harness.screen import device_notes
from harness.signoff.summary import _requested

HAS_GPU = mx.is_available(mx.gpu)
SCRIPT = """\
import json, sys
try:
    import mlx.core as mx
    where = str(mx.default_device())
except ImportError:
    where = None
print(json.dumps({"name": __name__, "argv": sys.argv, "file": __file__, "device": where,
                  "script_dir_on_path": any(p.rstrip("/") == %r for p in sys.path)}))
"""


def _harness(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=os.environ | {"MLX_PARITY_QUIET": "1", **env},
        timeout=120,
    )


def test_a_device_the_harness_cannot_use_stops_every_verb_naming_it() -> None:
    out = _harness("list", MLX_PARITY_DEVICE="tpu")
    assert out.returncode == 2 and "MLX_PARITY_DEVICE='tpu': expected one of cpu, gpu" in out.stderr
    if not HAS_GPU:
        out = _harness("list", MLX_PARITY_DEVICE="gpu")
        assert out.returncode == 2, out.stdout[-500:]
        assert "MLX_PARITY_DEVICE=gpu: MLX has no GPU here" in out.stderr
    assert _harness("list", MLX_PARITY_DEVICE="CPU").returncode == 0  # any case


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "oracle_script" / "generate.py"
    script.parent.mkdir()
    script.write_text(SCRIPT % str(script.parent))
    return script


def _run(env: OracleEnv, script: Path) -> subprocess.CompletedProcess[str]:
    cmd, child_env = env.command(str(script), "--job", "job.json")
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=120)


def test_an_oracle_script_runs_on_the_requested_device_as_if_run_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path)
    oracle = OracleEnv("fake-oracle", tmp_path, "", "", external_python=Path(sys.executable))
    monkeypatch.delenv("MLX_PARITY_DEVICE", raising=False)
    plain = json.loads(_run(oracle, script).stdout)
    assert oracle.command(str(script))[0][2:] == [str(script)]  # nothing requested: the command is unchanged
    monkeypatch.setenv("MLX_PARITY_DEVICE", "cpu")
    cmd = oracle.command(str(script), "--job", "job.json")[0]
    assert cmd[2:5] == ["-c", device.BOOTSTRAP, "cpu"] and cmd[5:] == [str(script), "--job", "job.json"]
    on_cpu = json.loads(_run(oracle, script).stdout)
    assert on_cpu["device"] == "Device(cpu, 0)"
    for same in ("name", "argv", "file", "script_dir_on_path"):  # the script sees what a direct run shows it
        assert on_cpu[same] == plain[same], same
    assert on_cpu["name"] == "__main__" and on_cpu["argv"] == [str(script), "--job", "job.json"]
    monkeypatch.setenv("MLX_PARITY_DEVICE", "gpu")
    on_gpu = _run(oracle, script)
    if HAS_GPU:
        assert json.loads(on_gpu.stdout)["device"] == "Device(gpu, 0)"
    else:
        assert on_gpu.returncode == 1 and "MLX_PARITY_DEVICE=gpu: this interpreter's MLX has no GPU" in on_gpu.stderr


def test_an_interpreter_without_mlx_runs_the_script_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch oracle's venv has no mlx: the bootstrap imports none and the script runs as it is."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    oracle = OracleEnv("torch-like", venv, "", "")
    script = _script(tmp_path)
    monkeypatch.setenv("MLX_PARITY_DEVICE", "gpu")  # would stop an interpreter with mlx and no GPU
    out = _run(oracle, script)
    assert out.returncode == 0, out.stderr[-1000:]
    assert json.loads(out.stdout) | {"file": None} == {
        "name": "__main__",
        "argv": [str(script), "--job", "job.json"],
        "file": None,
        "device": None,
        "script_dir_on_path": False,  # -I: as an isolated run of the script
    }


def _hello(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    folder = REPO_ROOT / "tests" / "protocol"
    return subprocess.run(
        [sys.executable, "-I", str(HOST), "fake_factory:Replay", str(folder)],
        input=json.dumps({"op": "hello"}) + "\n" + json.dumps({"op": "bye"}) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_plugin_host_selects_the_requested_device_before_importing_the_implementation() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLX_PARITY_DEVICE"}
    out = _hello(env | {"MLX_PARITY_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr[-1000:]
    assert json.loads(out.stdout.splitlines()[0])["op"] == "hello"
    if not HAS_GPU:
        out = _hello(env | {"MLX_PARITY_DEVICE": "gpu"})
        assert out.returncode == 1 and "MLX_PARITY_DEVICE=gpu: this venv's MLX has no GPU" in out.stderr
        assert out.stdout == ""  # it stopped before the implementation was imported or answered


METAL = DeviceFacts("gpu", "arm64", "darwin", "Apple M2", "apple", "accelerate", "0.32.4", "applegpu_g13g", "14.6")


def _fake_paravirtual_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mx, "is_available", lambda d: True)
    monkeypatch.setattr(mx, "device_info", lambda d=None: {"device_name": "Apple Paravirtual device"})
    monkeypatch.setattr(device, "hypervisor_present", lambda: True)


def test_the_cpu_of_a_hosted_mac_is_gated_and_says_which_gpu_it_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_paravirtual_mac(monkeypatch)
    monkeypatch.setenv("MLX_PARITY_DEVICE", "cpu")
    gpu = passed_over_gpu("darwin")
    assert gpu["name"] == "Apple Paravirtual device"
    assert gpu["virtual"] == paravirtual_metal("Apple Paravirtual device", True)
    cpu = dataclasses.replace(
        METAL,
        backend="cpu",
        requested="cpu",
        passed_over=f"Apple Paravirtual device (a virtual machine's: {gpu['virtual']})",
    )
    check_real_device(cpu)  # the CPU device there is not refused
    assert cpu.key == "cpu-arm64-accelerate-mlx0.32.4"
    (note,) = device_notes(cpu.as_dict())
    assert note.startswith("device: cpu (MLX_PARITY_DEVICE=cpu), golden key cpu-arm64-accelerate-mlx0.32.4")
    assert "not on this machine's GPU, Apple Paravirtual device (a virtual machine's: MLX names" in note
    assert "the cpu device (MLX_PARITY_DEVICE=cpu), not this machine's GPU, Apple Paravirtual" in _requested(
        cpu.as_dict()
    )
    assert device_notes(METAL.as_dict()) == [] and _requested(METAL.as_dict()) == ""  # MLX's default: silent
    monkeypatch.delenv("MLX_PARITY_DEVICE")
    assert passed_over_gpu("darwin") == {}  # the GPU is in use: nothing passed over


def test_asking_for_a_paravirtual_gpu_is_refused_naming_the_cpu_way(monkeypatch: pytest.MonkeyPatch) -> None:
    virtual = paravirtual_metal("Apple Paravirtual device", True)
    for requested, chosen in (("gpu", "MLX_PARITY_DEVICE=gpu asks for it"), ("", "it is MLX's default device")):
        facts = dataclasses.replace(METAL, virtual=virtual, requested=requested)
        with pytest.raises(HarnessError) as refused:
            check_real_device(facts)
        assert chosen in str(refused.value) and "make parity DEVICE=cpu" in str(refused.value)


def _parity_plain(root: Path, **env: str) -> tuple[dict, dict, str]:
    """`parity --scenario plain` of smollm2-135m with goldens made afresh by the oracle into `root`."""
    for sub in ("goldens", "reports"):
        (root / sub).mkdir(parents=True)
    dirs = {f"MLX_PARITY_{s.upper()}": str(root / s) for s in ("goldens", "reports")}
    clean = {k: v for k, v in os.environ.items() if k != "MLX_PARITY_DEVICE"}
    out = subprocess.run(
        [sys.executable, "-m", "harness", "parity", "--model", "smollm2-135m", "--scenario", "plain"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=clean | dirs | {"MLX_PARITY_HISTORY": str(root / "h.sqlite"), "MLX_PARITY_QUIET": "1", **env},
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (golden,) = (root / "goldens" / "smollm2-135m").glob("*/plain.json")
    (report,) = (root / "reports").glob("parity-*.json")
    return json.loads(golden.read_text()), json.loads(report.read_text()), out.stdout


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
@pytest.mark.xdist_group("smollm2-135m")
def test_a_golden_made_through_the_bootstrap_is_the_direct_run_s_bit_for_bit(tmp_path: Path) -> None:
    """The real oracle (mlx-lm's venv) on the CPU, once run directly and once through the device
    bootstrap: every recorded bit and provenance field is the same; the run says what was asked."""
    direct, direct_report, direct_out = _parity_plain(tmp_path / "direct")
    booted, booted_report, booted_out = _parity_plain(tmp_path / "booted", MLX_PARITY_DEVICE="cpu")
    for when in ("harness_commit", "generated_at"):
        direct.pop(when), booted.pop(when)
    assert booted == direct
    assert booted["oracle_environment"]["device"] == "Device(cpu, 0)"
    assert booted_report["context"]["device"]["requested"] == "cpu"
    assert direct_report["context"]["device"]["requested"] == ""
    assert "device: cpu (MLX_PARITY_DEVICE=cpu), golden key" in booted_out and "MLX_PARITY_DEVICE" not in direct_out
