"""`token_budget` proves it classified a real flip (issue 31 part 1): a profile whose budget admits a
differing token declares "a differing token classified as a near-tie", read from the check's own
result details (harness/checks/exercise_budget.py). A clip on which the fast path never leaves the
oracle (fox-fast: 0 differing tokens, 0 flips) walks nothing; a built clip on which it does, at a
near-tie, walks it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.checks.exercise_budget import NEAR_TIE_DIFFERENCE, TOKEN_BUDGET


def _flip(call: int, step: int, near_tie: bool, member: int = 0) -> dict:
    return {"call": call, "step": step, "member": member, "near_tie": near_tie, "kind": "logits"}


def _arising(call: int, step: int) -> dict:
    return {"explained": True, "call": call, "step": step, "explanation": "every difference arises at ..."}


@pytest.mark.parametrize(
    ("details", "walked"),
    [
        # the free run differs by a token, traced to a teacher-forced near-tie flip
        ({"differing_tokens": 1, "arising": _arising(0, 18), "flips": [_flip(0, 18, True)]}, True),
        # later flips of the teacher-forced run do not matter: the one the difference arises from does
        ({"differing_tokens": 2, "arising": _arising(0, 3), "flips": [_flip(0, 3, True), _flip(1, 0, False)]}, True),
        # fox-fast today: the fast path never leaves the oracle
        ({"differing_tokens": 0, "arising": None, "flips": []}, False),
        # a teacher-forced near-tie flip whose free run does not differ counts nothing
        ({"differing_tokens": 0, "arising": None, "flips": [_flip(0, 5, True)]}, False),
        # the difference arises at a flip the gate did not call a near-tie
        (
            {
                "differing_tokens": 1,
                "arising": {"explained": False, "explanation": "... a flip that is not a near-tie"},
                "flips": [_flip(0, 18, False)],
            },
            False,
        ),
        # explained elsewhere than at the near-tie flip listed (a record that does not fit)
        ({"differing_tokens": 1, "arising": _arising(0, 18), "flips": [_flip(0, 17, True)]}, False),
        ({"differing_tokens": 1, "arising": _arising(0, 18), "flips": [_flip(0, 18, True, member=1)]}, False),
        ({}, False),  # no details: nothing was judged
    ],
)
def test_the_path_is_read_from_the_checks_result(details: dict, walked: bool) -> None:
    assert TOKEN_BUDGET.walked(None, {}, details) == ({NEAR_TIE_DIFFERENCE} if walked else set())


def _profile(*budgets: int | None) -> SimpleNamespace:
    scenarios = [
        SimpleNamespace(
            id=f"s{i}",
            composition=None if b is None else {"kind": "whisper-fast", "budget": {"max_differing_tokens": b}},
        )
        for i, b in enumerate(budgets)
    ]
    checks = {s.id: (["mel", "token_budget"] if s.composition else ["mel", "transcript"]) for s in scenarios}
    return SimpleNamespace(scenarios=scenarios, checks=lambda s: checks[s.id])


def test_declared_where_a_budget_admits_a_differing_token() -> None:
    assert TOKEN_BUDGET.declared(_profile(None, 0, 0)) == []  # budget 0: no difference can pass anyway
    assert TOKEN_BUDGET.declared(_profile(None, 0, 1)) == [NEAR_TIE_DIFFERENCE]
    from harness.session import ParitySession

    for name in ("whisper-tiny-en", "whisper-base"):  # as committed: every budget 0
        profile = ParitySession().profile(name)
        budgets = [s.composition["budget"]["max_differing_tokens"] for s in profile.scenarios if s.composition]
        assert TOKEN_BUDGET.declared(profile) == ([NEAR_TIE_DIFFERENCE] if max(budgets) >= 1 else []), name


# -- read from the gate's real details (harness/checks/token_budget.py on synthetic records) ---------

VOCAB, EOT = 8, 7


def _record(tokens: list[int], rows: list[dict[int, float]], mode: str, picks: list[int] | None = None):
    import numpy as np

    from harness.records import ScenarioRecord
    from models.whisper.fast_filters import FastFilters

    logits = np.zeros((len(rows), VOCAB), np.float32)
    for i, row in enumerate(rows):
        for token, value in row.items():
            logits[i, token] = value
    call = {
        "seek": 0,
        "batch": 1,
        "n_steps": len(tokens),
        "row_offset": 0,
        "tokens": [t for t in tokens if t != EOT],
        "kept": True,
        "skipped_as_silence": False,
        "temperature": 0.0,
    }
    if picks is not None:
        filters = FastFilters(n_vocab=VOCAB, blank=None, suppress=(6,), timestamps=None).to_dict()
        call |= {"fast_filters": filters, "fast_picks": [[p] for p in picks]}
    return ScenarioRecord("synthetic", None, [], tokens, logits, [EOT], mode, extra={"decode_calls": [call]})


def _judged(golden, free, forced, budget: int):
    from harness.checks.token_budget import check_token_budget, measure
    from harness.goldens.calibration import CalibrationRecord, golden_identity

    steps = tuple(measure(golden, forced)["steps"])
    record = CalibrationRecord("synthetic", "synthetic", "key", golden_identity(golden), budget, steps, {})
    return check_token_budget(golden, free, forced, budget, record)


ORACLE = [{2: 5.0, 3: 1.0}, {4: 3.0, 5: 2.999}, {EOT: 9.0}]


@pytest.mark.parametrize(
    ("fast", "picks", "budget", "passes", "walked"),
    [
        ([{2: 5.0, 3: 1.0}, {4: 2.999, 5: 3.0}, {EOT: 9.0}], [2, 5, EOT], 1, True, True),  # a near-tie, admitted
        ([{2: 5.0, 3: 1.0}, {4: 2.999, 5: 3.0}, {EOT: 9.0}], [2, 5, EOT], 0, False, True),  # walked, over budget
        ([{2: 5.0, 3: 1.0}, {4: 3.0, 3: 0.5}, {EOT: 9.0}], [2, 3, EOT], 5, False, False),  # a wide-margin flip
        (ORACLE, [2, 4, EOT], 1, True, False),  # the fast path never left the oracle
    ],
)
def test_walked_on_the_gates_own_details(fast: list, picks: list[int], budget: int, passes: bool, walked: bool) -> None:
    golden = _record([2, 4, EOT], ORACLE, "free")
    free = _record(picks, fast, "free")
    forced = _record([2, 4, EOT], fast, "teacher_forced", picks=picks)
    result = _judged(golden, free, forced, budget)
    assert result.passed is passes, result.summary
    assert TOKEN_BUDGET.walked(None, {}, result.details) == ({NEAR_TIE_DIFFERENCE} if walked else set())


# -- the built clip walks it (tools/make-near-tie-fixture.py) ----------------------------------------


def test_a_scenario_built_for_the_path_that_did_not_walk_it_is_an_error() -> None:
    """The built clip's scenario says it exists for the path (`exercises:`): a run of it whose fast
    path no longer leaves the oracle (another fast path, another key) is an ERROR, whatever the
    comparison concluded; the same result on a scenario that claims nothing only counts."""
    from harness.checks.compare import CheckResult
    from harness.checks.exercise import walked_paths
    from harness.errors import NothingComparedError

    claim = [f"token_budget: {NEAR_TIE_DIFFERENCE}"]
    built = SimpleNamespace(id="weather-near-tie-fast", exercises=claim)
    plain = SimpleNamespace(id="fox-fast", exercises=[])
    profile = SimpleNamespace(name="whisper-tiny-en", scenario_spec=lambda s: {"id": s.id})
    result = CheckResult("token_budget", True, "0/1 differing tokens; 20 teacher-forced steps checked, 0 flip(s)")
    result.details = {"differing_tokens": 0, "arising": None, "flips": []}
    with pytest.raises(NothingComparedError, match=r"weather-near-tie-fast exists to walk token_budget's"):
        walked_paths(profile, built, "token_budget", TOKEN_BUDGET, None, result)
    assert walked_paths(profile, plain, "token_budget", TOKEN_BUDGET, None, result) == []
