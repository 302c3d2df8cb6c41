"""What a check's judge may ask for, and how a registry row says what it needs.

The session builds one `CheckContext` per (profile, scenario) and hands it to every check's
`judge(context)` (harness/checks/registry.py). Each accessor makes its run or fetches its data
on first use and the session keeps it, so checks that share a run share it; the session never
asks which check it is judging, only what the row `needs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.records import ScenarioRecord

# What a row may need. The first three are in-tree runs of the scenario (the free run is also
# the one whose determinism repeat every scenario gets); the others are what a judge fetches.
FREE = "free"  # the free-running in-tree record
TEACHER_FORCED = "teacher_forced"  # the in-tree record fed the golden's tokens
COMPILED = "compiled"  # the compiled single-token decode loop's record
FULL_GOLDEN = "full_golden"  # the oracle's full vectors (a compact golden is regenerated in full)
CALIBRATION = "calibration"  # the scenario's recorded calibration (the Whisper fast path's budget)
STREAM = "stream"  # in-tree streamed runs, one per chunk size
ORACLE_JOB = "oracle_job"  # a side job in the oracle's venv (the writers' files)
VAD_GATE = "vad"  # judged per fixture by the VAD gate (harness/checks/vad.py)
RUNS = (FREE, TEACHER_FORCED, COMPILED)
NEEDS = (*RUNS, FULL_GOLDEN, CALIBRATION, STREAM, ORACLE_JOB, VAD_GATE)


@dataclass(frozen=True)
class CheckContext:
    """One scenario's check inputs, each made on demand by the session and shared."""

    label: str  # "profile/scenario", for messages
    scenario: Any  # the profile's Scenario (its options: writer_options, stream_chunks, composition)
    audio: str | None  # the scenario's audio file, absolute (speech scenarios)
    golden: Callable[[], ScenarioRecord]  # as stored: compact or full
    full_golden: Callable[[], ScenarioRecord]
    intree: Callable[[str], ScenarioRecord]  # FREE, TEACHER_FORCED or COMPILED
    calibration: Callable[[ScenarioRecord], Any]  # the record for this golden
    streamed: Callable[[float], ScenarioRecord]  # the in-tree streamed run at this chunk size
