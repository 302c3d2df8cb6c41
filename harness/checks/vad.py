"""The VAD checks of one fixture (input, probabilities, segments[<option set>], streaming; the
registry says what each compares), and a profile's run inside `make parity`.

`segments` proves something only where the package found speech (issue 31 part 1): two empty
lists are identical whatever the in-tree rules do. Its path, "at least one segment", is read
from the oracle's segments of each option set; a fixture the profile declares as speech
(`speech:`) that walked none is an ERROR, "nothing exercised", and over the profile each option
set must be walked by some fixture (`segments_coverage`, a coverage line after every run, as
harness/coverage.py gives the model profiles' checks).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.checks import registry
from harness.coverage import SCENARIO as PROFILE_SCENARIO
from harness.coverage import Coverage
from harness.goldens.vad import OracleResult
from harness.implementations import VAD
from harness.paths import FIXTURES_DIR
from harness.profile.vad import VAD_TIER, VadProfile
from harness.report import ItemResult
from harness.runners.vad import STREAM_PIECES, streaming_probabilities


@dataclass
class Check:
    name: str
    passed: bool
    detail: str
    details: dict[str, Any] = field(default_factory=dict)  # the report row's details ("walked")
    nothing_exercised: bool = False  # not a verdict: an ERROR (the comparison proved nothing)


SEGMENTS = "segments"
AT_LEAST_ONE_SEGMENT = "at least one segment"  # the path `segments` walks, per option set
SEGMENTS_WHAT = "the package finds at least one speech segment under the option set"


@dataclass
class FixtureVerdict:
    fixture: str
    chunks: int
    max_abs_diff: float
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def gate_fixture(
    profile: VadProfile,
    model: Any,
    oracle: OracleResult,
    options: dict[str, dict[str, Any]] | None = None,
    check_streaming: bool = True,
) -> FixtureVerdict:
    """Judge one fixture; `options` overrides the in-tree side's option sets (tests perturb it)."""
    from models.vad import SpeechTimestampOptions, read_wav, speech_segments

    audio = read_wav(FIXTURES_DIR / oracle.fixture)
    probs = np.asarray(model.probabilities(audio), dtype=np.float32)
    checks = []
    sha = hashlib.sha256(audio.tobytes()).hexdigest()
    same_input = sha == oracle.samples_sha256 and probs.shape == oracle.probs.shape
    checks.append(
        Check(
            "input",
            same_input,
            f"samples sha256 {sha[:12]} vs oracle {oracle.samples_sha256[:12]}; chunks {probs.shape[0]} vs "
            f"oracle {oracle.probs.shape[0]}",
        )
    )
    if not same_input:
        return FixtureVerdict(oracle.fixture, int(probs.shape[0]), float("nan"), checks)
    diff = np.abs(probs.astype(np.float64) - oracle.probs.astype(np.float64))
    max_diff = float(diff.max()) if diff.size else 0.0
    bad = np.flatnonzero(~(diff <= profile.probability_tolerance))
    if bad.size:
        k = int(bad[np.argmax(diff[bad])])
        detail = (
            f"{bad.size}/{diff.size} chunks over tolerance {profile.probability_tolerance:g}; worst chunk {k} "
            f"(samples {512 * k}..{512 * k + 512}): mlx {probs[k]!r} vs package {oracle.probs[k]!r}, "
            f"|d| {diff[k]:.3g}; first over tolerance: chunk {int(bad[0])}"
        )
    else:
        k = int(np.argmax(diff)) if diff.size else 0
        detail = f"max |d| {max_diff:.3g} at chunk {k} <= tolerance {profile.probability_tolerance:g}"
    checks.append(Check("probabilities", not bad.size, detail))
    for name, values in (options or profile.timestamp_options).items():
        mine = [s.as_dict() for s in speech_segments(probs.tolist(), audio.shape[0], SpeechTimestampOptions(**values))]
        theirs = oracle.segments[name]
        walked = {"walked": [AT_LEAST_ONE_SEGMENT] if theirs else []}
        if mine == theirs:
            checks.append(Check(f"segments[{name}]", True, f"{len(mine)} segment(s) identical", walked))
        else:
            first = next(
                (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs))
            )
            checks.append(
                Check(
                    f"segments[{name}]",
                    False,
                    f"{len(mine)} segment(s) vs package {len(theirs)}; first difference at segment {first}: "
                    f"mlx {mine[first] if first < len(mine) else None} vs package "
                    f"{theirs[first] if first < len(theirs) else None}",
                    walked,
                )
            )
        if oracle.fixture in profile.speech and not theirs:
            verdict = checks[-1]
            checks[-1] = Check(
                verdict.name,
                False,
                f"nothing exercised: {profile.name}/{oracle.fixture} {verdict.name}: 0 segments on a speech fixture "
                f"(the profile's `speech`): the package found no speech there under option set {name!r}, so "
                f"segments compared nothing the rules decide (its verdict: {verdict.detail})",
                walked,
                nothing_exercised=True,
            )
    if check_streaming:
        streamed = streaming_probabilities(model, audio)
        equal = streamed.shape == probs.shape and np.array_equal(streamed.view(np.uint32), probs.view(np.uint32))
        if equal:
            detail = f"{streamed.shape[0]} chunks bit-identical (fed in pieces of {STREAM_PIECES} samples)"
        elif streamed.shape != probs.shape:
            detail = f"streaming gave {streamed.shape[0]} chunks, batch {probs.shape[0]}"
        else:
            k = int(np.flatnonzero(streamed.view(np.uint32) != probs.view(np.uint32))[0])
            detail = f"first differing chunk {k}: streaming {streamed[k]!r} vs batch {probs[k]!r}"
        checks.append(Check("streaming", equal, detail))
    return FixtureVerdict(oracle.fixture, int(probs.shape[0]), max_diff, checks)


def vad_checks(profile: VadProfile) -> list[str]:
    """The checks of every fixture, in the registry's order (gate_fixture's): segments once per option set."""
    names = registry.of(VAD)
    return [n for c in names for n in ([f"{c}[{o}]" for o in profile.timestamp_options] if c == "segments" else [c])]


def segments_coverage(profile: VadProfile, walked: dict[tuple[str, str], list[str]]) -> Coverage:
    """`segments` judged over the profile: `walked` maps (fixture, option set) to the paths that
    fixture's segments[<option set>] walked, for those judged (a fixture not run, or whose check
    erred, is absent). Every option set walked by some fixture: a coverage line naming them; one
    walked by none, every fixture judged: an ERROR row "nothing exercised"; otherwise "not judged"."""
    options = list(profile.timestamp_options)
    walked_by = {
        f"{SEGMENTS}[{o}]": [f for f in profile.fixtures if AT_LEAST_ONE_SEGMENT in walked.get((f, o), [])]
        for o in options
    }
    said = "; ".join(f"{p}: {', '.join(who) if who else 'not walked'}" for p, who in walked_by.items())
    head = f"exercise {profile.name} {SEGMENTS} ({AT_LEAST_ONE_SEGMENT})"
    missing = [p for p, who in walked_by.items() if not who]
    if not missing:
        return Coverage(profile.name, SEGMENTS, f"{head}: {said}", None)
    unjudged = sorted({f for f in profile.fixtures for o in options if (f, o) not in walked})
    if unjudged:
        why = f"{len(unjudged)} fixture(s) not run or without a result ({', '.join(unjudged[:5])})"
        return Coverage(profile.name, SEGMENTS, f"{head}: {said} (not judged: {why})", None)
    summary = (
        f"nothing exercised: no fixture of {profile.name} walked {', '.join(repr(p) for p in missing)} "
        f"({SEGMENTS_WHAT}); its fixtures: {', '.join(profile.fixtures)}, of which speech: "
        f"{', '.join(profile.speech) or 'none'}. segments passed nothing there: add a fixture with speech "
        "and name it in the profile's `speech`"
    )
    row = ItemResult(
        model=profile.name,
        scenario=PROFILE_SCENARIO,
        check=SEGMENTS,
        tier=VAD_TIER,
        oracle=profile.oracle,
        outcome="error",
        summary=summary,
        details={"not_walked": missing, "walked_by": walked_by},
    )
    return Coverage(profile.name, SEGMENTS, f"{head}: {said} (NOTHING EXERCISED)", row)


def walked_segments(rows: list[Any], profile: VadProfile) -> dict[tuple[str, str], list[str]]:
    """(fixture, option set) -> walked paths, from report rows (ItemResult) or FixtureVerdicts."""
    out: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if isinstance(row, FixtureVerdict):
            pairs = [(row.fixture, c.name, c.details) for c in row.checks]
        elif row.model == profile.name:
            pairs = [(row.scenario, row.check, row.details)]
        else:
            continue
        for fixture, name, details in pairs:
            if name.startswith(f"{SEGMENTS}[") and "walked" in details:
                out[(fixture, name[len(SEGMENTS) + 1 : -1])] = list(details["walked"])
    return out
