"""The machine facts that bit-exactness depends on: backend, device, BLAS, mlx version.

Two runs agree bit for bit only on the same backend, device model, BLAS library and mlx
build, so all of these go into the device key that names a golden's folder, and into its
provenance.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
import subprocess
from dataclasses import asdict, dataclass

# Name patterns of BLAS libraries, most specific first: the first one loaded wins.
_BLAS_PATTERNS = (
    ("openblas", re.compile(r"libopenblas")),
    ("mkl", re.compile(r"libmkl")),
    ("blis", re.compile(r"libblis")),
    ("accelerate", re.compile(r"Accelerate\.framework|libBLAS\.dylib")),
    ("refblas", re.compile(r"libblas[-.]")),
)


@dataclass(frozen=True)
class DeviceFacts:
    backend: str  # "cpu" | "gpu"
    arch: str
    os: str
    processor: str  # CPU model, or GPU name on a GPU backend
    blas: str
    mlx: str

    @property
    def key(self) -> str:
        """Folder-safe key: every fact that can change bits, readable by a person."""
        parts = [self.backend, self.arch, self.processor, self.blas, f"mlx{self.mlx}"]
        return "-".join(_slug(p) for p in parts)

    def as_dict(self) -> dict[str, str]:
        return asdict(self) | {"key": self.key}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def cpu_model() -> str:
    """The CPU's model name plus family/model numbers (one 'AMD EPYC' name covers many chips)."""
    system = platform.system()
    if system == "Darwin":
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=False)
        return out.stdout.strip() or platform.machine()
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name", platform.processor() or "cpu")
    if "cpu family" in info and "model" in info:
        name += f" f{info['cpu family']}m{info['model']}"
    return name


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

    device = mx.default_device()
    backend = "gpu" if device.type == mx.gpu else "cpu"
    processor = cpu_model()
    if backend == "gpu":
        info = mx.device_info() if hasattr(mx, "device_info") else {}
        processor = str(info.get("device_name") or info.get("architecture") or "gpu")
    return DeviceFacts(
        backend=backend,
        arch=platform.machine(),
        os=platform.system().lower(),
        processor=processor,
        blas=loaded_blas(),
        mlx=importlib.metadata.version("mlx"),
    )


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
