"""A scenario planned once: what both sides compute (the spec and its hash), who judges it
(oracle, tier), with which checks, and what those checks need.

`Profile.planned(scenario)` makes it on first use and keeps it (a speech scenario's spec hashes
its WAV once, not at each of the dozen places that read the spec); the session, the golden
lifecycle and the pytest items read it. The spec is read-only; `spec_dict()` is a copy a caller
may extend (a mutant's edits, a runnable audio path).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.checks import registry
from harness.errors import ProfileError


@dataclass(frozen=True)
class PlannedScenario:
    model: str
    scenario: Any  # the profile's Scenario
    spec: Mapping[str, Any]
    spec_sha256: str
    oracle: str
    tier: str
    checks: tuple[str, ...]
    needs: frozenset[str]  # what the checks need together (harness/checks/context.py)

    @property
    def id(self) -> str:
        return self.scenario.id

    def spec_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.spec))


def plan(profile: Any, scenario: Any, spec: dict[str, Any]) -> PlannedScenario:
    checks = tuple(profile.checks(scenario))
    return PlannedScenario(
        model=profile.name,
        scenario=scenario,
        spec=MappingProxyType(copy.deepcopy(spec)),
        spec_sha256=hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest(),
        oracle=profile.oracle_of(scenario),
        tier=profile.tier_of(scenario),
        checks=checks,
        needs=frozenset(need for name in checks for need in registry.get(name).needed),
    )


def file_sha256(path: Path) -> str:
    """A speech scenario's audio, hashed into its spec (once per plan)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise ProfileError(f"audio file {path}: cannot read it: {e}") from None
