"""The writers gate's refusals (harness/checks/writers.py), with stand-in writers in place of
mlx-whisper's and the in-tree ones: a missing transcript fails, option sets that are not mappings
or none at all are errors, a format a writer did not write is an error naming it; and the
truncation path (harness/checks/exercise_whisper.py) reads only non-negative transcript times."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.checks import exercise_whisper as ew
from harness.checks.writers import FORMATS, check_writers
from harness.errors import OracleError
from harness.records import ScenarioRecord

AUDIO = "clip.wav"
TRANSCRIPT = {"text": " hi", "segments": [{"start": 0.0, "end": 4.02, "text": " hi"}], "language": "en"}
CUE = "00:00.000 --> 00:04.020\nhi\n"


def _writer(formats: Sequence[str] = FORMATS):
    """A stand-in writer: for each option set, `formats` of `clip` with one cue."""

    def write(transcript: Mapping[str, Any], out: Path, audio_name: str, option_sets) -> None:
        for index, _ in enumerate(option_sets):
            folder = out / str(index)
            folder.mkdir(parents=True, exist_ok=True)
            for output_format in formats:
                (folder / Path(audio_name).with_suffix(f".{output_format}")).write_text(CUE)

    return write


def test_a_missing_transcript_fails_naming_the_side(isolated: Path) -> None:
    """No golden or no in-tree transcript: a failure saying which, and nothing is written."""
    never = _writer(())
    golden = check_writers(None, TRANSCRIPT, AUDIO, {}, write_expected=never, write_actual=never)
    assert (golden.passed, golden.summary) == (False, "no golden transcript to write")
    intree = check_writers(TRANSCRIPT, None, AUDIO, {}, write_expected=never, write_actual=never)
    assert (intree.passed, intree.summary) == (False, "no in-tree transcript to write")


def test_an_option_set_that_is_not_a_mapping_is_refused(isolated: Path) -> None:
    """A list of option sets must hold mappings: a bare string is a ValueError naming the keys."""
    with pytest.raises(ValueError, match=r"writer options: expected a mapping of \['highlight_words'.*got 'x'"):
        check_writers(TRANSCRIPT, TRANSCRIPT, AUDIO, ["x"], write_expected=_writer(), write_actual=_writer())


def test_an_empty_list_of_option_sets_is_refused(isolated: Path) -> None:
    """An empty list would compare nothing: an error, not a pass over zero files."""
    with pytest.raises(ValueError, match="writer options: expected at least one option set"):
        check_writers(TRANSCRIPT, TRANSCRIPT, AUDIO, [], write_expected=_writer(), write_actual=_writer())


def test_a_format_the_writer_did_not_write_is_an_error_naming_it(isolated: Path) -> None:
    """The in-tree side wrote every format but srt: an OracleError naming srt and its path."""
    without_srt = _writer([f for f in FORMATS if f != "srt"])
    with pytest.raises(OracleError, match=r"writers: no srt output .*clip\.srt"):
        check_writers(TRANSCRIPT, TRANSCRIPT, AUDIO, [{}], write_expected=_writer(), write_actual=without_srt)


def test_every_format_written_alike_passes_with_the_cue_times(isolated: Path) -> None:
    """The contrast: both sides write all five formats alike; the oracle's cue times are kept."""
    result = check_writers(TRANSCRIPT, TRANSCRIPT, AUDIO, [{}], write_expected=_writer(), write_actual=_writer())
    assert result.passed and result.summary.startswith("5 files identical")
    assert result.details["oracle_cue_ms"] == [0, 4020]


def _golden(segments: list[dict[str, Any]]) -> ScenarioRecord:
    record = ScenarioRecord("s", None, [1], [2], np.zeros((1, 1), np.float32), [2])
    record.extra["transcript"] = {"text": "", "segments": segments, "language": "en"}
    return record


def test_negative_transcript_times_are_not_read_as_written_cues() -> None:
    """A negative time is skipped, while 4.02 s (4019.999... ms, truncated to 4019) still counts."""
    golden = _golden([{"start": -4.02, "end": -1.0}, {"start": 1.5, "end": 4.02}])
    assert ew.truncation_visible_times(golden, {"oracle_cue_ms": [1500, 4020]}) == [4.02]
    assert ew.truncation_visible_times(_golden([{"start": -4.02, "end": -1.0}]), {"oracle_cue_ms": [4020]}) == []
