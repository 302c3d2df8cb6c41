"""An oracle's pins: the files its venv is built from (a variant's: oracles/<name>/variants/),
what they hash to, and the one-mlx rule they must keep (harness/oracle/descriptor.py)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
import sys
from pathlib import Path
from typing import Any

from harness.errors import OracleError, OracleVersionError
from harness.oracle.descriptor import descriptor, oracle_family, variant_pins_path
from harness.paths import oracles_dir


def pins_path(oracle: str) -> Path:
    row = descriptor(oracle)  # an unknown name (or variant) is an error naming the known ones
    if row.variant is not None:
        return variant_pins_path(row.base, row.variant)
    path = oracles_dir() / oracle / "requirements.txt"
    if not path.is_file():
        raise OracleError(f"unknown oracle {oracle!r}: expected pins at {path}")
    return path


def nodeps_pins_path(oracle: str) -> Path:
    """Optional second pin file, installed with `--no-deps` after the first (a package whose
    declared dependencies are far wider than what the oracle imports, e.g. mlx-optiq). A
    variant's pins are one file."""
    row = descriptor(oracle)
    return row.folder / ("variants" if row.variant else "") / f"{row.variant or 'requirements'}-nodeps.txt"


NODEPS_MARKER = "# --no-deps"  # where the second pin file starts in read_pins' text


def read_pins(oracle: str) -> str:
    """Everything the venv is built from: both pin files (the second marked as such)."""
    pins = pins_path(oracle).read_text()
    nodeps = nodeps_pins_path(oracle)
    if nodeps.is_file():
        pins += f"\n{NODEPS_MARKER}\n" + nodeps.read_text()
    return pins


def normalized_pins(pins: str) -> str:
    """The pins as pip reads them: comments, blank lines and surrounding whitespace dropped
    (the marker between the two files kept), so editing a comment builds no new venv and
    stales no golden."""
    lines = []
    for line in pins.splitlines():
        if line.strip() == NODEPS_MARKER:
            lines.append(NODEPS_MARKER)
            continue
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # pip's comment rule: '#' at the start or after a space
        if line:
            lines.append(line)
    return "\n".join(lines) + "\n"


def parse_requirements(pins: str) -> list[Any]:
    """The pins' requirement lines as packaging Requirements (option lines, paths and URLs left out)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in normalized_pins(pins).splitlines():
        if line.startswith("-") or line == NODEPS_MARKER:
            continue
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            continue
    return out


def pinned_mlx(pins: str) -> list[str]:
    """The exact mlx versions the pins install on this platform (markers evaluated)."""
    versions = []
    for req in parse_requirements(pins):
        if req.name.lower() in ("mlx", "mlx-cpu", "mlx-metal", "mlx-cuda") and (
            req.marker is None or req.marker.evaluate()
        ):
            versions += [spec.version for spec in req.specifier if spec.operator == "=="] or ["(not pinned exactly)"]
    return versions


def comparison_mlx(oracle: str) -> str | None:
    """The mlx that `oracle`'s comparisons run: the project's, or the one a variant's pins
    install (exactly one, or an error naming the file); None for an mlx-free oracle. The
    implementation compared with it must run the same (the one-mlx rule, per comparison)."""
    row = descriptor(oracle)
    if row.family != "mlx":
        return None
    if row.variant is None:
        return project_mlx()
    versions = set(pinned_mlx(read_pins(oracle)))
    if len(versions) != 1 or "(not pinned exactly)" in versions:
        found = ", ".join(sorted(versions)) or "no mlx pin"
        raise OracleVersionError(
            f"oracle {oracle}: {pins_path(oracle)} installs {found} on this platform: a variant pins exactly one "
            "mlx (mlx==X), the version its comparisons run"
        )
    return versions.pop()


def check_mlx_pin(oracle: str, pins: str, project_mlx: str | None) -> None:
    """Before a venv is built: an MLX oracle pins exactly the project's mlx (a variant exactly one
    mlx of its own), an mlx-free one none."""
    versions = pinned_mlx(pins)
    if descriptor(oracle).variant is not None and oracle_family(oracle) == "mlx":
        comparison_mlx(oracle)
        return
    if oracle_family(oracle) != "mlx":
        if versions:
            raise OracleVersionError(
                f"oracle {oracle}: {pins_path(oracle)} pins mlx {versions}: it must run without mlx"
            )
        return
    wrong = [v for v in versions if v != project_mlx]
    if not versions or wrong:
        found = ", ".join(versions) or "no exact mlx pin"
        raise OracleVersionError(
            f"oracle {oracle}: its pins install mlx {found} on this platform, the project runs mlx {project_mlx}: "
            f"pin mlx=={project_mlx} in {pins_path(oracle)} (nothing was built)"
        )


def pins_hash(
    pins: str,
    python: tuple[int, int] = sys.version_info[:2],
    machine: str = platform.machine(),
    system: str = sys.platform,
) -> str:
    """Hash of what determines the venv: the pins and the interpreter they install into (by
    default this one; a golden's own interpreter for a freshness check of tracked goldens)."""
    basis = f"{normalized_pins(pins)}\n{tuple(python)}\n{machine}\n{system}"
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def project_mlx() -> str | None:
    try:
        return importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        return None


def python_hint(log_tail: str, python: str) -> str:
    """What a venv build that failed on the Python version should say next (external-2 F4)."""
    if not any(said in log_tail.lower() for said in ("requires-python", "a different python", "python>=")):
        return ""
    return (
        f"\nit needs another Python than {python}: for a plug-in, name one with `interpreter:` under the "
        "profile's implementation (docs/profiles.md)"
    )


def cpu_wheel_index(pins: Path) -> str | None:
    """The extra index a torch oracle's pins name (PyTorch's CPU wheels)."""
    for line in pins.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "--extra-index-url":
            return parts[1]
    return None


def refuse_cuda_torch(oracle: str, pins: Path, dists: dict[str, str], stage: str, cuda: str | None = None) -> None:
    """A torch oracle computes on the CPU: a CUDA torch, triton or nvidia-* wheel is refused."""
    cuda_dists = sorted(d for d in dists if d.startswith("nvidia-") or d == "triton")
    if not cuda_dists and cuda is None:
        return
    what = f"torch {dists.get('torch', '?')}" + (f" built for CUDA {cuda}" if cuda else "")
    listed = f" with {', '.join(cuda_dists[:6])}{' …' if len(cuda_dists) > 6 else ''}" if cuda_dists else ""
    raise OracleError(
        f"oracle venv {oracle}: pip {stage} a CUDA build, {what}{listed}, from {pins}. This oracle "
        f"must run PyTorch's CPU build, from the CPU wheel index {cpu_wheel_index(pins) or '<none named>'} "
        "named in that file: it was not reachable from here or did not serve the pinned torch. Make it "
        "reachable (or give a mirror of it as PIP_EXTRA_INDEX_URL) and run again; the venv was not kept."
    )
