"""Streaming Whisper (models/whisper/stream.py) and its `streamed_transcript` gate.

On a small seeded Whisper (width 64, the tiny.en vocabulary) over real speech: the stream's
Mel, windows, logits and transcript equal the batch run's bit for bit for odd chunk sizes;
a louder stretch after a window decoded mid-stream moves the Mel floor and makes `finish`
start over (still bit-exact); the gate fails, naming the chunk size and the window, when the
streaming loop drops the last window; bad input is refused with a clear error. The real
tiny.en gate runs in `make parity MODEL=whisper-tiny-en`.
"""

from __future__ import annotations

import wave
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from harness.checks.streamed import check_streamed, compare_streamed
from harness.runners.whisper import WhisperRunner
from harness.runners.whisper_record import transcribe_record
from models.whisper import stream as stream_module
from models.whisper.audio import N_FRAMES, load_audio
from models.whisper.model import ModelDimensions, Whisper
from models.whisper.seek_loop import SeekLoop
from models.whisper.stream import StreamError, StreamingTranscriber
from models.whisper.tokenizer import load_encoding

MODEL = "whisper-tiny-en"
AUDIO = Path(__file__).resolve().parent.parent / "fixtures" / "audio"
OPTIONS = {"temperature": 0.0, "fp16": False, "sample_len": 6}


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> WhisperRunner:
    """A runner whose model is a seeded width-64 Whisper with the tiny.en vocabulary."""
    from harness.session import ParitySession

    session = ParitySession()
    artifact_dir = session.artifact(session.profile(MODEL)).model_dir
    mx.random.seed(0)
    dims = ModelDimensions(80, 1500, 64, 2, 2, 51864, 448, 64, 2, 2)
    model = Whisper(dims, mx.float32)
    flat = nn.utils.tree_flatten(model.parameters())
    model.update(nn.utils.tree_unflatten([(k, mx.random.normal(v.shape) * 0.2) for k, v in flat]))
    model.decoder.positional_embedding = mx.random.normal((448, 64)) * 0.1
    mx.eval(model.parameters())
    runner = WhisperRunner(artifact_dir)
    runner._models[False] = model
    return runner


def write_wav(path: Path, samples: np.ndarray) -> str:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes())
    return str(path)


def speech(*names: str, gains: tuple[float, ...] | None = None) -> np.ndarray:
    parts = [np.array(load_audio(AUDIO / f"{n}.wav")) for n in names]
    return np.concatenate([p * g for p, g in zip(parts, gains or (1.0,) * len(parts), strict=True)])


def spec(audio: str) -> dict:
    return {"id": "stream", "audio": audio, "options": dict(OPTIONS), "seed": 0}


def batch_record(runner: WhisperRunner, audio: str):
    out = transcribe_record(runner.model, runner.model_dir, audio, OPTIONS | {"seed": 0})
    return runner._scenario_record(spec(audio), out, "free")


@pytest.fixture(scope="module")
def two_windows(runner, tmp_path_factory) -> tuple[str, object]:
    """long.wav then fox.wav: 39.4 s, a full window decided mid-stream and a last, shorter one."""
    audio = write_wav(tmp_path_factory.mktemp("stream") / "long-fox.wav", speech("long", "fox"))
    return audio, batch_record(runner, audio)


def test_streams_of_every_chunk_size_equal_the_batch_run(runner, two_windows) -> None:
    audio, batch = two_windows
    assert len(batch.extra["decode_calls"]) >= 2
    result = check_streamed(batch, lambda s: runner.run_streamed(spec(audio), s), None)
    assert result.passed, result.summary
    one_second = result.details["chunks"][0]["stream"]
    assert one_second["windows_before_finish"] >= 1 and one_second["restarts"] == 0


def test_odd_chunk_sizes_give_the_batch_mel_and_transcript(runner, tmp_path) -> None:
    audio = write_wav(tmp_path / "fox.wav", speech("fox"))
    batch = batch_record(runner, audio)
    for seconds in (1 / 16000 * 37, 0.01, 0.010625, 2.3):  # 37, 160 and 170 samples: STFT frames cut anywhere
        result = compare_streamed(batch, runner.run_streamed(spec(audio), seconds), seconds)
        assert result.passed, result.summary  # mel, windows, logits, transcript (a NaN log-prob equals NaN)


def test_a_louder_stretch_after_a_decided_window_restarts_and_stays_bit_exact(runner, tmp_path) -> None:
    # quiet speech for 33.6 s, then loud: the floor under window 0 moves once the loud part arrives
    audio = write_wav(tmp_path / "quiet-loud.wav", speech("long", "fox", gains=(0.001, 1.0)))
    batch = batch_record(runner, audio)
    result = check_streamed(batch, lambda s: runner.run_streamed(spec(audio), s), [1.0])
    assert result.passed, result.summary
    assert result.details["chunks"][0]["stream"] == {"chunks": 40, "windows_before_finish": 1, "restarts": 1}


def test_a_stream_that_drops_the_last_window_fails_the_gate(runner, two_windows, monkeypatch) -> None:
    audio, batch = two_windows
    new_loop = StreamingTranscriber._new_loop

    def dropping_loop(self) -> SeekLoop:
        loop = new_loop(self)
        next_window = loop.next_window

        def but_the_last(ready: int):
            window = next_window(ready)
            if isinstance(window, tuple) and loop.content_frames is not None:
                if window[0] + window[1] >= loop.content_frames:
                    return None  # the bug: the tail shorter than a window is never decoded
            return window

        loop.next_window = but_the_last
        return loop

    monkeypatch.setattr(stream_module.StreamingTranscriber, "_new_loop", dropping_loop)
    result = check_streamed(batch, lambda s: runner.run_streamed(spec(audio), s), None)
    last = batch.extra["decode_calls"][-1]["seek"]
    assert not result.passed
    assert result.summary.startswith("1 s chunks: ")
    assert f"missing window(s) at seek [{last}]" in result.summary, result.summary


def test_a_stream_whose_mel_frames_shift_fails_naming_the_window(runner, two_windows, monkeypatch) -> None:
    audio, batch = two_windows
    window_mel = StreamingTranscriber._window_mel

    def shifted(self, start: int, stop: int):
        mel, floor = window_mel(self, start, stop)
        return mel * 1.0001, floor

    monkeypatch.setattr(stream_module.StreamingTranscriber, "_window_mel", shifted)
    result = check_streamed(batch, lambda s: runner.run_streamed(spec(audio), s), [1.0])
    assert not result.passed and result.summary.startswith("1 s chunks: "), result.summary
    assert "seek 0" in result.summary or "decode call 0" in result.summary, result.summary


def test_bad_input_is_refused_with_a_clear_error(runner) -> None:
    model = runner.model
    encoding = load_encoding(runner.model_dir, model.num_languages, model.dims.n_vocab)
    with pytest.raises(StreamError, match="sample rate 44100 Hz: expected 16000 Hz"):
        StreamingTranscriber(model, encoding, sample_rate=44100, **OPTIONS)
    stream = StreamingTranscriber(model, encoding, **OPTIONS)
    with pytest.raises(StreamError, match="sample rate 8000 Hz: expected 16000 Hz"):
        stream.feed(np.zeros(160, np.float32), sample_rate=8000)
    with pytest.raises(StreamError, match=r"shape \(160, 2\): expected mono"):
        stream.feed(np.zeros((160, 2), np.float32))
    with pytest.raises(StreamError, match="dtype int16: expected floats"):
        stream.feed(np.zeros(160, np.int16))
    with pytest.raises(StreamError, match="'forced_calls' is not a streaming option"):
        StreamingTranscriber(model, encoding, forced_calls=[], **OPTIONS)
    stream.feed(np.zeros(16000, np.float32))
    assert stream.finish()["segments"] is not None
    with pytest.raises(StreamError, match="feed after finish"):
        stream.feed(np.zeros(160, np.float32))
    with pytest.raises(StreamError, match="finish after finish"):
        stream.finish()
    assert N_FRAMES == 3000
