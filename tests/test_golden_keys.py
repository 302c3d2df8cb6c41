"""Golden keys name what changes an oracle's bits, per oracle family (harness/provenance.py).

The probes are faked here (no dependence on the host's processor); the end-to-end test at the
bottom runs the real oracles into an empty goldens folder, as on a host with no tracked key.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import provenance
from harness.errors import OracleError, OracleVersionError
from harness.oracle import torch_key as predict
from harness.oracle.descriptor import descriptor
from harness.paths import REPO_ROOT
from harness.provenance import DeviceFacts, TorchFacts, golden_key, mlx_key, torch_key
from tests.conftest import parity_env

EPYC = DeviceFacts(
    backend="cpu",
    arch="x86_64",
    os="linux",
    processor="AMD EPYC f25m1",
    vendor="amd",
    blas="refblas-3.10.0",
    mlx="0.32.4",
    os_version="6.1.0",
)
ZEN2 = dataclasses.replace(EPYC, processor="AMD EPYC f23m49", os_version="6.18.44")
XEON = dataclasses.replace(EPYC, processor="Intel(R) Xeon(R) Platinum 8481C f6m143", vendor="intel")
TORCH = TorchFacts(version="2.13.0+cpu", capability="AVX2")


def test_mlx_key_ignores_the_processor_model_and_vendor() -> None:
    assert mlx_key(EPYC) == mlx_key(ZEN2) == mlx_key(XEON)
    assert mlx_key(EPYC).name == "cpu-x86-64-refblas-3.10.0-mlx0.32.4"
    assert "epyc" not in mlx_key(EPYC).name


@pytest.mark.parametrize(
    "change",
    [
        {"blas": "openblas-0.3.28"},
        {"mlx": "0.32.5"},
        {"arch": "aarch64"},
        {"backend": "gpu", "gpu": "NVIDIA H200"},
    ],
)
def test_mlx_key_changes_with_what_changes_bits(change: dict[str, str]) -> None:
    assert mlx_key(dataclasses.replace(EPYC, **change)).name != mlx_key(EPYC).name


def test_torch_key_follows_vendor_and_capability_not_model() -> None:
    assert torch_key(EPYC, TORCH) == torch_key(ZEN2, TORCH)  # two AMD models, one capability
    assert torch_key(EPYC, TORCH).name != torch_key(XEON, TORCH).name  # Intel vs AMD, both AVX2
    avx512 = dataclasses.replace(TORCH, capability="AVX512")
    assert torch_key(XEON, TORCH).name != torch_key(XEON, avx512).name
    assert torch_key(EPYC, TORCH).name != torch_key(EPYC, dataclasses.replace(TORCH, version="2.13.1+cpu")).name
    assert torch_key(EPYC, TORCH).name == "cpu-x86-64-amd-avx2-torch2.13.0-cpu"
    assert torch_key(EPYC, TORCH).as_dict()["capability"] == "AVX2"


def test_gpu_keys_name_the_gpu() -> None:
    cuda = dataclasses.replace(EPYC, backend="gpu", gpu="NVIDIA H200")
    assert mlx_key(cuda).name == "gpu-x86-64-nvidia-h200-mlx0.32.4"
    m3 = DeviceFacts("gpu", "arm64", "darwin", "Apple M3", "apple", "accelerate", "0.32.4", "applegpu_g15s", "14.6")
    assert mlx_key(m3).name == "metal-applegpu-g15s-14.6-mlx0.32.4"
    assert mlx_key(m3).name != mlx_key(dataclasses.replace(m3, os_version="15.1")).name
    assert mlx_key(m3).name == mlx_key(dataclasses.replace(m3, processor="Apple M3 Pro")).name


def test_aarch64_linux_names_its_vendor_and_part(monkeypatch: pytest.MonkeyPatch) -> None:
    info = {"processor": "0", "BogoMIPS": "243.75", "CPU implementer": "0x41", "CPU part": "0xd0c"}
    monkeypatch.setattr(provenance.platform, "system", lambda: "Linux")
    monkeypatch.setattr(provenance, "_first_cpuinfo_block", lambda: info)
    assert provenance.cpu_vendor() == "arm"
    assert provenance.cpu_model().startswith("arm part 0xd0c")
    info["CPU implementer"] = "0x99"
    assert provenance.cpu_vendor() == "implementer-0x99"


def test_x86_vendor_from_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance.platform, "system", lambda: "Linux")
    for vendor_id, vendor in (("GenuineIntel", "intel"), ("AuthenticAMD", "amd")):
        monkeypatch.setattr(provenance, "_first_cpuinfo_block", lambda v=vendor_id: {"vendor_id": v})
        assert provenance.cpu_vendor() == vendor


def test_golden_key_dispatches_on_the_oracle_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "device_facts", lambda: XEON)
    monkeypatch.setattr(provenance, "ensure_oracle_env", lambda oracle: oracle)
    monkeypatch.setattr(provenance, "torch_facts", lambda env: dataclasses.replace(TORCH, capability="AVX512"))
    monkeypatch.setattr(predict.platform, "machine", lambda: "aarch64")  # no prediction: the venv is asked
    for oracle in ("mlx-lm", "mlx-optiq", "mlx-whisper"):
        assert golden_key(oracle) == mlx_key(XEON)
    for oracle in ("openai-whisper", "silero-vad"):
        assert golden_key(oracle).name == "cpu-x86-64-intel-avx512-torch2.13.0-cpu"
    with pytest.raises(OracleError, match="unknown oracle .some-new-oracle.*descriptor"):
        golden_key("some-new-oracle")


AVX512_FLAGS = {"fpu", "sse2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq"}


def test_the_torch_key_is_named_without_building_the_venv_on_linux_x86(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATen's rule from /proc/cpuinfo's flags and the exact CPU-index pin: no venv built to name a folder."""

    def no_venv(oracle: str) -> None:
        raise AssertionError(f"built the {oracle} venv only to name its golden key")

    monkeypatch.setattr(provenance, "device_facts", lambda: XEON)
    monkeypatch.setattr(provenance, "ensure_oracle_env", no_venv)
    monkeypatch.setattr(predict.platform, "system", lambda: "Linux")
    monkeypatch.setattr(predict.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(predict, "cpu_flags", lambda: AVX512_FLAGS)
    for oracle in ("openai-whisper", "silero-vad"):
        assert golden_key(oracle).name == "cpu-x86-64-intel-avx512-torch2.13.0-cpu"
    monkeypatch.setattr(predict, "cpu_flags", lambda: AVX512_FLAGS - {"avx512vl"})
    assert golden_key("openai-whisper").name == "cpu-x86-64-intel-avx2-torch2.13.0-cpu"
    assert predict.capability({"avx2"}) == "DEFAULT"  # no fma: neither AVX2 nor AVX512 kernels
    # The capability forced, or no CPU flags to read: the venv's torch is asked, as on macOS.
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert predict.predicted_torch_facts("openai-whisper") is None
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setattr(predict, "cpu_flags", set)
    assert predict.predicted_torch_facts("silero-vad") is None


def test_a_built_torch_venv_that_disagrees_with_the_predicted_key_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(predict.platform, "system", lambda: "Linux")
    monkeypatch.setattr(predict.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(predict, "cpu_flags", lambda: AVX512_FLAGS)
    monkeypatch.setattr(predict, "torch_facts", lambda env: TorchFacts(version="2.13.0+cpu", capability="AVX512"))
    predict.check_prediction("openai-whisper", None)  # agrees: nothing to say
    monkeypatch.setattr(predict, "torch_facts", lambda env: TORCH)
    with pytest.raises(OracleVersionError, match="capability AVX2; the golden key was predicted as 2.13.0.cpu, AVX512"):
        predict.check_prediction("openai-whisper", None)


# -- tracked goldens: fresh, or absent --------------------------------------------------------


def _tracked_json() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "goldens"], capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: no tracked goldens to check")
    return [REPO_ROOT / line for line in out.stdout.splitlines() if line.endswith(".json")]


def _tracked_manifests() -> list[Path]:
    return [p for p in _tracked_json() if p.parent.name not in ("calibration", "certificate")]


def test_every_tracked_golden_is_fresh() -> None:
    """A tracked manifest made by another generator, pins, profile or format is stale on every
    machine its key serves: it must be regenerated or removed, not shipped."""
    from harness import COMPACT_GOLDEN_FORMAT, FULL_GOLDEN_FORMAT, HARNESS_VERSION
    from harness.artifacts.files import sha256_file
    from harness.oracle.pins import pins_hash, read_pins
    from harness.oracle.sources import common_sources
    from harness.profile.load import find_profile

    manifests = _tracked_manifests()
    assert manifests
    stale = []
    for path in manifests:
        m = json.loads(path.read_text())
        prov = m["provenance"]
        oracle = prov["oracle"]["name"] if "oracle" in prov else "silero-vad"
        if oracle == "silero-vad":  # the VAD gate's own manifest layout (harness/checks/vad.py)
            generator, pins, version = prov["generator_sha256"], prov["pins_hash"], None
        else:
            generator, pins, version = prov["oracle"]["generator_sha256"], prov["oracle"]["pins_hash"], m["format"]
        python = m.get("oracle_environment", m.get("environment", {})).get("python", "")
        device = prov["device"]
        problems = []
        if path.parent.name != device["key"]:
            problems.append(f"folder {path.parent.name} is not its key {device['key']}")
        if generator != sha256_file(descriptor(oracle).script("generate.py")):  # a variant: its row's
            problems.append("generator changed")
        interpreter = tuple(int(p) for p in python.split(".")[:2])
        # A prepared interpreter (the GPU machine, MLX_PARITY_ORACLE_PYTHON) is identified by
        # its installed versions, which cannot be recomputed here; its generator still can.
        external = pins.startswith("external-")
        system = "darwin" if device.get("backend") == "metal" else "linux"
        if not external and pins != pins_hash(read_pins(oracle), interpreter, device.get("arch", "arm64"), system):
            problems.append(f"pins changed (python {python})")
        if version is not None:
            if version not in (FULL_GOLDEN_FORMAT, COMPACT_GOLDEN_FORMAT):
                problems.append(f"format {version}")
            if prov["harness_version"] != HARNESS_VERSION:
                problems.append("harness version")
            common = {name: sha256_file(path) for name, path in common_sources(oracle).items()}
            if prov["oracle"].get("common_sha256", {}) != common:
                problems.append("oracles/common modules changed")
            profile = find_profile(m["profile"])
            scenario = next((s for s in profile.scenarios if s.id == m["scenario"]), None)
            if scenario is None:
                problems.append("scenario no longer in the profile")
            elif prov["scenario_hash"] != profile.planned(scenario).spec_sha256:
                problems.append("scenario changed")
        if problems:
            stale.append(f"{path.relative_to(REPO_ROOT)}: {', '.join(problems)}")
    assert not stale, f"{len(stale)} stale tracked goldens:\n" + "\n".join(stale[:20])


def test_every_tracked_calibration_record_is_intact_and_of_its_golden() -> None:
    """An L2 fast-path scenario's calibration record (harness/goldens/calibration.py) is tracked
    beside its golden: unedited, measured against that very golden, with the profile's budget;
    and a tracked golden of a whisper-fast scenario comes with its record (fresh or absent)."""
    from harness.goldens.calibration import identity_of, read_record
    from harness.profile.load import find_profile

    records = [p for p in _tracked_json() if p.parent.name == "calibration"]
    problems = []
    for path in records:
        key_dir = path.parent.parent
        model, key, scenario_id = key_dir.parent.name, key_dir.name, path.stem
        manifest_path = key_dir / f"{scenario_id}.json"
        if not manifest_path.is_file():
            problems.append(f"{path.relative_to(REPO_ROOT)}: no tracked golden beside it")
            continue
        m = json.loads(manifest_path.read_text())
        rows = m["compact"]["logits"]["row_sha256"]
        try:
            record = read_record(path, model, scenario_id, key, identity_of(m["record"]["tokens"], rows))
        except Exception as e:  # noqa: BLE001 - every problem is listed
            problems.append(f"{path.relative_to(REPO_ROOT)}: {e}")
            continue
        scenario = find_profile(model).scenario(scenario_id)
        if record.budget != scenario.composition["budget"]["max_differing_tokens"]:
            problems.append(f"{path.relative_to(REPO_ROOT)}: budget {record.budget}, the profile's differs")
    for path in _tracked_manifests():
        m = json.loads(path.read_text())
        if (m.get("scenario_spec", {}).get("composition") or {}).get("kind") == "whisper-fast":
            if (path.parent / "calibration" / path.name) not in records:
                problems.append(f"{path.relative_to(REPO_ROOT)}: a whisper-fast golden without its calibration record")
    assert records
    assert not problems, "\n".join(problems)


# -- a host whose key has no tracked goldens ---------------------------------------------------


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
@pytest.mark.xdist_group("empty-goldens")
def test_an_empty_goldens_folder_is_generated_and_judged(tmp_path: Path) -> None:
    """As on a host of a new key: MLX (mlx-lm) and torch (openai-whisper, silero-vad) goldens are
    generated by their oracles into the empty folder, under their family's key, and judged."""
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    env = parity_env()
    env |= {"MLX_PARITY_GOLDENS": str(goldens), "MLX_PARITY_REPORTS": str(tmp_path)}
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "harness", "parity", "--model", "smollm2-135m", "--model", "whisper-tiny-en"]
    cmd += ["--report", str(report), "--", "-k", "plain or fox-beam5"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads(report.read_text())["results"]
    judged = {(r["model"], r["scenario"]) for r in results if r["outcome"] == "passed"}
    assert {("smollm2-135m", "plain"), ("whisper-tiny-en", "fox-beam5")} <= judged
    assert all(r["outcome"] == "passed" for r in results)
    made = {p.relative_to(goldens).parts[:2] + (p.stem,) for p in goldens.rglob("*.json")}
    mlx = mlx_key(provenance.device_facts()).name
    assert ("smollm2-135m", mlx, "plain") in made
    torch = [m for m in made if m[0] == "whisper-tiny-en" and m[2] == "fox-beam5"]
    assert len(torch) == 1 and "-torch2." in torch[0][1] and torch[0][1] != mlx
    # the VAD gate (torch family) in the same folder
    vad = subprocess.run(
        [sys.executable, "-m", "harness", "vad", "--fixtures", "fox.wav"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=900,
    )
    assert vad.returncode == 0, vad.stdout[-3000:] + vad.stderr[-3000:]
    assert [p.parent.name for p in (goldens / "silero-vad").rglob("fox.json")] == [torch[0][1]]


def test_the_common_modules_a_generator_imports_are_part_of_its_goldens_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oracles/common modules are found in the generator's source, however it imports them,
    and only those: editing one stales exactly the goldens of the oracles that load it."""
    import harness.oracle.sources as sources

    (tmp_path / "common").mkdir()
    for name in ("shared_a", "shared_b", "unused"):
        (tmp_path / "common" / f"{name}.py").write_text("X = 1\n")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "generate.py").write_text(
        "import importlib\nimport json\nimport shared_a as a\n\n\ndef main():\n"
        '    b = importlib.import_module("shared_b")\n'
    )
    monkeypatch.setattr(sources, "oracles_dir", lambda: tmp_path)
    assert sources.common_sources("x") == {
        "shared_a": tmp_path / "common" / "shared_a.py",
        "shared_b": tmp_path / "common" / "shared_b.py",
    }
