"""An artifact's integrity: a directory made here (a twin, a conversion) is checked against
the hashes recorded when it was made (harness/artifacts/files.py), a real hub snapshot against
the HF cache's content addresses. Every resolution makes the cheap check (a file whose size
and mtime are as last hashed is not read again); `verify_in_full` reads every file."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from harness.artifacts.files import _hash_with_index, _listed_files, check_files
from harness.errors import ArtifactError
from harness.profile import ArtifactSpec, Profile


def made_here(artifact: Any) -> bool:  # a ResolvedArtifact (harness/artifacts/resolve.py)
    """A twin or a conversion (rebuilt from its pins when corrupt); else a real hub snapshot."""
    return artifact.identity.get("source") != "hub" or "twin" in artifact.identity


def verify_in_full(profile: Profile, artifact: Any) -> list[str]:
    """Every file of a resolved artifact read again and hashed against its integrity record
    (a made-here directory's own record, a hub snapshot's blob addresses); [] when intact.

    The cheap check of every resolution trusts a file whose size and mtime are as last hashed:
    bit rot keeps both. This full read runs before goldens are made from the artifact and when
    a gate fails, so corrupt weights are never laundered into goldens nor blamed on the
    implementation. It also leaves the index holding what it read, so the next resolution's
    cheap check sees a corrupt file and rebuilds a made-here artifact."""
    if made_here(artifact):
        return check_files(artifact.model_dir, full=True)
    try:
        verify_hub_snapshot(artifact.model_dir, profile.artifact, full=True)
    except ArtifactError as e:
        return [str(e)]
    return []


def verify_hub_snapshot(model_dir: Path, spec: ArtifactSpec, full: bool = False) -> dict[str, str]:
    """A real hub snapshot, checked against the HF cache's own content addresses: each file
    links to a blob named by its sha256 (LFS files) or its git blob sha1 (the others).
    `full` reads every file again (see `verify_in_full`)."""
    names = _listed_files(model_dir)
    hashes = _hash_with_index(model_dir, names, full=full)
    bad = []
    for name in names:
        blob = (model_dir / name).resolve()
        address = blob.name
        if hashes[name] is None:
            bad.append(f"{name}: missing")
        elif len(address) == 64 and address != hashes[name]:
            bad.append(f"{name}: sha256 {hashes[name][:12]}… is not its blob's name {address[:12]}…")
        elif len(address) == 40 and all(c in "0123456789abcdef" for c in address):
            data = blob.read_bytes()
            if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != address:
                bad.append(f"{name}: git blob sha1 is not its blob's name {address[:12]}…")
    if bad:
        raise ArtifactError(
            f"artifact {spec.repo}@{spec.revision} is corrupt in the HF cache ({model_dir}): {'; '.join(bad[:5])}; "
            f"delete the snapshot's blobs and download it again: "
            f"`huggingface-cli download {spec.repo} --revision {spec.revision} --force-download`"
        )
    return {name: h for name, h in hashes.items() if h is not None}
