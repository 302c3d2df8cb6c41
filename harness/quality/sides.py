"""A pair's sides as local model directories: the profile's artifact, a pinned artifact mapping
(both through the one resolver, harness/artifacts/resolve.py) or a twin-only control built once
into the cache; and the refusals that need the artifacts: a twin control against real weights,
tokenizers that differ."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.artifacts.files import build_once, building_dir, file_hashes
from harness.artifacts.resolve import ResolvedArtifact, _tokenizer_hash, resolve_artifact
from harness.errors import ArtifactError, ProfileError
from harness.paths import cache_root
from harness.profile import Profile
from harness.profile.quality import QualitySide
from harness.progress import progress


@dataclass(frozen=True)
class ResolvedSide:
    """One side, ready to load: its directory, what it is (for the cache key) and what ran."""

    model_dir: Path
    provenance: dict[str, Any]  # identity, weight / tokenizer / config hashes
    ran: str  # "real" | "twin"
    label: str

    @property
    def tokenizer_hash(self) -> str:
        return str(self.provenance.get("tokenizer", ""))


def resolve_side(profile: Profile, side: QualitySide, where: str) -> ResolvedSide:
    if side.twin is not None:
        return _twin_side(side.twin, where)
    if side.artifact == "profile":
        artifact = resolve_artifact(profile)
    else:
        artifact = resolve_artifact(dataclasses.replace(profile, artifact=side.artifact))
    return _side(artifact, side.describe(profile.artifact))


def _side(artifact: ResolvedArtifact, label: str) -> ResolvedSide:
    ran = "twin" if "twin" in artifact.identity else "real"
    return ResolvedSide(artifact.model_dir, artifact.provenance(), ran, label)


def _twin_side(twin_id: str, where: str) -> ResolvedSide:
    """A registered twin as its own directory (no hub repo claimed for it), built once."""
    from harness.artifacts import twins

    try:
        identity = twins.twin_identity(twins.get_twin(twin_id))
    except ValueError as e:
        raise ProfileError(f"{where}.twin: {e}") from None
    target = cache_root() / "quality" / "twins" / f"{twin_id}-v{identity['twin_version']}"

    def build() -> None:
        import mlx.core as mx

        with progress.task(f"building twin {twin_id} (a quality control)"), mx.stream(mx.cpu):
            with building_dir(target, json.dumps(identity, sort_keys=True)) as tmp:
                twins.build_twin(twin_id, tmp)  # into the (empty) building directory

    build_once(target, target, f"twin {twin_id}", f"quality-twin-{twin_id}", build)
    hashes = file_hashes(target)
    provenance = {
        "identity": {"source": "twin", "twin": identity},
        "weights": {n: h for n, h in hashes.items() if n.endswith(".safetensors")},
        "tokenizer": _tokenizer_hash(target),
        "config": hashes.get("config.json", ""),
    }
    return ResolvedSide(target, provenance, "twin", f"twin {twin_id}")


def check_pair_sides(pair_where: str, control: ResolvedSide, candidate: ResolvedSide) -> None:
    """Refuse what cannot be compared: a twin control against real weights, other tokenizers."""
    if control.ran == "twin" and candidate.ran == "real" and control.provenance["identity"].get("source") == "twin":
        raise ArtifactError(
            f"{pair_where}.control.twin: the candidate ran the real artifact ({candidate.label}), and a twin control "
            "compares only with a twin candidate: pin a real control (an artifact mapping) to measure real weights"
        )
    a, b = _vocab(control.model_dir), _vocab(candidate.model_dir)
    if a != b or control.tokenizer_hash != candidate.tokenizer_hash:
        raise ArtifactError(
            f"{pair_where}: the tokenizers differ: control {control.label} (vocab {a}, tokenizer "
            f"{control.tokenizer_hash[:12]}) vs candidate {candidate.label} (vocab {b}, tokenizer "
            f"{candidate.tokenizer_hash[:12]})"
        )


def _vocab(model_dir: Path) -> Any:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{model_dir}/config.json: unreadable: {e}") from None
    return config.get("vocab_size", config.get("n_vocab"))
