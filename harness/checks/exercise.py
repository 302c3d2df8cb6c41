"""What a check must see to mean anything: the paths it declares, walked or not (issue 31 part 1).

A check that compares two runs which never took the path it names passes without proving
anything: a draft-cache rewind that ignores the accepted count passes `speculative` when every
draft is accepted or every draft rejected; a forgotten EOS id passes `eos_stop` when no run stops
on it. So a check of the registry (harness/checks/registry.py `exercises`) declares its paths for
a profile, and says which of them one scenario's run walked, read from the oracle's record (what
the reference did on the scenario, whatever the implementation under test did) and the
scenario's spec (how the prompt was fed).

Exercise is judged over the profile: some scenario must walk each declared path, or the run has
an ERROR row "nothing exercised" for the check (harness/coverage.py), and every run prints which
scenarios walked each path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.errors import NothingComparedError
from harness.records import ScenarioRecord


@dataclass(frozen=True)
class Exercise:
    what: str  # one line: what walking a path means for this check
    declared: Callable[[Any], list[str]]  # Profile -> the paths some scenario of it must walk
    # (the oracle's record of one scenario, the scenario's spec, the check's result details:
    # what the run under test did, for a path only it can walk) -> the paths it walked
    walked: Callable[[ScenarioRecord, dict[str, Any], dict[str, Any]], set[str]]


def _partial_acceptance(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
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


def _eos_walked(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
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


FULL_RING_WRITE = "multi-token write into a full ring"


def _rotating(profile: Any) -> list[str]:
    """A profile with a rotating-cache scenario (`max_kv_size`, mlx-lm's RotatingKVCache)."""
    return [FULL_RING_WRITE] if any(s.max_kv_size is not None for s in profile.scenarios) else []


def _full_ring_write(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
    """The prompt fed as generate_step feeds it (all but its last token, in chunks of
    `prefill_step_size`): does a chunk of several tokens arrive when the ring already holds
    `max_kv_size` positions (so the cache trims old positions and appends the chunk at once)?"""
    window = spec.get("max_kv_size")
    if window is None or spec.get("composition"):
        return set()
    step, left, stored = int(spec.get("prefill_step_size") or 2048), len(golden.prompt_ids), 0
    while left > 1:
        chunk = min(step, left - 1)
        if stored >= window and chunk > 1:
            return {FULL_RING_WRITE}
        stored = chunk if stored == 0 else min(stored, window - 1) + chunk
        left -= chunk
    return set()


DECODE_LOGITS = Exercise(
    "a prefill chunk of several tokens is written into a rotating cache that is already full (its trim and append)",
    _rotating,
    _full_ring_write,
)


DECODED_BEFORE_FINISH = "decoded before finish"


def _decoded_before_finish(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
    """The in-tree stream decoded a window while samples were still being fed (feed(), not
    finish()): what makes it a stream. Read from the check's own runs (chunk sizes in turn)."""
    chunks = details.get("chunks") or [details]
    early = any(int((c.get("stream") or {}).get("windows_before_finish") or 0) > 0 for c in chunks)
    return {DECODED_BEFORE_FINISH} if early else set()


STREAMED = Exercise(
    "the streaming transcriber decodes at least one window from feed(), before finish() (a clip over 30 s)",
    lambda profile: [DECODED_BEFORE_FINISH],
    _decoded_before_finish,
)


def walked_paths(
    profile: Any, scenario: Any, check: str, exercise: Exercise, golden: ScenarioRecord, result: Any
) -> list[str]:
    """The paths of `check` that the oracle's run of `scenario` walked. A path the scenario says
    it exists to walk (its `exercises`, "check: path") and did not is an error: the check
    proved nothing there, whatever it concluded."""
    model, spec = profile.name, profile.scenario_spec(scenario)
    walked = sorted(exercise.walked(golden, spec, result.details))
    wanted = {p.strip() for c, _, p in (e.partition(":") for e in scenario.exercises) if c.strip() == check}
    if wanted - set(walked):
        raise NothingComparedError(
            f"{model}/{scenario.id} exists to walk {check}'s {sorted(wanted - set(walked))} ({exercise.what}); "
            f"the oracle's run of it walked {walked or 'none of its paths'}: {check} proves nothing there "
            f"(its verdict: {result.summary})"
        )
    return walked
