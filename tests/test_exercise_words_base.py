"""Whisper base walks the two paths of Whisper's word timing and writers (issue 31 part 1) on its
own fox-pause-words (profiles/whisper-base.yaml; fixtures/audio/fox-pause-base.wav, 2.02 s of
silence before fox.wav: base's alignment differs from tiny.en's, whose 1.74 s clip ends base's
first word at the 3x edge). Without it the nightly profile's scenarios judged by `transcript` and
`writers` (fox-words, long-words) walk neither, and `make nightly` reports "nothing exercised"
for both. The machinery itself is tests/test_exercise_words.py's; here: that base's golden walks
both, and that the two faults (harness/tools/mutant_faults_whisper.py) change what it gives.

Read from the tracked manifests of the CPU key the goldens were made on (the oracle's
transcripts; no blob, no model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.checks import exercise_whisper as ew
from harness.paths import REPO_ROOT
from harness.records import ScenarioRecord

MODEL = "whisper-base"
GOLDENS = REPO_ROOT / "goldens" / MODEL / "cpu-x86-64-refblas-3.10.0-mlx0.32.4"
PAUSE, WORDS = "fox-pause-words", "fox-words"


def _golden(scenario_id: str) -> ScenarioRecord:
    manifest = json.loads((GOLDENS / f"{scenario_id}.json").read_text())
    return ScenarioRecord.from_meta(manifest["record"], np.zeros((0, 1), np.float32), scenario_id)


@pytest.fixture(scope="module")
def profile():
    from harness.session import ParitySession

    return ParitySession().profile(MODEL)


@pytest.mark.parametrize(("scenario_id", "walked"), [(PAUSE, {ew.PAUSE_BOUNDARY}), (WORDS, set())])
def test_the_pause_path_is_walked_by_fox_pause_words_only(profile, scenario_id: str, walked: set[str]) -> None:
    spec = profile.scenario_spec(profile.scenario(scenario_id))
    assert ew.TRANSCRIPT.walked(_golden(scenario_id), spec, {}) == walked


def test_the_first_word_and_its_bound(profile) -> None:
    """The first word, " A", 0.00-2.22 s from the start; the bound on the window's median is the
    0.7 s cap (six unchanged words 0.42-0.70 s, four unknowns: first, second and last word, one
    "."), so the word is over 2 x 0.7 s long and ends over 3 x 0.7 s after the last speech.
    (mlx-whisper's median there was 0.62 s: 3x 1.86 s, 4x 2.48 s.)"""
    spec = profile.scenario_spec(profile.scenario(PAUSE))
    (found,) = ew.kept_first_words_after_a_pause(_golden(PAUSE), spec)
    assert (found["word"], found["start"], found["end"], found["last_speech"]) == (" A", 0.0, 2.22, 0.0)
    assert found["median_at_most"] == pytest.approx(0.7)
    assert 3 * found["median_at_most"] < 2.22


def test_the_pause_fault_cuts_the_kept_word_at_every_median_the_golden_allows() -> None:
    """Every median m the golden is consistent with (at most the 0.7 s bound; at least 2.22 / 4,
    since the rule kept the word): the in-tree rule keeps " A", the 3x fault cuts it."""
    import models.whisper.timing as timing
    from harness.tools.mutant_faults_whisper import word_pause_at_3x

    words = _golden(PAUSE).extra["transcript"]["segments"][0]["words"][:2]
    for m in np.linspace(2.22 / 4, 0.7, 30):
        kept = [dict(w) for w in words]
        timing._trim_after_pause(kept, 0.0, float(m), 2 * float(m))
        assert kept == words, m
        with word_pause_at_3x():
            cut = [dict(w) for w in words]
            timing._trim_after_pause(cut, 0.0, float(m), 2 * float(m))
        assert cut[0]["start"] > 0.0 and cut[0]["end"] - cut[0]["start"] <= 2 * m + 1e-9, (m, cut)


@pytest.fixture(scope="module")
def cue_ms() -> dict[str, list[int]]:
    """What mlx-whisper's writers (the oracle venv) put on the cues of each golden's transcript."""
    from harness.checks.writers import check_writers

    out = {}
    for scenario_id in (PAUSE, WORDS):
        transcript = _golden(scenario_id).extra["transcript"]
        result = check_writers(transcript, transcript, f"{scenario_id}.wav", {})
        assert result.passed, result.summary
        out[scenario_id] = result.details["oracle_cue_ms"]
    return out


@pytest.mark.slow  # the oracle venv's writers
def test_the_truncation_path_is_walked_by_fox_pause_words_only(cue_ms: dict[str, list[int]]) -> None:
    assert 4060 in cue_ms[PAUSE]  # " fox" / " jumps" meet at 4.06 s
    assert ew.truncation_visible_times(_golden(PAUSE), {"oracle_cue_ms": cue_ms[PAUSE]}) == [4.06]
    assert ew.WRITERS.walked(_golden(PAUSE), {}, {"oracle_cue_ms": cue_ms[PAUSE]}) == {ew.TRUNCATION_VISIBLE}
    assert ew.WRITERS.walked(_golden(WORDS), {}, {"oracle_cue_ms": cue_ms[WORDS]}) == set()


@pytest.mark.slow  # the oracle venv's writers
def test_truncated_milliseconds_fail_the_writers_gate_on_fox_pause_words() -> None:
    """The writer fault, the in-tree writers on the oracle's transcript: the 4.06 s cue is written
    00:04.059 (vtt) / 00:00:04,059 (srt); fox-words has no such time and passes."""
    from tests.test_exercise_words import assert_truncation_caught_only_on_pause

    assert_truncation_caught_only_on_pause(_golden, PAUSE, WORDS, "04.060", "04.059")
