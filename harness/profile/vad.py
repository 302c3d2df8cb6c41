"""VAD profiles (profiles/vad/*.yaml): the pinned package and model, the fixtures, the probability
tolerance with its reason, and the timestamp option sets (docs/vad.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import (
    ProfileError,
)
from harness.paths import FIXTURES_DIR, profiles_dir

PROFILE_KEYS = {
    "name",
    "artifact",
    "oracle",
    "fixtures",
    "speech",
    "probability_tolerance",
    "tolerance_reason",
    "streaming",
    "timestamp_options",
}


ARTIFACT_KEYS = {"package", "version", "wheel", "wheel_sha256", "file", "sha256"}


@dataclass(frozen=True)
class VadArtifact:
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    file: str
    sha256: str


@dataclass(frozen=True)
class VadProfile:
    name: str
    artifact: VadArtifact
    oracle: str
    fixtures: list[str]
    # The fixtures that hold speech: there the package's segments must be non-empty under every
    # option set, or `segments` compared nothing (an ERROR, harness/checks/vad.py).
    speech: tuple[str, ...]
    probability_tolerance: float
    tolerance_reason: str
    streaming: str
    timestamp_options: dict[str, dict[str, Any]]
    source_file: Path


def load_vad_profile(path: Path | None = None) -> VadProfile:
    """profiles/vad/silero-vad.yaml validated into a VadProfile (errors name file and key)."""
    from models.vad import SpeechTimestampOptions

    path = Path(path or profiles_dir() / "vad" / "silero-vad.yaml")
    if not path.is_file():
        raise ProfileError(f"VAD profile not found: {path}")
    from harness.profile.inputs import check_wav, read_yaml

    data = read_yaml(path)
    if not isinstance(data, dict) or set(data) != PROFILE_KEYS:
        got = sorted(data, key=repr) if isinstance(data, dict) else type(data).__name__
        raise ProfileError(f"{path}: expected exactly the keys {sorted(PROFILE_KEYS)}, got {got}")
    if not isinstance(data["artifact"], dict) or set(data["artifact"]) != ARTIFACT_KEYS:
        raise ProfileError(f"{path}: artifact: expected exactly the keys {sorted(ARTIFACT_KEYS)}")
    artifact = VadArtifact(**{k: str(v) for k, v in data["artifact"].items()})
    tolerance = data["probability_tolerance"]
    if not isinstance(tolerance, float) or not 0 < tolerance < 0.01:
        raise ProfileError(f"{path}: probability_tolerance: expected a float in (0, 0.01), got {tolerance!r}")
    if data["streaming"] != "bit-exact":
        raise ProfileError(f"{path}: streaming: only 'bit-exact' is implemented, got {data['streaming']!r}")
    options = data["timestamp_options"]
    if not isinstance(options, dict) or "default" not in options:
        raise ProfileError(f"{path}: timestamp_options: expected a mapping with a 'default' option set")
    for name, values in options.items():
        try:
            SpeechTimestampOptions.from_dict(values)
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{path}: timestamp_options.{name}: {e}") from None
    if not isinstance(data["fixtures"], list) or not data["fixtures"]:
        raise ProfileError(f"{path}: fixtures: expected a non-empty list of WAV files, got {data['fixtures']!r}")
    for i, fixture in enumerate(data["fixtures"]):
        if not isinstance(fixture, str) or not (FIXTURES_DIR / fixture).is_file():
            raise ProfileError(f"{path}: fixtures: {FIXTURES_DIR / str(fixture)} does not exist")
        check_wav(FIXTURES_DIR / fixture, f"{path}: fixtures[{i}]", fixture)
    speech = data["speech"]
    if not isinstance(speech, list) or not all(isinstance(f, str) for f in speech):
        raise ProfileError(f"{path}: speech: expected a list of the fixtures that hold speech, got {speech!r}")
    strays = [f for f in speech if f not in data["fixtures"]]
    if strays or len(set(speech)) != len(speech):
        raise ProfileError(
            f"{path}: speech: {strays or speech} — each entry must be one of the profile's fixtures, named once"
        )
    return VadProfile(
        name=data["name"],
        artifact=artifact,
        oracle=data["oracle"],
        fixtures=list(data["fixtures"]),
        speech=tuple(speech),
        probability_tolerance=tolerance,
        tolerance_reason=data["tolerance_reason"],
        streaming=data["streaming"],
        timestamp_options=options,
        source_file=path,
    )


VAD_TIER = "tolerance"  # probabilities within a measured tolerance, segments and streaming exact


def available_vad_profiles() -> dict[str, Path]:
    """VAD profiles (profiles/vad/*.yaml) by name: collected by `make parity` like any profile."""
    directory = profiles_dir() / "vad"
    return {p.stem: p for p in sorted(directory.glob("*.yaml"))} if directory.is_dir() else {}
