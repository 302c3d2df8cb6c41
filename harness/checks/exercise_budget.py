"""What `token_budget` must see to mean anything (issue 31 part 1): a differing token admitted as a
near-tie.

The L2 fast-path gate (harness/checks/token_budget.py) lets up to `max_differing_tokens` tokens
differ from the oracle when every one arises at a near-tie flip. That leniency rests on the
near-tie classification (rules 4c and 5): a clip on which the fast path never leaves the oracle
never runs it on a real flip, and a classification that called every flip a near-tie would pass
there. So a profile whose budget admits a differing token (some token_budget scenario with
`max_differing_tokens` >= 1) declares the path NEAR_TIE_DIFFERENCE, and some scenario must walk
it: its free fast run differs from the oracle's, and the gate traced the first difference to a
teacher-forced flip that it classified as a near-tie. With a budget of 0 no differing token can
pass, whatever the classification says: nothing is declared.

Read from the check's own result details (what the run under test did, which only it can walk):
`differing_tokens`, `arising` (rule 5: the decode call and step where the differences arise,
`explained` when that is a near-tie flip) and `flips` (rule 4: each teacher-forced flip with its
`near_tie` verdict). Walked or not says nothing about the verdict: a walked path on a failing
check is still a failing check.
"""

from __future__ import annotations

from typing import Any

from harness.checks.exercise import Exercise
from harness.records import ScenarioRecord

NEAR_TIE_DIFFERENCE = "a differing token classified as a near-tie"


def _budgets(profile: Any) -> list[int]:
    """The `max_differing_tokens` of every scenario of the profile that names token_budget."""
    out = []
    for scenario in profile.scenarios:
        if "token_budget" not in profile.checks(scenario):
            continue
        budget = ((scenario.composition or {}).get("budget") or {}).get("max_differing_tokens")
        if budget is not None:
            out.append(int(budget))
    return out


def _declared(profile: Any) -> list[str]:
    return [NEAR_TIE_DIFFERENCE] if any(b >= 1 for b in _budgets(profile)) else []


def _near_tie_difference(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
    """At least one token of the free fast run differs from the oracle's, and the first difference
    is a teacher-forced flip (same decode call, step, batch member 0) classified as a near-tie."""
    if int(details.get("differing_tokens") or 0) < 1:
        return set()
    arising = details.get("arising") or {}
    if not arising.get("explained"):
        return set()
    where = (arising.get("call"), arising.get("step"), 0)
    for flip in details.get("flips") or []:
        if (flip.get("call"), flip.get("step"), flip.get("member")) == where and flip.get("near_tie") is True:
            return {NEAR_TIE_DIFFERENCE}
    return set()


TOKEN_BUDGET = Exercise(
    "the fast path's free run differs from the oracle at >= 1 token, and the gate classifies the flip it "
    "arises from (teacher-forced) as a near-tie (declared where a budget admits a differing token)",
    _declared,
    _near_tie_difference,
)
