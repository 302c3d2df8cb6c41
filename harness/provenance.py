"""The machine facts that bit-exactness depends on, and the one keying rule for goldens.

A golden's folder is named by its *golden key*: exactly the facts that change the oracle's
bits, no more (docs/goldens.md, "Keys"). The rule is per oracle family:

- **mlx** (mlx-lm, mlx-optiq, mlx-whisper): on the CPU the backend, architecture, the BLAS
  MLX has loaded and the mlx version; on CUDA the GPU's name and mlx; on Metal the GPU
  architecture string, the macOS major.minor and mlx. The processor model is not in it:
  every MLX oracle gave bit-identical goldens on an Intel Xeon (AVX-512), an AMD EPYC family
  25 and an AMD EPYC family 23 (issue 21, docs/goldens.md).
- **torch** (openai-whisper, silero-vad): the CPU's vendor, torch's CPU capability
  (`torch.backends.cpu.get_cpu_capability()`, honouring `ATEN_CPU_CAPABILITY`), the torch
  version and the architecture: the Silero probabilities differ between an Intel and an AMD
  host even with the capability forced equal.

What was measured but does not key (the processor model, the OS release) is written beside
the golden as `recorded_on`, for the failure message, never compared.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import platform
import re
import subprocess
from dataclasses import asdict, dataclass

from harness.device import hypervisor_present, paravirtual_metal, passed_over_gpu, requested_device, select_device
from harness.errors import OracleError
from harness.oracle.descriptor import oracle_family
from harness.oracle.pins import comparison_mlx
from harness.oracle.venvs import TorchFacts, ensure_oracle_env, torch_facts

# Name patterns of BLAS libraries, most specific first: the first one loaded wins.
_BLAS_PATTERNS = (
    ("openblas", re.compile(r"libopenblas")),
    ("mkl", re.compile(r"libmkl")),
    ("blis", re.compile(r"libblis")),
    ("accelerate", re.compile(r"Accelerate\.framework|libBLAS\.dylib")),
    ("refblas", re.compile(r"libblas[-.]")),
)
# /proc/cpuinfo "CPU implementer" codes (aarch64 Linux has no "model name").
_ARM_IMPLEMENTERS = {
    "0x41": "arm",
    "0x42": "broadcom",
    "0x43": "cavium",
    "0x46": "fujitsu",
    "0x48": "hisilicon",
    "0x4e": "nvidia",
    "0x50": "apm",
    "0x51": "qualcomm",
    "0x61": "apple",
    "0xc0": "ampere",
}
# Key parts whose value is a bare version: the folder name says whose.
_LABELLED_PARTS = ("mlx", "torch")
_X86_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon"}


@dataclass(frozen=True)
class DeviceFacts:
    """What this process runs MLX on, measured once."""

    backend: str  # "cpu" | "gpu"
    arch: str
    os: str
    processor: str  # the CPU model (provenance only: it does not key goldens)
    vendor: str  # the CPU's vendor: intel, amd, apple, arm, ...
    blas: str
    mlx: str
    gpu: str = ""  # CUDA: the device name; Metal: the GPU architecture string
    os_version: str = ""  # macOS major.minor (Metal kernels ship with the OS); else the kernel release
    gpu_name: str = ""  # Metal: the device's own name ("Apple M2 Max", "Apple Paravirtual device")
    virtual: str = ""  # Metal: why the device is a virtual machine's (empty: real hardware)
    requested: str = ""  # MLX_PARITY_DEVICE: "cpu" or "gpu" ("": MLX's default device)
    passed_over: str = ""  # the CPU was requested: the GPU not used, and why it is a virtual one's

    @property
    def key(self) -> str:
        """The MLX family's golden key on this machine (the project's own computations)."""
        return mlx_key(self).name

    def as_dict(self) -> dict[str, str]:
        return asdict(self) | {"key": self.key}

    def recorded_on(self) -> dict[str, str]:
        """Facts kept beside a golden that do not key it: shown when a gate fails."""
        return {"processor": self.processor, "vendor": self.vendor, "os": self.os, "os_version": self.os_version}


@dataclass(frozen=True)
class GoldenKey:
    """A golden folder's name and the facts it is made of (in the golden's provenance)."""

    family: str
    parts: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return "-".join(_slug(f"{k}{v}" if k in _LABELLED_PARTS else v) for k, v in self.parts)

    def as_dict(self) -> dict[str, str]:
        return {"family": self.family, **dict(self.parts), "key": self.name}

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.parts)


def mlx_key(facts: DeviceFacts) -> GoldenKey:
    if facts.backend == "gpu" and facts.os == "darwin":  # Metal
        parts = [("backend", "metal"), ("gpu", facts.gpu), ("macos", facts.os_version), ("mlx", facts.mlx)]
    elif facts.backend == "gpu":  # CUDA
        parts = [("backend", "gpu"), ("arch", facts.arch), ("gpu", facts.gpu), ("mlx", facts.mlx)]
    else:
        parts = [("backend", "cpu"), ("arch", facts.arch), ("blas", facts.blas), ("mlx", facts.mlx)]
    return GoldenKey("mlx", tuple(parts))


def torch_key(facts: DeviceFacts, torch: TorchFacts) -> GoldenKey:
    """PyTorch oracles compute on the CPU whatever MLX's backend is."""
    parts = [
        ("backend", "cpu"),
        ("arch", facts.arch),
        ("vendor", facts.vendor),
        ("capability", torch.capability),
        ("torch", torch.version),
    ]
    return GoldenKey("torch", tuple(parts))


def golden_key(oracle: str) -> GoldenKey:
    """The key of the goldens `oracle` makes on this machine: the one keying rule."""
    family = oracle_family(oracle)
    if family == "mlx":  # the mlx of the comparison: a variant's pinned one, else the project's
        return mlx_key(dataclasses.replace(device_facts(), mlx=comparison_mlx(oracle)))
    if family != "torch":
        raise OracleError(f"oracle {oracle} ({family}) makes no goldens: it has no golden key")
    from harness.oracle.torch_key import predicted_torch_facts

    torch = predicted_torch_facts(oracle) or torch_facts(ensure_oracle_env(oracle))
    return torch_key(device_facts(), torch)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def _first_cpuinfo_block() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if info:
                        break  # the first processor's block is enough
                    continue
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        pass
    return info


def _sysctl(name: str) -> str:
    out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def cpu_model() -> str:
    """The CPU's model name plus family/model numbers (one 'AMD EPYC' name covers many chips)."""
    if platform.system() == "Darwin":
        return _sysctl("machdep.cpu.brand_string") or platform.machine()
    info = _first_cpuinfo_block()
    name = info.get("model name")
    if name is None and "CPU implementer" in info:  # aarch64 Linux
        part, variant, rev = (info.get(k, "?") for k in ("CPU part", "CPU variant", "CPU revision"))
        name = f"{cpu_vendor(info)} part {part} r{variant}p{rev}"
    name = name or platform.processor() or platform.machine()
    if "cpu family" in info and "model" in info:
        name += f" f{info['cpu family']}m{info['model']}"
    return name


def cpu_vendor(info: dict[str, str] | None = None) -> str:
    if platform.system() == "Darwin":
        if platform.machine() == "arm64":
            return "apple"
        vendor = _sysctl("machdep.cpu.vendor")
        return _X86_VENDORS.get(vendor, _slug(vendor))
    info = _first_cpuinfo_block() if info is None else info
    if "vendor_id" in info:
        return _X86_VENDORS.get(info["vendor_id"], _slug(info["vendor_id"]))
    if "CPU implementer" in info:
        code = info["CPU implementer"].lower()
        return _ARM_IMPLEMENTERS.get(code, f"implementer-{code}")
    return _slug(platform.processor() or "unknown")


def os_version() -> str:
    if platform.system() == "Darwin":
        return ".".join(platform.mac_ver()[0].split(".")[:2])
    return platform.release()


def loaded_blas() -> str:
    """Which BLAS this process has mapped, after MLX has run a matmul (so it is loaded)."""
    import mlx.core as mx

    a = mx.ones((8, 8), dtype=mx.float32)
    mx.eval(a @ a)
    libs: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            libs = [line.split()[-1] for line in f if "/" in line]
    except OSError:  # macOS: MLX's CPU backend links Accelerate
        return "accelerate" if platform.system() == "Darwin" else "unknown"
    return classify_blas(libs)


def classify_blas(libraries: list[str]) -> str:
    """Name the BLAS among loaded library paths (shared with the oracle's own report)."""
    for name, pattern in _BLAS_PATTERNS:
        for lib in libraries:
            if pattern.search(lib):
                version = re.search(r"\.so\.([0-9.]+)$", lib)
                return f"{name}-{version.group(1)}" if version else name
    return "none"


@functools.cache
def device_facts() -> DeviceFacts:
    import mlx.core as mx

    select_device()  # MLX_PARITY_DEVICE's device made MLX's default before anything runs on it
    backend = "gpu" if mx.default_device().type == mx.gpu else "cpu"
    gpu = gpu_name = virtual = ""
    if backend == "gpu":
        info = mx.device_info() if hasattr(mx, "device_info") else {}
        if platform.system() == "Darwin":  # Metal: the architecture string, e.g. applegpu_g15s
            gpu = str(info.get("architecture") or info.get("device_name") or "metal")
            gpu_name = str(info.get("device_name") or "")
            virtual = paravirtual_metal(gpu_name, hypervisor_present()) or ""
        else:
            gpu = str(info.get("device_name") or info.get("architecture") or "gpu")
    return DeviceFacts(
        backend=backend,
        arch=platform.machine(),
        os=platform.system().lower(),
        processor=cpu_model(),
        vendor=cpu_vendor(),
        blas=loaded_blas(),
        mlx=importlib.metadata.version("mlx"),
        gpu=gpu,
        os_version=os_version(),
        gpu_name=gpu_name,
        virtual=virtual,
        requested=requested_device(),
        passed_over=_passed_over(),
    )


def _passed_over() -> str:
    gpu = passed_over_gpu(platform.system().lower())
    if not gpu:
        return ""
    return f"{gpu['name'] or 'a GPU'}" + (f" (a virtual machine's: {gpu['virtual']})" if gpu["virtual"] else "")


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
