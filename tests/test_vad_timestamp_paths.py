"""Silero VAD paths no gate can feed, judged against the silero-vad package (the oracle) itself.

An empty clip: the VAD profiles refuse a WAV without a sample frame (harness/profile/inputs.py,
check_wav), so no fixture can hold one, yet a caller can hand the model one (an empty recording).
The package, run by the oracle's own generator on an empty WAV, makes no model call and finds no
speech under any option set; the in-tree model, its stream and its timestamp rules must say the same.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest

from harness.artifacts.vad import resolve_vad_weights
from harness.profile.vad import load_vad_profile
from harness.runners.vad import run_oracle
from models.vad import SpeechTimestampOptions, VADStream, get_speech_timestamps, load_model, read_wav, speech_segments


@pytest.fixture(scope="module")
def profile():
    return load_vad_profile()


def _empty_wav(path: Path) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"")
    return path


def test_an_empty_clip_is_what_the_package_makes_of_it(profile, tmp_path):
    wav = _empty_wav(tmp_path / "empty.wav")
    out = tmp_path / "oracle"
    run_oracle(profile.oracle, out, [wav], profile.timestamp_options)
    record = json.loads((out / "empty.json").read_text())
    package_probs = np.load(out / "empty.probs.npy", allow_pickle=False)
    assert (record["samples"], record["chunks"], package_probs.shape) == (0, 0, (0,))

    model = load_model(resolve_vad_weights(profile))
    audio = read_wav(wav)
    probs = model.probabilities(audio)
    assert probs.dtype == np.float32 and probs.shape == package_probs.shape
    stream = VADStream(model)
    assert stream.feed(audio) == [] and stream.flush() == [] and stream.chunks_done == 0
    for name, values in profile.timestamp_options.items():
        mine = [s.as_dict() for s in speech_segments(probs.tolist(), 0, SpeechTimestampOptions(**values))]
        assert mine == record["segments"][name], name
    assert record["segments"]["default"] == [] and get_speech_timestamps(audio, model) == []
