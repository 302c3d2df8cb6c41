"""Torch's CPU facts for the golden key, known without building the oracle's venv.

A torch oracle's golden key names torch's version and its CPU capability (harness/provenance.py).
Asking the venv means building it (torch is ~200 MB): a fresh clone whose goldens are all tracked
would build it only to name the folder they are in. On Linux x86_64, with `ATEN_CPU_CAPABILITY`
unset and torch pinned exactly from PyTorch's CPU wheel index, both facts follow from what is
here: the version is the pin plus the index's local label (`+cpu`), and the capability is ATen's
own rule (aten/src/ATen/native/DispatchStub.cpp, `compute_cpu_capability`): AVX512 where the CPU
has avx512vl, avx512bw, avx512dq and fma, else AVX2 where it has avx2 and fma, else DEFAULT.

Anywhere else (macOS, aarch64, the capability forced, another pin) the venv is asked, as before.
And whenever the venv is built anyway (a golden to generate, full vectors to regenerate), the
prediction is checked against torch's own answer (`check_prediction`): a wrong prediction is an
error before anything is filed under its key, never a golden in the wrong folder.
"""

from __future__ import annotations

import platform
import re

from harness import settings
from harness.errors import OracleVersionError
from harness.oracle.pins import read_pins
from harness.oracle.venvs import OracleEnv, TorchFacts, torch_facts

CPU_INDEX = "download.pytorch.org/whl/cpu"


def cpu_flags() -> set[str]:
    """The first processor's `flags` in /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def capability(flags: set[str]) -> str:
    """ATen's x86 rule, from the CPU's flags."""
    if {"avx512vl", "avx512bw", "avx512dq", "fma"} <= flags:
        return "AVX512"
    if {"avx2", "fma"} <= flags:
        return "AVX2"
    return "DEFAULT"


def predicted_torch_facts(oracle: str) -> TorchFacts | None:
    """The torch facts the oracle's venv would give here, or None where they cannot be told without it."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    if settings.read().oracle_python or settings.environment().get("ATEN_CPU_CAPABILITY"):
        return None
    pins = read_pins(oracle)
    pinned = re.findall(r"^torch==([0-9][0-9A-Za-z.]*)\s*$", pins, re.M)
    if len(pinned) != 1 or CPU_INDEX not in pins:
        return None
    flags = cpu_flags()
    if not flags:
        return None
    return TorchFacts(version=f"{pinned[0]}+cpu", capability=capability(flags))


def check_prediction(oracle: str, env: OracleEnv) -> None:
    """Where the key was predicted, the built venv's torch must agree, or nothing is filed under it."""
    predicted = predicted_torch_facts(oracle)
    if predicted is None:
        return
    actual = torch_facts(env)
    if actual != predicted:
        raise OracleVersionError(
            f"oracle {oracle}: its torch reports version {actual.version}, capability {actual.capability}; the "
            f"golden key was predicted as {predicted.version}, {predicted.capability} from the pins and "
            "/proc/cpuinfo (harness/oracle/torch_key.py): refusing to file goldens under a wrong key"
        )
