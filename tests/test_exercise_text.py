"""The text checks' paths (issue 31 part 1), read from the oracle's records of the mini twin:
`detokenize` needs a stream whose last piece only finalize() releases, `response` every
transition of mlx-lm's server state machine that the scenarios make possible, marker
boundaries, and integral and non-integral numbers. The audit's four missed text faults are
each caught on the scenario that walks their path (harness/tools/mutant_faults_text.py)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.checks import registry
from harness.checks.exercise_text import FINALIZE_FLUSH, OVER_PIECES, WITH_TEXT, _moves_walked
from harness.session import ParitySession

MINI = "minicpm5-2b-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MINI)]


def _golden(scenario_id: str):
    session = ParitySession(selected_scenarios={MINI: {scenario_id}})
    profile = session.profile(MINI)
    scenario = profile.scenario(scenario_id)
    return profile, scenario, session.golden(profile, scenario).record


@pytest.mark.parametrize(("scenario_id", "walked"), [("multibyte-turns", True), ("multibyte-forced", False)])
def test_a_finalize_flush_is_a_last_piece_ending_in_a_replacement_character(scenario_id: str, walked: bool) -> None:
    profile, scenario, golden = _golden(scenario_id)
    paths = registry.get("detokenize").exercises.walked(golden, profile.scenario_spec(scenario), {})
    assert (FINALIZE_FLUSH in paths) is walked
    last = [s["pieces"][-1] for s in golden.extra["stream_text"]]
    assert all(p.endswith("\ufffd") for p in last) is walked, last


def test_response_split_walks_every_path_the_profile_declares_and_each_forced_text_counts() -> None:
    profile, scenario, golden = _golden("response-split")
    exercise = registry.get("response").exercises
    declared = exercise.declared(profile)
    spec = profile.scenario_spec(scenario)
    assert set(exercise.walked(golden, spec, {})) == set(declared)
    assert len(declared) == 10, declared
    # The sequences built for a path are what walks it: without them, the path is not walked.
    server = golden.extra["server_response"]
    for removed, lost in [
        ("reasoning-again", "normal -> reasoning"),
        ("integral-numbers", "an integral number argument"),
    ]:
        forced = [f for f in server["forced"] if f["id"] != removed]
        without = dataclasses.replace(golden, extra=golden.extra | {"server_response": server | {"forced": forced}})
        assert lost not in exercise.walked(without, spec, {}), removed


def test_a_profile_without_thinking_or_tools_declares_content_only() -> None:
    profile = ParitySession().profile("smollm2-135m")
    assert registry.get("response").exercises.declared(profile) == ["content"]


@pytest.mark.parametrize(
    ("move", "walked"),
    [
        # A marker that is a piece of its own: a transition and nothing else.
        ({"held": "", "segments": [["reasoning", ""], ["normal", ""]]}, {"reasoning -> normal"}),
        # Begun in held-back text, finished by this piece.
        (
            {"held": "<function name", "segments": [["normal", ""], ["tool", '"']]},
            {"normal -> tool", OVER_PIECES, WITH_TEXT},
        ),
        ({"held": "</function", "segments": [["tool", ""], ["normal", ""]]}, {"tool -> normal", OVER_PIECES}),
        # Text of this piece before the marker.
        ({"held": "", "segments": [["normal", " "], ["reasoning", ""]]}, {"normal -> reasoning", WITH_TEXT}),
        # Held text that was not the marker's beginning, released before it.
        ({"held": "<", "segments": [["normal", "<a"], ["reasoning", ""]]}, {"normal -> reasoning", WITH_TEXT}),
    ],
)
def test_marker_boundaries_are_read_from_what_the_state_machine_held(move: dict, walked: set[str]) -> None:
    assert _moves_walked([move]) == walked


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("finalize-drops-flush", "detokenize"),
        ("no-reasoning-reentry", "response"),
        ("marker-piece-missplit", "response"),
        ("integral-number-float", "response"),
    ],
)
def test_the_audits_missed_text_faults_are_caught_on_the_scenario_that_walks_their_path(name: str, check: str) -> None:
    from harness.tools.mutant_list import MUTANTS
    from harness.tools.mutants import judge

    mutant = next(m for m in MUTANTS if m.name == name)
    judged = judge(mutant)
    assert judged["killed"] and judged["outcomes"][check] == "failed", judged["summaries"]


def test_a_finalize_that_drops_its_flush_passes_where_add_released_the_last_piece() -> None:
    from harness.tools.mutant_list import MUTANTS
    from harness.tools.mutants import judge

    mutant = next(m for m in MUTANTS if m.name == "finalize-drops-flush")
    blind = judge(dataclasses.replace(mutant, scenario="multibyte-forced"))
    assert not blind["killed"] and blind["outcomes"]["detokenize"] == "passed", blind["summaries"]
