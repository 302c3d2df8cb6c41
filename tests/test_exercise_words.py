"""Whisper's word timing and writers prove they walked what the audit's faults change (issue 31
part 1): `transcript` declares a long first word ending 3x to 4x the median word duration after
the last speech (mlx-whisper's pause rule keeps it at 4x, a 3x rule cuts it) and `writers` a
written time whose milliseconds rounding and truncation tell apart (harness/checks/
exercise_whisper.py). fox-pause-words (fixtures/audio/fox-pause.wav) walks both; fox-words walks
neither, and without fox-pause-words the CI profile's make-test scenarios leave both "nothing
exercised". The faults themselves (harness/tools/mutant_faults_whisper.py) are judged by
`make mutants` (a transcription each); here: the writers fault through the writers gate on the
goldens' transcripts, and the pause fault's copy of the rule against the in-tree one.

Read from the tracked manifests of the CPU key the goldens were made on (the oracle's
transcripts; no blob, no model): the paths are facts of those records, whatever machine reads
them."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import numpy as np
import pytest

from harness.checks import exercise_whisper as ew
from harness.checks.compare import CheckResult
from harness.paths import REPO_ROOT
from harness.records import ScenarioRecord

MODEL = "whisper-tiny-en"
GOLDENS = REPO_ROOT / "goldens" / MODEL / "cpu-x86-64-refblas-3.10.0-mlx0.32.4"
PAUSE, WORDS = "fox-pause-words", "fox-words"
EOT = 50256


def _golden(scenario_id: str) -> ScenarioRecord:
    manifest = json.loads((GOLDENS / f"{scenario_id}.json").read_text())
    return ScenarioRecord.from_meta(manifest["record"], np.zeros((0, 1), np.float32), scenario_id)


def _record(segments: list[dict[str, Any]]) -> ScenarioRecord:
    record = ScenarioRecord("s", None, [EOT + 1], [EOT], np.zeros((1, 1), np.float32), [EOT])
    record.extra["transcript"] = {"text": "", "segments": segments, "language": "en"}
    return record


@pytest.fixture(scope="module")
def profile():
    from harness.session import ParitySession

    return ParitySession().profile(MODEL)


@pytest.fixture(scope="module")
def cue_ms() -> dict[str, list[int]]:
    """What mlx-whisper's writers (the oracle venv) put on the cues of each golden's transcript,
    over every option set of the writers gate, as the gate records it."""
    from harness.checks.writers import check_writers

    out = {}
    for scenario_id in (PAUSE, WORDS):
        transcript = _golden(scenario_id).extra["transcript"]
        result = check_writers(transcript, transcript, f"{scenario_id}.wav", {})
        assert result.passed, result.summary
        out[scenario_id] = result.details["oracle_cue_ms"]
    return out


# -- transcript: the pause rule ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario_id", "walked"),
    [(PAUSE, {ew.PAUSE_BOUNDARY}), (WORDS, set()), ("weather-ladder", set()), ("fox-greedy", set())],
)
def test_the_pause_path_is_read_from_the_oracles_words(profile, scenario_id: str, walked: set[str]) -> None:
    spec = profile.scenario_spec(profile.scenario(scenario_id))
    assert ew.TRANSCRIPT.walked(_golden(scenario_id), spec, {}) == walked


def test_the_pause_scenarios_first_word_and_its_bound(profile) -> None:
    """fox-pause-words: " The" 0.00-2.32 s from the start; the window's median is at most 0.66 s
    (six unchanged words 0.48-0.68 s, four unknowns: first, second and last word, one "."), so
    the word is over 2 x 0.66 s long and ends over 3 x 0.66 s after the last speech."""
    spec = profile.scenario_spec(profile.scenario(PAUSE))
    (found,) = ew.kept_first_words_after_a_pause(_golden(PAUSE), spec)
    assert (found["word"], found["start"], found["end"], found["last_speech"]) == (" The", 0.0, 2.32, 0.0)
    assert found["median_at_most"] == pytest.approx(0.66)
    assert 3 * found["median_at_most"] < 2.32


def _words(times: list[tuple[float, float]], names: str = "abcdefghij") -> list[dict[str, Any]]:
    return [{"word": f" {names[i]}", "start": s, "end": e, "probability": 0.9} for i, (s, e) in enumerate(times)]


def _segment(seek: int, words: list[dict[str, Any]], tokens: int | None = None) -> dict[str, Any]:
    n = len(words) if tokens is None else tokens
    return {
        "seek": seek,
        "start": words[0]["start"] if words else 0.0,
        "end": words[-1]["end"] if words else 0.0,
        "text": " x",
        "tokens": [EOT + 107, *range(100, 100 + n), EOT + 200],
        "words": words,
    }


# A first word of 2.0 s, then six of 0.5 s: the bound is the median of four known 0.5 s and three
# unknowns (first, second, last word) as +inf, 0.5.
_LONG_FIRST = [(0.0, 2.0), (2.0, 2.5), (2.5, 3.0), (3.0, 3.5), (3.5, 4.0), (4.0, 4.5), (4.5, 5.0)]


def _chain(durations: list[float], start: float = 0.0) -> list[tuple[float, float]]:
    out = []
    for d in durations:
        out.append((round(start, 2), round(start + d, 2)))
        start += d
    return out


def test_the_bound_counts_changeable_and_merged_words_as_unknown() -> None:
    durations = [2.0, 0.3, 0.4, 0.5, 0.6, 0.35, 0.45, 0.55, 0.65, 0.3]
    # known: words 2..8 (.4 .5 .6 .35 .45 .55 .65); unknown: first, second, last
    assert ew.median_upper_bound([_segment(0, _words(_chain(durations)))], EOT) == pytest.approx(0.575)
    # one more text token than words: one merged-away entry at most, +inf
    assert ew.median_upper_bound([_segment(0, _words(_chain(durations)), tokens=11)], EOT) == pytest.approx(0.6)
    after_stop = _words(_chain(durations))
    after_stop[4]["word"] = " e."  # the next word (0.35 s) may have had its start clipped: unknown
    assert ew.median_upper_bound([_segment(0, after_stop)], EOT) == pytest.approx(0.625)
    zero = _words(_chain(durations))
    zero[6]["end"] = zero[6]["start"]  # a zero duration is left out, as np.median's input leaves it out
    assert ew.median_upper_bound([_segment(0, zero)], EOT) == pytest.approx(0.6)
    mark = _words(_chain(durations))
    mark[3]["word"] = " -"  # no letter or digit: possibly a mark whose end was clipped
    assert ew.median_upper_bound([_segment(0, mark)], EOT) == pytest.approx(0.625)
    # over half unknown: the bound is mlx-whisper's cap
    assert ew.median_upper_bound([_segment(0, _words(_chain(durations)), tokens=20)], EOT) == 0.7


@pytest.mark.parametrize(
    ("first_end", "walked"),
    [
        (1.49, False),  # 1.49 s <= 3 x 0.5: no pause for a 3x rule either
        (1.51, True),  # over 3 x 0.5 and over 2 x 0.5 long
        (2.0, True),
    ],
)
def test_the_pause_must_exceed_three_bounds(first_end: float, walked: bool) -> None:
    times = [(0.0, first_end)] + [(first_end + 0.5 * i, first_end + 0.5 * (i + 1)) for i in range(6)]
    spec = {"options": {"word_timestamps": True}}
    assert bool(ew.TRANSCRIPT.walked(_record([_segment(0, _words(times))]), spec, {})) is walked


def test_a_cut_word_an_emptied_segment_or_hallucination_skipping_walk_nothing() -> None:
    spec = {"options": {"word_timestamps": True}}
    cut = [(1.0, 2.0)] + _LONG_FIRST[1:]  # 1.0 s = 2 x 0.5: what the rule leaves, not a kept long word
    assert ew.TRANSCRIPT.walked(_record([_segment(0, _words(cut))]), spec, {}) == set()
    long_first = _segment(0, _words(_LONG_FIRST))
    assert ew.TRANSCRIPT.walked(_record([long_first]), spec, {}) == {ew.PAUSE_BOUNDARY}
    emptied = _segment(0, [])
    emptied["words"] = []
    # the same window with an emptied segment (its words are gone): its median is unknown
    assert ew.TRANSCRIPT.walked(_record([long_first, emptied]), spec, {}) == set()
    later = dict(long_first, seek=3000)  # the next window: its last speech was in the emptied one
    assert ew.TRANSCRIPT.walked(_record([emptied, later]), spec, {}) == set()
    assert ew.TRANSCRIPT.walked(_record([long_first]), {"options": {}}, {}) == set()  # no word timestamps
    hallucination = {"options": {"word_timestamps": True, "hallucination_silence_threshold": 2.0}}
    assert ew.TRANSCRIPT.walked(_record([long_first]), hallucination, {}) == set()


def test_the_last_speech_is_the_previous_segment_or_window_end() -> None:
    """Bound 0.5 throughout; a next first word 1.5 s long ending 1.5 s (= 3 x 0.5) after the
    previous segment's or window's end is not claimed, one ending 1.6 s after is: so the pause
    is measured from that end, not from the clip's start."""
    spec = {"options": {"word_timestamps": True}}
    opening = _segment(0, _words(_chain([0.5] * 7)))  # ends 3.5
    at_three = _segment(0, _words(_chain([1.5] + [0.5] * 6, start=3.5)))  # first word 3.5-5.0
    over_three = _segment(0, _words(_chain([1.6] + [0.5] * 6, start=3.5)))  # first word 3.5-5.1
    assert ew.TRANSCRIPT.walked(_record([opening, at_three]), spec, {}) == set()
    assert ew.TRANSCRIPT.walked(_record([opening, over_three]), spec, {}) == {ew.PAUSE_BOUNDARY}
    assert ew.TRANSCRIPT.walked(_record([opening, dict(at_three, seek=350)]), spec, {}) == set()
    assert ew.TRANSCRIPT.walked(_record([opening, dict(over_three, seek=350)]), spec, {}) == {ew.PAUSE_BOUNDARY}


def _simulate(rng: random.Random, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], bool]:
    """One window through the in-tree add_word_timestamps (mlx-whisper's, gated) on a random
    alignment: contiguous entries on the 0.02 s grid, some words followed by a "." or "," entry
    (merged into them; a blip or a long one), some preceded by a ' "' entry. Returns the
    segments and whether a first word really was too long and ended 3m to 4m after the last
    speech (m as the rule computed it)."""
    import models.whisper.timing as timing

    entries: list[timing.WordTiming] = []
    segments = []
    token = 100
    frame = rng.randint(0, 40)
    for _ in range(rng.randint(1, 3)):
        tokens = []
        for _ in range(rng.randint(2, 12)):
            parts = ([' "'] if rng.random() < 0.1 else []) + [" w"] + ([rng.choice(".,")] if rng.random() < 0.3 else [])
            for text in parts:
                ids = list(range(token, token + (2 if text == " w" and rng.random() < 0.3 else 1)))
                token += len(ids)
                tokens += ids
                if text == " w":
                    length = rng.randint(5, 120 if rng.random() < 0.3 else 40)
                else:  # a mark: often a blip, sometimes the pause after it
                    length = rng.choice([0, 1, 2, 3]) if rng.random() < 0.5 else rng.randint(20, 80)
                entries.append(
                    timing.WordTiming(text, ids, np.float64(frame) / 50, np.float64(frame + length) / 50, 0.9)
                )
                frame += length
        segments.append({"seek": 0, "start": 0.0, "end": 0.0, "text": " w", "tokens": [EOT + 107, *tokens]})
    for segment in segments:  # segment timestamps somewhere near the words
        segment["start"], segment["end"] = round(rng.uniform(0, frame / 50), 2), round(frame / 50, 2)
    facts = []

    def watched(words, last, median, maximum):
        first = words[0]
        too_long = first["end"] - first["start"] > maximum or (
            len(words) > 1 and words[1]["end"] - first["start"] > maximum * 2
        )
        facts.append(too_long and median * 3 < first["end"] - last <= median * 4)
        return trim(words, last, median, maximum)

    trim = timing._trim_after_pause
    monkeypatch.setattr(timing, "find_alignment", lambda *a, **k: [dataclasses.replace(e) for e in entries])
    monkeypatch.setattr(timing, "_trim_after_pause", watched)
    tokenizer = type("T", (), {"eot": EOT})()
    timing.add_word_timestamps(
        segments=segments, model=None, tokenizer=tokenizer, mel=None, num_frames=3000, last_speech_timestamp=0.0
    )
    monkeypatch.setattr(timing, "_trim_after_pause", trim)
    return segments, any(facts)


def test_the_pause_path_is_never_claimed_where_the_rule_did_not_see_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Soundness against the rule itself, on 3,000 random windows: whenever the path is read as
    walked from the words a window ended with, its rule had a too-long first word ending 3m to 4m
    after the last speech. (And the reading is not vacuous: it finds some.)"""
    rng = random.Random(31)
    spec = {"options": {"word_timestamps": True}}
    claimed = true = 0
    for _ in range(3000):
        segments, walked = _simulate(rng, monkeypatch)
        if not all(s["words"] for s in segments):
            continue
        claim = bool(ew.TRANSCRIPT.walked(_record(segments), spec, {}))
        assert walked or not claim, segments
        claimed += claim
        true += walked
    assert claimed >= 20 and true >= claimed, (claimed, true)


# -- writers: milliseconds rounded, not truncated ------------------------------------------------


@pytest.mark.slow  # the oracle venv's writers
def test_the_truncation_path_is_read_from_the_oracles_cues(cue_ms: dict[str, list[int]]) -> None:
    assert 4020 in cue_ms[PAUSE]  # " fox" / " jumps" meet at 4.02 s
    assert ew.truncation_visible_times(_golden(PAUSE), {"oracle_cue_ms": cue_ms[PAUSE]}) == [4.02]
    assert ew.WRITERS.walked(_golden(PAUSE), {}, {"oracle_cue_ms": cue_ms[PAUSE]}) == {ew.TRUNCATION_VISIBLE}
    assert ew.WRITERS.walked(_golden(WORDS), {}, {"oracle_cue_ms": cue_ms[WORDS]}) == set()
    # a cue time only: 4.02 s in the transcript but not written walks nothing
    assert ew.WRITERS.walked(_golden(PAUSE), {}, {"oracle_cue_ms": [t for t in cue_ms[PAUSE] if t != 4020]}) == set()
    assert ew.WRITERS.walked(_golden(PAUSE), {}, {}) == set()


def test_a_written_time_from_two_sources_counts_only_if_both_truncate_differently() -> None:
    words = _words([(0.0, 4.02), (4.02, 4.5)])
    record = _record([_segment(0, words)])
    assert ew.truncation_visible_times(record, {"oracle_cue_ms": [4020]}) == [4.02]
    words[1]["start"] = 4.0200000000000005  # the same millisecond, and int() keeps it
    assert int(4.0200000000000005 * 1000.0) == 4020
    assert ew.truncation_visible_times(record, {"oracle_cue_ms": [4020]}) == []


@pytest.mark.slow  # the oracle venv's writers
def test_truncated_milliseconds_fail_the_writers_gate_only_where_the_path_is_walked() -> None:
    """The audit's writer fault through the writers gate, the in-tree writers on the oracle's
    transcript: fox-pause-words' 4.02 s cue is written 00:04.019 (vtt) / 00:00:04,019 (srt);
    fox-words has no such time and passes."""
    assert_truncation_caught_only_on_pause(_golden, PAUSE, WORDS, "04.020", "04.019")


def assert_truncation_caught_only_on_pause(golden_of, pause: str, words: str, rounded: str, truncated: str) -> None:
    """The writers gate under the truncation fault, the in-tree writers on each oracle transcript:
    `pause` fails on vtt and srt at the cue `rounded` written `truncated`; `words` passes."""
    from harness.checks.writers import check_writers
    from harness.tools.mutant_faults_whisper import timestamp_ms_truncated

    with timestamp_ms_truncated():
        results = {
            sid: check_writers(t, t, f"{sid}.wav", {})
            for sid in (pause, words)
            for t in [golden_of(sid).extra["transcript"]]
        }
    assert not results[pause].passed, results[pause].summary
    assert {d.split(" ")[0] for d in results[pause].details["differing"]} == {"vtt", "srt"}
    assert truncated in results[pause].details["first_diff"]["actual_line"]
    assert rounded in results[pause].details["first_diff"]["expected_line"]
    assert results[words].passed, results[words].summary


def test_the_faults_change_only_what_they_name() -> None:
    """The pause fault's rule equals the in-tree one except for a too-long first word ending 3m
    to 4m after the last speech; the truncating formatter equals the in-tree one except on the
    times int() and round() tell apart."""
    import models.whisper.timing as timing
    import models.whisper.writers as writers
    from harness.tools.mutant_faults_whisper import timestamp_ms_truncated, word_pause_at_3x

    rng = random.Random(3)
    inside = 0
    for _ in range(2000):
        m = rng.choice([0.3, 0.45, 0.61, 0.7])
        first = {"start": round(rng.uniform(0.1, 3), 2)}
        first["end"] = round(first["start"] + rng.uniform(0.05, 3), 2)
        second = {"start": first["end"], "end": round(first["end"] + rng.uniform(0.05, 2), 2)}
        last = round(rng.uniform(0, first["end"]), 2)
        words = [first, second]
        expected = [dict(w) for w in words]
        timing._trim_after_pause(expected, last, m, 2 * m)
        with word_pause_at_3x():
            faulty = [dict(w) for w in words]
            timing._trim_after_pause(faulty, last, m, 2 * m)
        too_long = first["end"] - first["start"] > 2 * m or second["end"] - first["start"] > 4 * m
        band = too_long and m * 3 < first["end"] - last <= m * 4
        assert (faulty != expected) is band, (words, last, m)
        inside += band
    assert inside > 50
    assert timing._trim_after_pause.__module__ == "models.whisper.timing"  # put back
    times = [k / 100 for k in range(3000)]
    with timestamp_ms_truncated():
        truncated = [writers.format_timestamp(t) for t in times]
    rounded = [writers.format_timestamp(t) for t in times]
    differ = [t for t, a, b in zip(times, truncated, rounded, strict=True) if a != b]
    assert differ == [t for t in times if int(t * 1000.0) != round(t * 1000.0)] and len(differ) == 18


# -- over the profile ----------------------------------------------------------------------------


def _wired(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's transcript and writers rows with these exercises (as registry.py wires them)."""
    from harness.checks import registry

    wired = {"transcript": ew.TRANSCRIPT, "writers": ew.WRITERS}
    table = tuple(dataclasses.replace(c, exercises=wired.get(c.name, c.exercises)) for c in registry._TABLE)
    monkeypatch.setattr(registry, "_TABLE", table)
    monkeypatch.setattr(registry, "CHECKS", {c.name: c for c in table})


def _rows(profile, scenarios, cue_ms: dict[str, list[int]]):
    """Every make-test row of transcript and writers, with what the real records walked."""
    from harness.report import ItemResult

    rows = []
    for scenario in scenarios:
        spec = profile.scenario_spec(scenario)
        for check, exercise in (("transcript", ew.TRANSCRIPT), ("writers", ew.WRITERS)):
            if check in profile.checks(scenario):
                details = {"oracle_cue_ms": cue_ms[scenario.id]} if check == "writers" else {}
                walked = sorted(exercise.walked(_golden(scenario.id), spec, details))
                rows.append(
                    ItemResult(MODEL, scenario.id, check, "L1", "mlx-whisper", "passed", "", details={"walked": walked})
                )
    return rows


@pytest.mark.slow  # the oracle venv's writers
def test_without_fox_pause_words_both_paths_are_nothing_exercised(
    profile, cue_ms: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.coverage import judge_coverage

    _wired(monkeypatch)
    make_test = [s for s in profile.scenarios if "nightly" not in s.tags and profile.oracle_of(s) == "mlx-whisper"]
    assert PAUSE in {s.id for s in make_test}
    with_it = dataclasses.replace(profile, scenarios=make_test)
    judged = {c.check: c for c in judge_coverage([with_it], _rows(profile, make_test, cue_ms), "cpu")}
    assert judged["transcript"].row is None and judged["transcript"].line.endswith(f"{ew.PAUSE_BOUNDARY}: {PAUSE}")
    assert judged["writers"].row is None and judged["writers"].line.endswith(f"{ew.TRUNCATION_VISIBLE}: {PAUSE}")

    # Without it, the make-test scenarios plus fox-words (tagged nightly for make test's budget:
    # word timestamps on a clip that walks neither path) leave both paths nothing exercised.
    without = [s for s in make_test if s.id != PAUSE] + [s for s in profile.scenarios if s.id == WORDS]
    assert WORDS in {s.id for s in without}
    lacking = dataclasses.replace(profile, scenarios=without)
    judged = {c.check: c for c in judge_coverage([lacking], _rows(profile, without, cue_ms), "cpu")}
    for check, path in (("transcript", ew.PAUSE_BOUNDARY), ("writers", ew.TRUNCATION_VISIBLE)):
        row = judged[check].row
        assert row is not None and row.outcome == "error" and row.scenario == "(profile)", judged[check].line
        assert row.summary.startswith(f"nothing exercised: no scenario of {MODEL} walked {path!r}"), row.summary


@pytest.mark.slow  # the oracle venv's writers
def test_fox_pause_words_claims_what_it_walks(profile, cue_ms: dict[str, list[int]]) -> None:
    """Its `exercises:` claim holds on its golden; the same claim on fox-words' record is an error."""
    from harness.checks.exercise import walked_paths
    from harness.errors import NothingComparedError

    claims = [f"transcript: {ew.PAUSE_BOUNDARY}", f"writers: {ew.TRUNCATION_VISIBLE}"]
    scenario = dataclasses.replace(profile.scenario(PAUSE), exercises=claims)
    passed = CheckResult("writers", True, "35 files identical")
    passed.details = {"oracle_cue_ms": cue_ms[PAUSE]}
    assert walked_paths(profile, scenario, "transcript", ew.TRANSCRIPT, _golden(PAUSE), passed) == [ew.PAUSE_BOUNDARY]
    assert walked_paths(profile, scenario, "writers", ew.WRITERS, _golden(PAUSE), passed) == [ew.TRUNCATION_VISIBLE]
    passed.details = {"oracle_cue_ms": cue_ms[WORDS]}
    with pytest.raises(NothingComparedError, match=r"fox-pause-words exists to walk transcript's"):
        walked_paths(profile, scenario, "transcript", ew.TRANSCRIPT, _golden(WORDS), passed)
    with pytest.raises(NothingComparedError, match=r"fox-pause-words exists to walk writers's"):
        walked_paths(profile, scenario, "writers", ew.WRITERS, _golden(WORDS), passed)
