"""The fast path's calibration record: written by measurement, verified on every read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.goldens.calibration import (
    CalibrationError,
    CalibrationRecord,
    StepBound,
    identity_of,
    read_record,
    write_record,
)

GOLDEN = identity_of([1, 2, 3], ["a" * 64, "b" * 64, "c" * 64])
RECORD = CalibrationRecord(
    profile="whisper-tiny-en",
    scenario="fox-fast",
    device_key="cpu-key",
    golden=GOLDEN,
    budget=0,
    steps=(StepBound(0, 0, 0, 1.25e-05), StepBound(0, 1, 0, 2.5e-05)),
    origin={"command": "python -m harness calibrate --model whisper-tiny-en --write"},
)


def _read(path: Path, golden: str = GOLDEN, scenario: str = "fox-fast") -> CalibrationRecord:
    return read_record(path, "whisper-tiny-en", scenario, "cpu-key", golden)


def test_a_written_record_reads_back_exactly(tmp_path: Path) -> None:
    path = tmp_path / "calibration" / "fox-fast.json"
    write_record(path, RECORD)
    assert _read(path) == RECORD


def test_a_missing_record_names_the_command_that_writes_it(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=re.escape("make calibrate MODEL=whisper-tiny-en ARGS=--write")):
        _read(tmp_path / "fox-fast.json")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d | {"budget": 5}, "edited by hand"),  # a budget widened by hand
        (lambda d: d | {"steps": [[0, 0, 0, 1.0], [0, 1, 0, 1.0]]}, "edited by hand"),  # a bound widened
        (lambda d: d | {"format": 9}, "not a format-1"),
        (lambda d: {k: v for k, v in d.items() if k != "sha256"}, "edited by hand"),
    ],
)
def test_an_edited_record_is_refused(tmp_path: Path, edit, message: str) -> None:
    path = tmp_path / "fox-fast.json"
    write_record(path, RECORD)
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    with pytest.raises(CalibrationError, match=message):
        _read(path)


def test_a_record_of_another_golden_or_scenario_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fox-fast.json"
    write_record(path, RECORD)
    other = identity_of([1, 2, 4], ["a" * 64, "b" * 64, "c" * 64])
    with pytest.raises(CalibrationError, match="stale: it was measured against another golden"):
        _read(path, golden=other)
    with pytest.raises(CalibrationError, match="a record of whisper-tiny-en/fox-fast"):
        _read(path, scenario="long-fast")
    path.write_text("{not json")
    with pytest.raises(CalibrationError, match="unreadable calibration record"):
        _read(path)
