"""The artifacts a session holds: each profile's resolved once, read in full once before it is
trusted with a golden or a failure, and made again where it was made here.

Bit rot keeps a file's size and mtime, so the cheap check of resolution cannot see it; `verify`
reads every file against its integrity record (harness/artifacts/integrity.py). A corrupt
made-here artifact (a twin, a conversion) is made again and every in-tree run made on it is
dropped (`release`, counted in `rebuilds`); a corrupt hub snapshot cannot be mended here and
is an ArtifactError for this and every later check of the profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.artifacts.integrity import made_here, verify_in_full
from harness.artifacts.resolve import ResolvedArtifact, resolve_artifact
from harness.errors import ArtifactError, HarnessError
from harness.profile import Profile
from harness.progress import progress
from harness.timing import clock


@dataclass
class ArtifactKeeper:
    release: Callable[[str], None]  # drop what ran on a profile's artifact (the session's runner, records)
    resolved: dict[str, ResolvedArtifact] = field(default_factory=dict)
    errors: dict[str, HarnessError] = field(default_factory=dict)  # corrupt in full, not mendable here
    verified_in_full: set[str] = field(default_factory=set)
    rebuilds: dict[str, int] = field(default_factory=dict)

    def artifact(self, profile: Profile) -> ResolvedArtifact:
        if profile.name in self.errors:
            raise self.errors[profile.name]
        if profile.name not in self.resolved:
            with clock.phase("artifact"):
                self.resolved[profile.name] = resolve_artifact(profile)
        return self.resolved[profile.name]

    def rebuilt(self, name: str) -> int:
        """How many times the profile's artifact was found corrupt and made again."""
        return self.rebuilds.get(name, 0)

    def verify(self, profile: Profile, why: str) -> None:
        """Every file of the profile's artifact read and hashed against its record, once."""
        if profile.name in self.verified_in_full:
            return
        artifact = self.artifact(profile)
        with clock.phase("artifact"), progress.task(f"{profile.name}: hashing the artifact's files in full"):
            problems = verify_in_full(profile, artifact)
        if problems and made_here(artifact):
            progress.say(
                f"{profile.name}: artifact {artifact.model_dir} does not match its record {why} "
                f"({'; '.join(problems[:3])}): making it again"
            )
            self.release(profile.name)
            self.resolved.pop(profile.name, None)
            self.rebuilds[profile.name] = self.rebuilt(profile.name) + 1
            self.artifact(profile)  # the cheap check now sees what the full read saw: rebuilt
        elif problems:
            self.errors[profile.name] = ArtifactError(
                f"{profile.name}: artifact {artifact.model_dir} is corrupt, found {why}: {'; '.join(problems[:3])}; "
                "nothing is compared on it and no golden is made from it"
            )
            raise self.errors[profile.name]
        self.verified_in_full.add(profile.name)
