"""Exercise judged over a profile (issue 31 part 1): each check's declared paths
(harness/checks/exercise.py) against what the scenarios that ran walked, from their rows.

- every declared path walked by some scenario: a coverage line naming who walked each one;
- a path no scenario walked, every scenario of the profile naming the check having run here:
  an ERROR row, "nothing exercised", for the check (the run fails: the check proved nothing);
- a path not walked while some of those scenarios did not run (a `-k` selection, a crash, a
  scenario scoped to another backend): "not judged", said, never an error nor a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.checks import registry
from harness.profile import Profile
from harness.report import ItemResult

SCENARIO = "(profile)"  # the scenario column of a coverage row: it judges the profile


@dataclass(frozen=True)
class Coverage:
    model: str
    check: str
    line: str  # printed after every run
    row: ItemResult | None  # an ERROR row when a declared path was walked by no scenario


def judge_coverage(profiles: list[Profile], results: list[ItemResult], backend: str) -> list[Coverage]:
    out = []
    for profile in profiles:
        for check in registry.with_exercises():
            naming = [s for s in profile.scenarios if check in profile.checks(s)]
            if naming and registry.get(check).exercises.declared(profile):
                out.append(_judge(profile, check, naming, results, backend))
    return out


def _judge(profile: Profile, check: str, naming: list, results: list[ItemResult], backend: str) -> Coverage:
    exercise = registry.get(check).exercises
    assert exercise is not None
    rows = {r.scenario: r for r in results if r.model == profile.name and r.check == check}
    declared = exercise.declared(profile)
    walked_by = {p: [sid for sid, r in rows.items() if p in r.details.get("walked", [])] for p in declared}
    said = "; ".join(f"{p}: {', '.join(who) if who else 'not walked'}" for p, who in walked_by.items())
    missing = [p for p, who in walked_by.items() if not who]
    head = f"exercise {profile.name} {check}"
    if not missing:
        return Coverage(profile.name, check, f"{head}: {said}", None)
    elsewhere = [s.id for s in naming if not profile.runs_on(s, backend)]
    unjudged = [s.id for s in naming if profile.runs_on(s, backend) and "walked" not in rows.get(s.id, _NONE).details]
    if elsewhere or unjudged:
        why = []
        if unjudged:
            why.append(f"{len(unjudged)} scenario(s) not run or without a result ({', '.join(unjudged[:5])})")
        if elsewhere:
            why.append(f"{len(elsewhere)} scoped to another backend")
        return Coverage(profile.name, check, f"{head}: {said} (not judged: {'; '.join(why)})", None)
    summary = (
        f"nothing exercised: no scenario of {profile.name} walked {', '.join(repr(p) for p in missing)} "
        f"({exercise.what}); its scenarios judged by {check}: {', '.join(s.id for s in naming)}. "
        f"The check passed nothing there: add a scenario that walks it (docs/profiles.md, exercises)"
    )
    row = ItemResult(
        model=profile.name,
        scenario=SCENARIO,
        check=check,
        tier=profile.tier,
        oracle=profile.oracle,
        outcome="error",
        summary=summary,
        details={"not_walked": missing, "walked_by": walked_by},
    )
    return Coverage(profile.name, check, f"{head}: {said} (NOTHING EXERCISED)", row)


_NONE = ItemResult(model="", scenario="", check="", tier="", oracle="", outcome="error", summary="")
