"""The Silero VAD artifact: the pinned wheel's TorchScript file, converted once (without torch)
into an MLX weights directory in the cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.artifacts.files import build_once, record_files, sha256_file
from harness.artifacts.wheels import WheelMember, fetch_wheel_member
from harness.errors import (
    ArtifactError,
)
from harness.paths import cache_root
from harness.profile.vad import VadProfile

CONVERTER_VERSION = 1  # bump when models/vad/convert.py changes what it writes


def resolve_vad_weights(profile: VadProfile) -> Path:
    """The pinned wheel's .jit (sha256-checked, the wheel too), converted once into the cache."""
    from models.vad.load import WEIGHTS_FILE, save_converted

    art = profile.artifact
    jit = fetch_wheel_member(WheelMember(art.package, art.version, art.file, art.sha256))
    wheel = cache_root() / "downloads" / f"{art.package}-{art.version}" / art.wheel
    if not wheel.is_file():
        raise ArtifactError(f"missing artifact: {wheel} (the pinned wheel {art.wheel}) is not in the download cache")
    if sha256_file(wheel) != art.wheel_sha256:
        raise ArtifactError(
            f"artifact {wheel}: sha256 {sha256_file(wheel)} does not match the pinned {art.wheel_sha256}"
        )
    out = cache_root() / "artifacts" / f"{art.package}-{art.version}-{art.sha256[:12]}-jit{CONVERTER_VERSION}"

    def build() -> None:
        tmp = out.with_name(out.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        save_converted(jit, tmp)
        record_files(tmp)
        (tmp / ".complete").write_text(art.sha256 + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)

    build_once(out, out, f"converted {art.file}", f"artifact-{out.name}", build)
    if not (out / WEIGHTS_FILE).is_file():
        raise ArtifactError(f"converted artifact {out} has no {WEIGHTS_FILE}")
    return out
