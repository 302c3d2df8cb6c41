"""What a check must see to mean anything: the paths it declares, walked or not (issue 31 part 1).

A check that compares two runs which never took the path it names passes without proving
anything: a draft-cache rewind that ignores the accepted count passes `speculative` when every
draft is accepted or every draft rejected; a forgotten EOS id passes `eos_stop` when no run stops
on it. So a check of the registry (harness/checks/registry.py `exercises`) declares its paths for
a profile, and says which of them one scenario's run walked, read from the oracle's record (what
the reference did on the scenario, whatever the implementation under test did).

Exercise is judged over the profile: some scenario must walk each declared path, or the run has
an ERROR row "nothing exercised" for the check (harness/coverage.py), and every run prints which
scenarios walked each path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.records import ScenarioRecord


@dataclass(frozen=True)
class Exercise:
    what: str  # one line: what walking a path means for this check
    declared: Callable[[Any], list[str]]  # Profile -> the paths some scenario of it must walk
    walked: Callable[[ScenarioRecord], set[str]]  # the oracle's record of one scenario -> paths it walked


def _partial_acceptance(golden: ScenarioRecord) -> set[str]:
    from harness.checks.speculative import verify_steps

    steps = verify_steps(golden)
    partial = any(0 < int(s["accepted"]) < int(s["drafted"]) for s in steps)
    return {"partial acceptance"} if partial else set()


SPECULATIVE = Exercise(
    "a verify step accepts some but not all of its drafted tokens (the draft cache rewinds by the accepted count)",
    lambda profile: ["partial acceptance"],
    _partial_acceptance,
)


def _declared_eos(profile: Any) -> list[str]:
    ids = profile.expect.get("eos_token_id")
    if ids is None:
        return ["stops on an EOS id"]
    return [f"stops on EOS {i}" for i in sorted(ids if isinstance(ids, list) else [ids])]


def _eos_walked(golden: ScenarioRecord) -> set[str]:
    out = set()
    for seg, step in zip(golden.segments(), golden.segment_eos_steps(), strict=True):
        if step is not None:
            out |= {"stops on an EOS id", f"stops on EOS {golden.tokens[seg.row_offset + step]}"}
    return out


EOS_STOP = Exercise(
    "a run stops on each EOS id the profile declares (expect.eos_token_id; any EOS id when it declares none)",
    _declared_eos,
    _eos_walked,
)
