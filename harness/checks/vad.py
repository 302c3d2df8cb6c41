"""The VAD checks of one fixture (input, probabilities, segments[<option set>], streaming; the
registry says what each compares), and a profile's run inside `make parity`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.artifacts.vad import resolve_vad_weights
from harness.checks import registry
from harness.checks.registry import VAD
from harness.errors import (
    NothingComparedError,
)
from harness.goldens.vad import OracleResult, ensure_goldens
from harness.paths import FIXTURES_DIR
from harness.profile.vad import VadProfile
from harness.runners.vad import STREAM_PIECES, streaming_probabilities


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


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
        if mine == theirs:
            checks.append(Check(f"segments[{name}]", True, f"{len(mine)} segment(s) identical"))
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
                )
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


class VadRun:
    """One VAD profile's run in a parity session: the in-tree model loaded once, the goldens
    made or read once (a stale one is an error, as everywhere), each fixture judged once."""

    def __init__(self, profile: VadProfile, fixtures: list[str]):
        self.profile = profile
        self.fixtures = fixtures  # the fixtures this run judges (their goldens are made together)
        self._model: Any = None
        self._goldens: dict[str, OracleResult] | None = None
        self._verdicts: dict[str, FixtureVerdict] = {}

    def check(self, fixture: str, name: str) -> Check:
        if fixture not in self._verdicts:
            from models.vad import load_model

            if self._model is None:
                self._model = load_model(resolve_vad_weights(self.profile))
            if self._goldens is None:
                self._goldens = ensure_goldens(self.profile, sorted(set(self.fixtures) | {fixture}))
            elif fixture not in self._goldens:
                self._goldens |= ensure_goldens(self.profile, [fixture])
            self._verdicts[fixture] = gate_fixture(self.profile, self._model, self._goldens[fixture])
        verdict = self._verdicts[fixture]
        found = next((c for c in verdict.checks if c.name == name), None)
        if found is None:
            failed = next((c for c in verdict.checks if not c.passed), None)
            raise NothingComparedError(
                f"{self.profile.name}/{fixture} {name}: not compared"
                + (f": {failed.name} failed first ({failed.detail})" if failed else "")
            )
        return found
