"""What a scenario's runners are given: the spec as the oracle and the in-tree side run it,
and whether the oracle may run beside the in-tree side."""

from __future__ import annotations

import os
from typing import Any

from harness import settings
from harness.artifacts.draft import with_draft_dir
from harness.paths import REPO_ROOT
from harness.profile import Profile, Scenario
from harness.provenance import device_facts


def oracle_spec(profile: Profile, scenario: Scenario) -> dict[str, Any]:
    """What the oracle is asked to run: an in-tree composition (the Whisper fast path) is
    judged against the oracle's reference path, so the oracle never sees it."""
    spec = runnable_spec(profile.planned(scenario).spec_dict())
    if profile.intree_composition(scenario):
        spec = {k: v for k, v in spec.items() if k != "composition"}
    return spec


def runnable_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as a runner needs it: an audio path made absolute (the hash keeps it relative),
    a draft model resolved to its directory."""
    spec = with_draft_dir(spec)
    if spec.get("audio"):
        return spec | {"audio": str(REPO_ROOT / spec["audio"])}
    return spec


def overlap_enabled(requested: bool) -> bool:
    """Generate goldens beside the in-tree side: when the session asks (the parity plugin's
    does; a session used directly, as tests and tools use it, does not), unless
    `MLX_PARITY_OVERLAP=0`, and where the machine has a second core or a GPU for it."""
    if not requested or not settings.read().overlap:
        return False
    return (os.cpu_count() or 1) >= 2 or device_facts().backend != "cpu"
