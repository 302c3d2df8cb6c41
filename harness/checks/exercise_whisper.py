"""The paths of Whisper's word timing (`transcript`) and of its `writers` (issue 31 part 1): what a
scenario must make the reference do for the check to prove something, read from the oracle's
record (and, for the writers, from what the oracle's writers wrote, in the check's result).

- transcript, PAUSE_BOUNDARY: mlx-whisper's add_word_timestamps cuts a segment's first word to
  twice the median word duration m (m = min(0.7, median of the window's non-zero alignment
  durations)) when it is too long (over 2m, or with the second word over 4m) and ends more than 4m
  after the last speech (the previous segment's end; the previous window's last word end; 0.0).
  A first word that is too long and ends between 3m and 4m after the last speech is kept: only such
  a word tells the rule's 4x from a 3x (the audit's fault). Read from the golden transcript,
  soundly, although m is not recorded: an upper bound on m (the window's unmodified word durations,
  every alignment entry that may have been modified or merged away counted as +inf), a first word
  longer than twice that bound (a cut one is at most 2m long, and the segment-start rule never
  lengthens it, so it was kept, and so it ended at most 4m after the last speech) ending more than
  three times that bound after the last speech.
- writers, TRUNCATION_VISIBLE: mlx-whisper's writers format a cue time as round(seconds * 1000)
  milliseconds; int() would write another millisecond for 18 of the 3,000 two-decimal times below
  30 s (4.02 s: 4019.9999999999995 ms). Walked when some millisecond the oracle's vtt/srt cues
  carry (`oracle_cue_ms` in the check's details) can only have come from a transcript time that
  truncation changes (every start/end of the golden transcript that rounds to it does).
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import median
from typing import Any

from harness.checks.exercise import Exercise
from harness.records import ScenarioRecord

Walked = Callable[[ScenarioRecord, dict[str, Any], dict[str, Any]], set[str]]

PAUSE_BOUNDARY = "a long first word 3x to 4x the median word duration after the last speech"
TRUNCATION_VISIBLE = "a written time that truncating to milliseconds would change"

MEDIAN_CAP = 0.7  # mlx-whisper: min(0.7, median)
SENTENCE_END_MARKS = ".。!！?？"
_EPS = 1e-6  # word times are rounded to 0.01 s: float noise is ~1e-12


def _word_timestamps(spec: dict[str, Any]) -> bool:
    return bool((spec.get("options") or {}).get("word_timestamps"))


def _declared_pause(profile: Any) -> list[str]:
    """A profile with a word-timestamp scenario judged by `transcript` (mlx-whisper's words)."""
    word_scenarios = [
        s
        for s in profile.scenarios
        if "transcript" in profile.checks(s) and (profile.defaults.options | s.options).get("word_timestamps")
    ]
    return [PAUSE_BOUNDARY] if word_scenarios else []


def _windows(segments: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive segments of one decode window (the same `seek`), in order."""
    out: list[list[dict[str, Any]]] = []
    for segment in segments:
        if out and out[-1][0].get("seek") == segment.get("seek"):
            out[-1].append(segment)
        else:
            out.append([segment])
    return out


def median_upper_bound(window: list[dict[str, Any]], eot: int) -> float:
    """An upper bound on the m add_word_timestamps used for this window (all its segments have
    words). Its alignment has one entry per final word plus the punctuation merged into them; at
    most (text tokens - words) of those (every entry has a token). A word whose duration the
    heuristics may have changed (first, second and last of a segment; one after a sentence end
    mark; one without a letter or digit, possibly a mark itself) is unknown too. Unknowns taken as
    +inf bound the median from above (np.median only grows with any element, and with an element
    added above all others); a known duration of 0 is left out, as the median leaves it out."""
    known: list[float] = []
    tokens = sum(1 for segment in window for t in segment.get("tokens") or [] if int(t) < eot)
    words = [w for segment in window for w in segment["words"]]
    unknown = max(0, tokens - len(words))
    previous = ""
    for segment in window:
        n = len(segment["words"])
        for k, word in enumerate(segment["words"]):
            text = str(word["word"])
            changed = (
                k in (0, 1)
                or k == n - 1
                or previous.endswith(tuple(SENTENCE_END_MARKS))
                or not any(c.isalnum() for c in text)
            )
            duration = float(word["end"]) - float(word["start"])
            if changed:
                unknown += 1
            elif abs(duration) > _EPS:
                known.append(duration)
            previous = text
    values = known + [float("inf")] * unknown
    return min(MEDIAN_CAP, float(median(values))) if values else MEDIAN_CAP


def kept_first_words_after_a_pause(golden: ScenarioRecord, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The segments whose first word the oracle's run kept though it was too long and ended
    between 3m and 4m after the last speech (see the module's docstring), with their facts."""
    transcript = golden.extra.get("transcript") if golden is not None else None
    options = spec.get("options") or {}
    if not transcript or not _word_timestamps(spec) or not golden.eos_ids:
        return []
    if options.get("hallucination_silence_threshold") is not None:
        return []  # windows dropped and segments cut: the last speech is not in the transcript
    eot = min(int(i) for i in golden.eos_ids)
    found = []
    last: float | None = 0.0  # mlx-whisper's last_speech_timestamp before the window (None: unknown)
    for window in _windows(transcript.get("segments") or []):
        if not all(segment.get("words") for segment in window):
            last = None  # an emptied segment's words (and so the last word end) are gone
            continue
        bound = median_upper_bound(window, eot)
        speech = last
        for segment in window:
            words = segment["words"]
            first = words[0]
            duration = float(first["end"]) - float(first["start"])
            # Two words at least: the segment-end rule may move a last word's end.
            if speech is not None and len(words) >= 2 and duration > 2 * bound + _EPS:
                pause = float(first["end"]) - speech
                if pause > 3 * bound + _EPS:
                    found.append(
                        {
                            "seek": segment.get("seek"),
                            "word": first["word"],
                            "start": first["start"],
                            "end": first["end"],
                            "last_speech": speech,
                            "median_at_most": bound,
                        }
                    )
            speech = float(segment["end"])
        last = float(window[-1]["words"][-1]["end"])
    return found


def _walked_when(path: str, found: Callable[[ScenarioRecord, dict[str, Any], dict[str, Any]], list[Any]]) -> Walked:
    """An Exercise's `walked`: {path} when `found` finds an instance of it in the scenario, else nothing."""

    def walked(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
        return {path} if found(golden, spec, details) else set()

    return walked


TRANSCRIPT = Exercise(
    "a segment's first word, longer than twice the median word duration, ends between 3x and 4x the median "
    "after the last speech: mlx-whisper's pause rule (4x) keeps it, a 3x rule would cut it",
    _declared_pause,
    _walked_when(PAUSE_BOUNDARY, lambda golden, spec, details: kept_first_words_after_a_pause(golden, spec)),
)


def _transcript_times(transcript: dict[str, Any]) -> list[float]:
    out = []
    for segment in transcript.get("segments") or []:
        out += [segment["start"], segment["end"]]
        out += [word[k] for word in segment.get("words") or [] for k in ("start", "end")]
    return [float(t) for t in out]


def truncation_visible_times(golden: ScenarioRecord, details: dict[str, Any]) -> list[float]:
    """The oracle's written cue times (milliseconds) that only a time truncation changes can
    have produced, as those times (seconds)."""
    transcript = golden.extra.get("transcript") if golden is not None else None
    written = details.get("oracle_cue_ms")
    if not transcript or not written:
        return []
    by_ms: dict[int, set[float]] = {}
    for t in _transcript_times(transcript):
        if t >= 0:
            by_ms.setdefault(round(t * 1000.0), set()).add(t)
    out = []
    for ms in sorted({int(m) for m in written}):
        sources = by_ms.get(ms)
        if sources and all(int(t * 1000.0) != ms for t in sources):
            out += sorted(sources)
    return out


WRITERS = Exercise(
    "the oracle's vtt/srt cues carry a time whose milliseconds round(seconds * 1000) and int() tell apart "
    "(e.g. 4.02 s: 4020 against 4019)",
    lambda profile: [TRUNCATION_VISIBLE],
    _walked_when(TRUNCATION_VISIBLE, lambda golden, spec, details: truncation_visible_times(golden, details)),
)
