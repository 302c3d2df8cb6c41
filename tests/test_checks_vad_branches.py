"""The VAD gate's streaming check and its walked-paths reading (harness/checks/vad.py), without the
Silero model: a stand-in model's probabilities, the oracle's record built to match them, and the
streaming path replaced. A stream of another length fails naming both lengths; report rows of
another profile are not read as this profile's walked paths."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from harness.checks import vad
from harness.checks.vad import AT_LEAST_ONE_SEGMENT, gate_fixture, walked_segments
from harness.goldens.vad import OracleResult
from harness.paths import FIXTURES_DIR
from harness.profile.vad import load_vad_profile
from harness.report import ItemResult

FIXTURE = "silence.wav"  # not among the profile's speech fixtures: no segment is expected there
CHUNKS = 63  # its 32,000 samples in chunks of 512


class _Quiet:
    """A stand-in model: probability 0.125 on every chunk (no speech under any option set)."""

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        return np.full(CHUNKS, 0.125, np.float32)


@pytest.fixture(scope="module")
def profile():
    return load_vad_profile()


def _oracle(profile) -> OracleResult:
    """The package's record of the fixture agreeing with `_Quiet`: same samples, same chunks, no segments."""
    from models.vad import read_wav

    audio = read_wav(FIXTURES_DIR / FIXTURE)
    return OracleResult(
        fixture=FIXTURE,
        probs=np.full(CHUNKS, 0.125, np.float32),
        segments={name: [] for name in profile.timestamp_options},
        samples_sha256=hashlib.sha256(audio.tobytes()).hexdigest(),
        seconds={},
        manifest_path=Path("unused.json"),
    )


def test_a_stream_with_fewer_chunks_than_the_batch_run_fails_naming_both(profile, monkeypatch) -> None:
    """Streaming yields one chunk fewer than the batch run's 63: `streaming` fails, the rest passes."""
    monkeypatch.setattr(vad, "streaming_probabilities", lambda model, audio: np.full(CHUNKS - 1, 0.125, np.float32))
    verdict = gate_fixture(profile, _Quiet(), _oracle(profile))
    stream = next(c for c in verdict.checks if c.name == "streaming")
    assert not stream.passed and stream.detail == "streaming gave 62 chunks, batch 63"
    assert all(c.passed for c in verdict.checks if c.name != "streaming")
    assert not verdict.passed


def test_a_stream_equal_to_the_batch_run_passes(profile, monkeypatch) -> None:
    """The contrast: the same 63 chunks streamed are bit-identical."""
    monkeypatch.setattr(vad, "streaming_probabilities", lambda model, audio: np.full(CHUNKS, 0.125, np.float32))
    verdict = gate_fixture(profile, _Quiet(), _oracle(profile))
    stream = next(c for c in verdict.checks if c.name == "streaming")
    assert stream.passed and stream.detail.startswith("63 chunks bit-identical")
    assert verdict.passed


def test_walked_paths_are_read_from_this_profiles_rows_only(profile) -> None:
    """A row of another model naming the same fixture and option set is not this profile's walk."""

    def row(model: str, walked: list[str]) -> ItemResult:
        return ItemResult(
            model, "fox.wav", "segments[default]", "L1", "silero-vad", "passed", "", details={"walked": walked}
        )

    other = row("another-vad", [AT_LEAST_ONE_SEGMENT])
    assert walked_segments([other], profile) == {}
    mine = row(profile.name, [])
    assert walked_segments([other, mine], profile) == {("fox.wav", "default"): []}
    assert walked_segments([row(profile.name, [AT_LEAST_ONE_SEGMENT])], profile) == {
        ("fox.wav", "default"): [AT_LEAST_ONE_SEGMENT]
    }
