"""Do the pins install where the users are? Cross-platform resolution of every pin file.

    python -m harness portability            # every pin file, every platform: a table, exit 1 on failure

Every pinned requirements file (the project's, and each oracle's, both install steps) is
resolved by uv (pinned in requirements.txt) for each supported platform, with the machine's
pip and uv configuration ignored apart from the package index (`PIP_INDEX_URL`, if set), so
a local find-links folder or an extra local index cannot hide a pin that resolves nowhere
else. The platform floor is what the pins need: mlx 0.32.4 ships manylinux_2_35 and macOS
>= 14 arm64 wheels; numpy 2.4.6 needs Python >= 3.11.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import settings
from harness.errors import HarnessError
from harness.paths import REPO_ROOT, cache_root, oracles_dir, shown

PYTHON_FLOOR = "3.11"


@dataclass(frozen=True)
class Platform:
    name: str  # what a person calls it
    uv: str  # uv's --python-platform
    env: tuple[tuple[str, str], ...] = ()

    @property
    def is_linux(self) -> bool:
        return "linux" in self.uv


PLATFORMS = (
    Platform("linux x86_64 (glibc >= 2.35)", "x86_64-manylinux_2_35"),
    Platform("linux aarch64 (glibc >= 2.35)", "aarch64-manylinux_2_35"),
    Platform("macOS 14 arm64", "aarch64-apple-darwin", (("MACOSX_DEPLOYMENT_TARGET", "14.0"),)),
)


class PortabilityError(HarnessError):
    pass


class IndexUnreachable(PortabilityError):
    """An index a pin file names could not be reached from this machine (not a pin's fault)."""

    def __init__(self, url: str, message: str):
        super().__init__(message)
        self.url = url


@dataclass(frozen=True)
class PinFile:
    path: Path
    no_deps: bool  # the second install step (`pip install --no-deps -r`)
    tool: bool = False  # a tool's own venv (make mutate's cosmic-ray): runs no model, so no mlx

    @property
    def label(self) -> str:
        return shown(self.path)


def pin_files() -> list[PinFile]:
    files = [PinFile(REPO_ROOT / "requirements.txt", False)]
    for oracle in sorted(p for p in oracles_dir().iterdir() if (p / "requirements.txt").is_file()):
        files.append(PinFile(oracle / "requirements.txt", False))
        if (oracle / "requirements-nodeps.txt").is_file():
            files.append(PinFile(oracle / "requirements-nodeps.txt", True))
        files += [PinFile(variant, False) for variant in sorted((oracle / "variants").glob("*.txt"))]
    files.append(PinFile(REPO_ROOT / "harness" / "mutate" / "requirements.txt", False, tool=True))  # make mutate's tool
    return files


def uv_binary() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise PortabilityError("uv is not installed: it is pinned in requirements.txt (make venv installs it)")
    return found


def clean_env(platform: Platform) -> dict[str, str]:
    """This process's environment without pip's or uv's settings, the package index apart."""
    env = {k: v for k, v in settings.environment().items() if not k.startswith(("PIP_", "UV_"))}
    env["UV_CACHE_DIR"] = str(cache_root() / "uv")
    if settings.read().pip_index_url:
        env["UV_INDEX_URL"] = settings.read().pip_index_url
    return env | dict(platform.env)


def extra_indexes(text: str) -> list[str]:
    return re.findall(r"^--extra-index-url\s+(\S+)", text, flags=re.M)


def resolve(
    pins: PinFile, platform: Platform, python: str = PYTHON_FLOOR, text: str | None = None, no_deps: bool = False
) -> dict[str, str]:
    """The distributions (name -> version) `pins` resolves to on `platform`, or a
    PortabilityError naming the file, the platform and the resolver's reason."""
    tmp = cache_root() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    source = pins.path
    if text is not None:  # a variant of the file (tests; an unreachable index left out)
        source = tmp / f"portability-{os.getpid()}-{pins.path.parent.name}-{pins.path.name}"
        source.write_text(text)
    cmd = [uv_binary(), "pip", "compile", "--no-config", "--no-header", "--no-annotate", "--quiet"]
    cmd += ["--python-version", python, "--python-platform", platform.uv, str(source)]
    if pins.no_deps or no_deps:
        cmd.append("--no-deps")
    out = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(platform), cwd=tmp, check=False)
    if text is not None:
        source.unlink(missing_ok=True)
    if out.returncode != 0:
        reason = "\n".join(line for line in out.stderr.strip().splitlines() if line.strip())[-1500:]
        for url in extra_indexes(text if text is not None else pins.path.read_text()):
            host = url.split("/")[2]
            if host in out.stderr and re.search(r"dns error|Connect|timed out|Failed to fetch", out.stderr):
                raise IndexUnreachable(url, f"{pins.label}: the index {url} is not reachable from here")
        raise PortabilityError(f"{pins.label} does not resolve for {platform.name} (Python {python}):\n{reason}")
    resolved = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            resolved[m.group(1).lower().replace("_", "-")] = m.group(2)
    return resolved


def without_extra_indexes(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("--extra-index-url"))


def cuda_packages(resolved: dict[str, str]) -> list[str]:
    return sorted(d for d in resolved if d.startswith("nvidia-") or d == "triton")


@dataclass
class Resolution:
    pins: PinFile
    platform: Platform
    resolved: dict[str, str]
    complete: bool = True  # False: an index was unreachable and only part could be checked
    note: str = ""

    def problems(self) -> list[str]:
        """What makes this resolution unusable for the harness, beyond resolving at all."""
        from harness.oracle.descriptor import ORACLES

        folder = self.pins.path.parent
        oracle = ORACLES.get(folder.parent.name if folder.name == "variants" else folder.name)
        family = oracle.family if oracle else "mlx"  # the project venv runs MLX
        out = []
        if self.pins.no_deps:
            return out
        if self.pins.tool:
            return [f"{self.pins.label} installs mlx on {self.platform.name}"] if "mlx" in self.resolved else []
        if family == "torch":
            if "torch" not in self.resolved:
                out.append(f"{self.pins.label} installs no torch on {self.platform.name}")
            if self.complete and self.platform.is_linux and cuda_packages(self.resolved):
                out.append(
                    f"{self.pins.label} installs CUDA packages on {self.platform.name}: {cuda_packages(self.resolved)}"
                )
        elif family == "native":  # an original format's own runtime: itself, and never mlx
            runtime = oracle.distributions[0] if oracle else ""
            if runtime not in self.resolved or "mlx" in self.resolved:
                out.append(f"{self.pins.label} must install {runtime} and no mlx on {self.platform.name}")
        elif "mlx" not in self.resolved:
            out.append(f"{self.pins.label} installs no mlx on {self.platform.name}")
        return out


def check(pins: PinFile, platform: Platform, python: str = PYTHON_FLOOR) -> Resolution:
    """Resolve `pins` for `platform`. An extra index that cannot be reached from here (PyTorch's
    CPU wheels) is left out: on macOS the package index's torch is that same CPU build; on Linux
    it is the CUDA build, so only the pins' existence for the platform is checked (--no-deps)."""
    try:
        return Resolution(pins, platform, resolve(pins, platform, python))
    except IndexUnreachable as e:
        text = without_extra_indexes(pins.path.read_text())
        if not platform.is_linux:
            note = f"{e.url} unreachable: resolved from the package index alone (its macOS torch is the CPU build)"
            return Resolution(pins, platform, resolve(pins, platform, python, text=text), note=note)
        note = (
            f"{e.url} unreachable from here: every pin has a {platform.name} distribution (--no-deps), "
            "but the resolution of torch's dependencies from the CPU index was not checked"
        )
        return Resolution(pins, platform, resolve(pins, platform, python, text=text, no_deps=True), False, note)


def run(args: argparse.Namespace) -> int:
    failed = 0
    for pins in pin_files():
        for platform in PLATFORMS:
            try:
                result = check(pins, platform, args.python or PYTHON_FLOOR)
                problems = result.problems()
                verdict = "; ".join(problems) if problems else f"ok ({len(result.resolved)} distributions)"
                verdict = ("FAILED: " if problems else "") + verdict + (f" [{result.note}]" if result.note else "")
                failed += bool(problems)
            except PortabilityError as e:
                verdict, failed = f"FAILED: {str(e).splitlines()[-1]}", failed + 1
            print(f"{pins.label:46} {platform.name:30} {verdict}")
    return 1 if failed else 0
