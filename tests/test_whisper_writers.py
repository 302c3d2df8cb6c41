"""The writers gate: in-tree txt/vtt/srt/tsv/json bytes equal mlx-whisper's for real results,
for every word option set, and the gate fails (naming format and line) on perturbed writers.

The transcript is mlx-whisper's own: its generator on fox.wav with word timestamps, which is
the profile's fox-words golden. Variants of it are fed to both sides: without words (the
segment path), and every time an hour later (the hours field, a long pause before the first
word).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from harness.checks.writers import (
    FORMATS,
    WORD_OPTION_SETS,
    check_writers,
    first_byte_difference,
    write_oracle,
)
from harness.paths import REPO_ROOT
from models.whisper import writers
from tests.conftest import fox_words_golden

FOX = REPO_ROOT / "fixtures" / "audio" / "fox.wav"
VARIANTS = ("words", "no-words", "an-hour-later")


def without_words(transcript: dict) -> dict:
    out = copy.deepcopy(transcript)
    for segment in out["segments"]:
        segment.pop("words", None)
    return out


def an_hour_later(transcript: dict) -> dict:
    out = copy.deepcopy(transcript)
    for segment in out["segments"]:
        segment["start"] += 3600.0
        segment["end"] += 3600.0
        for word in segment["words"]:
            word["start"] += 3600.0
            word["end"] += 3600.0
    return out


@pytest.fixture(scope="module")
def transcripts() -> dict[str, dict]:
    """mlx-whisper's fox.wav transcript with words (the fox-words golden: the oracle's generator
    on this machine's key, made here when the store has none) and its variants."""
    transcript = fox_words_golden()["transcript"]
    assert sum(len(s["words"]) for s in transcript["segments"]) > 5, "the golden has too few words to judge"
    return {"words": transcript, "no-words": without_words(transcript), "an-hour-later": an_hour_later(transcript)}


@pytest.fixture(scope="module")
def oracle_outputs(transcripts: dict[str, dict], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """mlx-whisper's files for each variant and option set, written once for every test."""
    root = tmp_path_factory.mktemp("writers-oracle")
    folders = {}
    for variant in VARIANTS:
        write_oracle(transcripts[variant], root / variant, FOX.name, WORD_OPTION_SETS)
        folders[variant] = root / variant
    return folders


def cached_oracle(folder: Path):
    def write(transcript, out: Path, audio_name: str, option_sets) -> None:
        shutil.copytree(folder, out, dirs_exist_ok=True)

    return write


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_format_and_option_set_is_byte_identical(variant: str, transcripts, oracle_outputs) -> None:
    result = check_writers(
        transcripts[variant],
        transcripts[variant],
        FOX,
        WORD_OPTION_SETS,
        write_expected=cached_oracle(oracle_outputs[variant]),
    )
    assert result.passed, result.summary
    assert f"{len(FORMATS) * len(WORD_OPTION_SETS)} files identical" in result.summary


@pytest.mark.slow
def test_the_option_sets_change_the_subtitles(oracle_outputs) -> None:
    """Each option set exercises its own path: no two give the same srt."""
    srts = [(oracle_outputs["words"] / str(i) / "fox.srt").read_bytes() for i in range(len(WORD_OPTION_SETS))]
    assert len(set(srts)) == len(srts)
    hour = (oracle_outputs["an-hour-later"] / "0" / "fox.vtt").read_text()
    assert "01:00:0" in hour  # the hours field appears


@pytest.mark.slow
def test_the_gate_runs_the_oracle_itself(transcripts) -> None:
    result = check_writers(transcripts["words"], transcripts["words"], FOX, {"max_line_width": 20, "max_line_count": 2})
    assert result.passed, result.summary


@pytest.mark.slow
def test_a_dot_as_srt_decimal_marker_fails_naming_srt_and_the_line(
    transcripts, oracle_outputs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writers.WriteSRT, "decimal_marker", ".")
    result = check_writers(
        transcripts["words"],
        transcripts["words"],
        FOX,
        WORD_OPTION_SETS,
        write_expected=cached_oracle(oracle_outputs["words"]),
    )
    assert not result.passed
    assert result.details["format"] == "srt", result.summary
    assert result.details["first_diff"]["line"] == 2, result.summary  # the first cue's times
    assert " --> " in result.details["first_diff"]["expected_line"]
    assert (
        "," in result.details["first_diff"]["expected_line"] and "," not in result.details["first_diff"]["actual_line"]
    )
    assert all(d.startswith("srt ") for d in result.details["differing"])  # vtt, txt, tsv, json unaffected


@pytest.mark.slow
def test_a_line_width_off_by_one_fails_naming_a_subtitle_format(
    transcripts, oracle_outputs, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = writers._pack_subtitles

    def one_wider(segments, *, max_line_width, **kwargs):
        return original(segments, max_line_width=max_line_width + 1, **kwargs)

    monkeypatch.setattr(writers, "_pack_subtitles", one_wider)
    result = check_writers(
        transcripts["words"],
        transcripts["words"],
        FOX,
        WORD_OPTION_SETS,
        write_expected=cached_oracle(oracle_outputs["words"]),
    )
    assert not result.passed
    assert result.details["format"] in ("vtt", "srt"), result.summary
    assert "max_line_width" in result.details["options"]
    assert result.summary.startswith(f"{result.details['format']} with options")


@pytest.mark.slow
def test_a_changed_transcript_fails_the_json_and_text_formats(transcripts, oracle_outputs) -> None:
    changed = copy.deepcopy(transcripts["no-words"])
    changed["segments"][0]["text"] = changed["segments"][0]["text"].replace("fox", "cat")
    result = check_writers(
        transcripts["no-words"],
        changed,
        FOX,
        WORD_OPTION_SETS,
        write_expected=cached_oracle(oracle_outputs["no-words"]),
    )
    assert not result.passed
    differing = {d.split(" ")[0] for d in result.details["differing"]}
    assert differing == set(FORMATS)


def test_first_byte_difference_names_offset_line_and_both_lines() -> None:
    expected = b"WEBVTT\n\n00:00.000 --> 00:01.000\nhello\n"
    actual = b"WEBVTT\n\n00:00.000 --> 00:01.000\nhallo\n"
    diff = first_byte_difference(expected, actual)
    assert diff is not None
    assert expected[: diff.offset] == actual[: diff.offset] and expected[diff.offset] != actual[diff.offset]
    assert diff.line == expected[: diff.offset].count(b"\n") + 1
    assert (diff.expected_line, diff.actual_line) == ("hello", "hallo")
    assert first_byte_difference(expected, expected) is None
    shorter = first_byte_difference(expected, expected[:-1])
    assert shorter is not None and shorter.offset == len(expected) - 1


def test_bad_writer_options_and_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        check_writers({"segments": []}, {"segments": []}, FOX, {"max_line_widht": 3})
    with pytest.raises(ValueError, match="output format 'doc'"):
        writers.get_writer("doc", ".")
    with pytest.raises(ValueError, match="non-negative"):
        writers.format_timestamp(-1.0)
