"""A paravirtual Metal device (GitHub's hosted arm64 macOS runners) is detected and refused:
no Metal golden is made or judged on it, and the error names why and the ways forward."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from harness.device import check_real_device, paravirtual_metal
from harness.errors import HarnessError
from harness.paths import REPO_ROOT
from harness.provenance import DeviceFacts

REAL = DeviceFacts("gpu", "arm64", "darwin", "Apple M2 Max", "apple", "accelerate", "0.32.4", "applegpu_g14s", "15.1")


@pytest.mark.parametrize(
    ("name", "hypervisor", "virtual"),
    [
        ("Apple Paravirtual device", None, True),  # macos-14 / macos-15 hosted runners
        ("Apple M1 (Virtual)", None, True),  # macos-26 hosted runners
        ("Apple M2 Max", True, True),  # a real name, but the kernel says it is a guest
        ("Apple M2 Max", False, False),
        ("Apple M4", None, False),
    ],
)
def test_the_device_name_or_the_hypervisor_flag_says_virtual(name: str, hypervisor, virtual: bool) -> None:
    assert (paravirtual_metal(name, hypervisor) is not None) == virtual


def test_a_paravirtual_metal_device_is_refused_naming_why_and_the_ways_forward() -> None:
    check_real_device(REAL)  # real hardware: nothing to say
    why = paravirtual_metal("Apple Paravirtual device", True)
    fake = dataclasses.replace(REAL, gpu_name="Apple Paravirtual device", virtual=why)
    with pytest.raises(HarnessError) as refused:
        check_real_device(fake)
    text = str(refused.value)
    assert "'Apple Paravirtual device'" in text and "kern.hv_vmm_present = 1" in text
    assert "self-hosted Apple Silicon runner" in text and "docs/ci.md" in text and "CPU" in text
    check_real_device(dataclasses.replace(fake, backend="cpu"))  # the CPU device there is not refused


def test_make_parity_stops_before_anything_runs_on_a_paravirtual_device(isolated) -> None:
    """Through the command line: the faked device comes from a plugin that replaces the facts."""
    plugin = (
        "import dataclasses\nimport harness.device as d\nimport harness.provenance as p\n"
        "import harness.pytest_plugin as pp\n"
        "real = p.device_facts()\n"
        "fake = dataclasses.replace(real, backend='gpu', os='darwin', gpu_name='Apple Paravirtual device',"
        " virtual=d.paravirtual_metal('Apple Paravirtual device', None))\n"
        "pp.device_facts = lambda: fake\n"
    )
    (isolated / "fake_metal.py").write_text(plugin)
    env = os.environ | {"PYTHONPATH": f"{isolated}{os.pathsep}{REPO_ROOT}"}
    out = subprocess.run(
        [sys.executable, "-m", "harness", "parity", "--model", "smollm2-135m", "--", "-p", "fake_metal"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert out.returncode == 4, out.stdout[-1000:] + out.stderr[-1000:]  # pytest's usage error
    assert "this Metal device is a virtual machine's" in out.stderr
    assert not list((isolated / "reports").glob("*.json")), json.dumps(os.listdir(isolated / "reports"))
