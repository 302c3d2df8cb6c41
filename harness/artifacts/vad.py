"""The Silero VAD artifact: the pinned wheel's TorchScript file, sha256-checked (the wheel too).

It is not converted into the cache: `models.vad.load_model` reads the .jit (without torch) in the
process that runs the model, every time (4 ms on a 2-core x86-64 CPU). The converter is then part
of what every VAD gate walks and judges, and no converted copy can go stale or be corrupted
behind the pinned hash.
"""

from __future__ import annotations

from pathlib import Path

from harness.artifacts.files import sha256_file
from harness.artifacts.wheels import WheelMember, fetch_wheel_member
from harness.errors import (
    ArtifactError,
)
from harness.paths import cache_root
from harness.profile.vad import VadProfile


def resolve_vad_weights(profile: VadProfile) -> Path:
    """The pinned wheel's .jit (sha256-checked, the wheel too), for `models.vad.load_model`."""
    art = profile.artifact
    jit = fetch_wheel_member(WheelMember(art.package, art.version, art.file, art.sha256))
    wheel = cache_root() / "downloads" / f"{art.package}-{art.version}" / art.wheel
    if not wheel.is_file():
        raise ArtifactError(f"missing artifact: {wheel} (the pinned wheel {art.wheel}) is not in the download cache")
    if sha256_file(wheel) != art.wheel_sha256:
        raise ArtifactError(
            f"artifact {wheel}: sha256 {sha256_file(wheel)} does not match the pinned {art.wheel_sha256}"
        )
    return Path(jit)
