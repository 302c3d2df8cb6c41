"""Which MLX device the harness computes on, and the devices it refuses.

MLX computes on its default device: the GPU where it has one (Metal, CUDA), else the CPU. MLX
reads no environment variable for that choice, so the harness makes it: `MLX_PARITY_DEVICE`
(`make parity DEVICE=cpu`) names the device, and every side of a comparison runs on it: the
harness's own process (`select_device`, before any model is imported: a model module makes
its generation stream on the default device when it is imported), each oracle script
(`device_bootstrap`: its interpreter selects the device, then runs the script unchanged) and a
plug-in's host (plugins/host.py reads the variable itself). Each side reports the device it ran
on and a mismatch is an error (harness/oracle/process.py, harness/runners/process.py), so a
side that ignored the choice cannot pass.

GitHub's hosted arm64 macOS runners are virtual machines whose paravirtual GPU has no Metal
Performance Shaders and unreliable Metal compute: no Metal golden is made or judged there
(`check_real_device`), while their CPU device (Accelerate) is gated under its own golden key.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from harness import settings
from harness.errors import HarnessError

VIRTUAL_GPU_NAMES = ("paravirtual", "(virtual)")  # "Apple Paravirtual device", "Apple M1 (Virtual)"


class _Facts(Protocol):
    backend: str
    os: str
    virtual: str
    requested: str


def requested_device() -> str:
    """MLX_PARITY_DEVICE: "cpu", "gpu", or "" for MLX's own default."""
    return settings.read().device


@functools.cache
def select_device() -> None:
    """Make the requested device MLX's default in this process (once; nothing when none is)."""
    wanted = requested_device()
    if not wanted:
        return
    import mlx.core as mx

    device = mx.cpu if wanted == "cpu" else mx.gpu
    if not mx.is_available(device):
        raise HarnessError(
            f"MLX_PARITY_DEVICE={wanted}: MLX has no {wanted.upper()} here (mlx {_mlx_version()}, default "
            f"device {mx.default_device()}); unset it for MLX's default"
        )
    mx.set_default_device(device)


def _mlx_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("mlx")


def passed_over_gpu(os_name: str) -> dict[str, Any]:
    """The GPU MLX has here but the run does not use (the CPU was requested): its name, and why it
    is a virtual machine's where it is one; {} where there is none or it is in use."""
    import mlx.core as mx

    if requested_device() != "cpu" or not mx.is_available(mx.gpu):
        return {}
    name = str(mx.device_info(mx.gpu).get("device_name", "")) if hasattr(mx, "device_info") else ""
    virtual = paravirtual_metal(name, hypervisor_present()) if os_name == "darwin" else None
    return {"name": name, "virtual": virtual or ""}


def device_bootstrap(script_args: list[str]) -> list[str]:
    """The interpreter arguments that run `script_args` (a script and its arguments) on the
    requested device: unchanged when none is requested, else `-c` code that makes it MLX's default
    (where mlx is installed: a torch oracle has none) and runs the script as `__main__`, with the
    sys.argv and sys.path a direct run of the script would have (`-I` or not)."""
    wanted = requested_device()
    if not wanted or not script_args or script_args[0].startswith("-"):
        return script_args
    return ["-c", BOOTSTRAP, wanted, *script_args]


BOOTSTRAP = """\
import importlib.util, os, runpy, sys
wanted = sys.argv.pop(1)
if importlib.util.find_spec("mlx") is not None:
    import mlx.core as mx
    device = mx.cpu if wanted == "cpu" else mx.gpu
    if not mx.is_available(device):
        sys.exit(f"MLX_PARITY_DEVICE={wanted}: this interpreter's MLX has no {wanted.upper()}")
    mx.set_default_device(device)
sys.argv = sys.argv[1:]
if not sys.flags.safe_path:  # as a direct run: the script's folder first on sys.path (-I leaves it out)
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def paravirtual_metal(device_name: str, hypervisor: bool | None) -> str | None:
    """Why this Metal device belongs to a virtual machine (GitHub's hosted arm64 macOS runners:
    Apple's Virtualization Framework gives them a paravirtual GPU without Metal Performance
    Shaders, on which Metal compute is unreliable); None on real hardware."""
    reasons = []
    if any(word in device_name.lower() for word in VIRTUAL_GPU_NAMES):
        reasons.append(f"MLX names the GPU {device_name!r}")
    if hypervisor:
        reasons.append("macOS runs under a hypervisor (sysctl kern.hv_vmm_present = 1)")
    return " and ".join(reasons) or None


def hypervisor_present() -> bool | None:
    """macOS's kern.hv_vmm_present, read through libc (no process); None where unreadable."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        if libc.sysctlbyname(b"kern.hv_vmm_present", ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(value.value)


def check_real_device(facts: _Facts) -> None:
    """Refuse to make or judge Metal goldens on a virtual machine's paravirtual GPU."""
    if facts.backend != "gpu" or facts.os != "darwin" or not facts.virtual:
        return
    chosen = "MLX_PARITY_DEVICE=gpu asks for it" if facts.requested == "gpu" else "it is MLX's default device"
    raise HarnessError(
        f"this Metal device is a virtual machine's ({facts.virtual}; {chosen}): Metal goldens made or judged "
        "here would be a paravirtual device's, and Metal compute is unreliable on it. Either run on a "
        "self-hosted Apple Silicon runner with its real GPU (labels self-hosted, macOS, ARM64, metal: "
        "docs/ci.md), or gate this machine's CPU device instead: make parity DEVICE=cpu "
        "(MLX_PARITY_DEVICE=cpu; its own golden key, Accelerate as BLAS: docs/ci.md)"
    )
