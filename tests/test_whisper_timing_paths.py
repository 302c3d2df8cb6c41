"""Whisper paths no gate can express, each judged against what mlx-whisper computes (issue 53).

A scenario names a WAV file of the repository, and `transcribe` always pads it by a window, so
the gates never hand the front end an array or no padding; a gate's golden of the ffmpeg route
would depend on the ffmpeg build, which is not in the golden key; no pinned Whisper artifact
is quantized, stores `weights.npz` or only a `tokenizer.json`. Here each runs against mlx-whisper
0.4.3 in its oracle venv, on this machine (same ffmpeg, nothing stored): the Mel of arrays, the
ffmpeg decode, the DTW of an alignment without audio positions, a quantized model's logits,
the vocabulary read from tokenizer.json, the writers' "all". The rest are the seek loop's and
the stream's paths the harness never takes (`fix_clip_start`, a reference with fewer windows, a
stream without a seed) and the loader's reports of malformed checkpoints.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import wave
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from harness.oracle.venvs import ensure_oracle_env
from harness.paths import REPO_ROOT
from models.whisper import audio
from models.whisper.timing import dtw

AUDIO = REPO_ROOT / "fixtures" / "audio"
FOX = AUDIO / "fox.wav"
OPTIONS = {"temperature": 0.0, "fp16": False, "sample_len": 6}


def run_oracle(tmp_path: Path, script: str, job: dict) -> dict:
    """`script` run by the mlx-whisper oracle venv's Python on `job`; its JSON answer."""
    (tmp_path / "oracle.py").write_text(script)
    (tmp_path / "job.json").write_text(json.dumps(job))
    cmd, env = ensure_oracle_env("mlx-whisper").command(
        str(tmp_path / "oracle.py"), str(tmp_path / "job.json"), str(tmp_path / "out.json")
    )
    done = subprocess.run(cmd, env=env, capture_output=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def write_wav(path: Path, pcm: np.ndarray, rate: int = 16000, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return path


def u32(a) -> list[int]:
    return np.asarray(a, dtype=np.float32).view(np.uint32).ravel().tolist()


# ---------------------------------------------------------------- timing: DTW without columns

ORACLE_DTW = """
import json, sys
import numpy as np
from mlx_whisper import timing
job = json.load(open(sys.argv[1]))
out = {}
for name, (rows, cols) in job.items():
    r, c = timing.dtw(np.zeros((rows, cols), dtype=np.float32))
    out[name] = [r.tolist(), c.tolist()]
json.dump(out, open(sys.argv[2], "w"))
"""


def test_dtw_of_an_alignment_without_audio_positions_is_mlx_whisper_s(tmp_path: Path) -> None:
    """A window of one Mel frame leaves `num_frames // 2 == 0` audio positions: mlx-whisper's
    DTW walks up column -1 (words 0.02 s before the window); the in-tree one refused the matrix.
    (Gated by whisper-large-v3-turbo-mini/fox-one-frame-window-words.)"""
    shapes = {"one-row": (1, 0), "rows": (18, 0)}
    want = run_oracle(tmp_path, ORACLE_DTW, {k: list(v) for k, v in shapes.items()})
    for name, shape in shapes.items():
        rows, cols = dtw(np.zeros(shape, np.float32))
        assert [rows.tolist(), cols.tolist()] == want[name], name
        assert rows.dtype == np.int64 and cols.dtype == np.int64
    with pytest.raises(ValueError, match="at least one row"):
        dtw(np.zeros((0, 3), np.float32))


# ---------------------------------------------------------------- audio: arrays, no padding, ffmpeg

ORACLE_MEL = """
import json, sys
import numpy as np, mlx.core as mx
from mlx_whisper import audio
job = json.load(open(sys.argv[1]))
out = {}
samples = np.load(job["samples"])
bits = lambda a: np.array(a).view(np.uint32).ravel().tolist()
for n_mels in (80, 128):
    for padding in (0, audio.N_SAMPLES):
        out[f"np/{n_mels}/{padding}"] = bits(audio.log_mel_spectrogram(samples, n_mels, padding))
        out[f"mx/{n_mels}/{padding}"] = bits(audio.log_mel_spectrogram(mx.array(samples), n_mels, padding))
for name, path in job["files"].items():
    out["file/" + name] = bits(audio.load_audio(path))
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="mlx-whisper's load_audio needs the ffmpeg command")
def test_front_end_inputs_no_scenario_gives_equal_mlx_whisper_s(tmp_path: Path) -> None:
    """A numpy or MLX waveform, with and without a window of padding, for 80 and 128 bins (a gate
    always gives a path and pads); and the files only ffmpeg decodes (stereo, 44.1 kHz), through the
    ffmpeg route, against mlx-whisper's load_audio on the same ffmpeg."""
    samples = np.array(audio.load_audio(FOX))
    np.save(tmp_path / "fox.npy", samples)
    pcm = np.round(samples[:20000] * 32768).astype(np.int16)
    files = {
        "stereo": write_wav(tmp_path / "stereo.wav", np.stack([pcm, pcm // 2], axis=1).ravel(), channels=2),
        "44k1": write_wav(tmp_path / "44k1.wav", pcm, rate=44100),
    }
    job = {"samples": str(tmp_path / "fox.npy"), "files": {k: str(v) for k, v in files.items()}}
    want = run_oracle(tmp_path, ORACLE_MEL, job)
    for n_mels in (80, 128):
        for padding in (0, audio.N_SAMPLES):
            for kind, given in (("np", samples), ("mx", mx.array(samples))):
                got = audio.log_mel_spectrogram(given, n_mels, padding)
                assert u32(got) == want[f"{kind}/{n_mels}/{padding}"], (kind, n_mels, padding)
    for name, path in files.items():
        assert audio._read_plain_wav(path, audio.SAMPLE_RATE) is None, name  # not plain: ffmpeg's
        assert u32(audio.load_audio(path)) == want[f"file/{name}"], name


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="the ffmpeg command is not on PATH")
def test_a_file_ffmpeg_cannot_decode_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio at all")
    with pytest.raises(RuntimeError, match=r"ffmpeg failed to decode .*notes\.wav"):
        audio.load_audio(bad)


# ---------------------------------------------------------------- loader and vocabulary


@pytest.fixture(scope="module")
def mini_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whisper-large-v3-turbo-mini twin's config and weights (no vocabulary)."""
    from harness.artifacts.twins.whisper import WHISPER_LARGE_V3_TURBO_MINI as SPEC
    from harness.artifacts.twins.whisper import write_whisper_weights

    out = tmp_path_factory.mktemp("whisper-mini")
    write_whisper_weights(out, SPEC.dims, SPEC.seed, SPEC.weight_dtype, SPEC.alignment_heads)
    return out


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_weights(model_dir: Path, edit) -> None:
    weights = mx.load(str(model_dir / "weights.safetensors"))
    edit(weights)
    mx.save_safetensors(str(model_dir / "weights.safetensors"), weights)


def test_the_loader_names_a_tensor_of_integers_and_misshaped_alignment_heads(mini_dir: Path, tmp_path: Path) -> None:
    from models.whisper.load import load_model

    d = copy_dir(mini_dir, tmp_path / "ints")
    edit_weights(d, lambda w: w.update({"decoder.ln.bias": w["decoder.ln.bias"].astype(mx.int32)}))
    with pytest.raises(ValueError, match=r"tensor decoder\.ln\.bias has dtype mlx.core.int32, expected a float dtype"):
        load_model(d)
    d = copy_dir(mini_dir, tmp_path / "heads")
    edit_weights(d, lambda w: w.update({"alignment_heads": mx.array([1, 0, 1, 1])}))
    with pytest.raises(ValueError, match=r"alignment_heads must be \[n, 2\] integer \(layer, head\) pairs, got \[4\]"):
        load_model(d)
    edit_weights(d, lambda w: w.update({"alignment_heads": mx.array([[1.0, 0.0]])}))
    with pytest.raises(ValueError, match=r"got \[1, 2\] mlx.core.float32"):
        load_model(d)


def test_weights_npz_load_as_weights_safetensors(mini_dir: Path, tmp_path: Path) -> None:
    """mlx-whisper's loader falls back to weights.npz; no pinned artifact has one."""
    from models.whisper.load import load_model

    d = copy_dir(mini_dir, tmp_path / "npz")
    weights = mx.load(str(d / "weights.safetensors"))
    mx.savez(str(d / "weights.npz"), **weights)
    (d / "weights.safetensors").unlink()
    got = dict(nn.utils.tree_flatten(load_model(d).parameters()))
    want = dict(nn.utils.tree_flatten(load_model(mini_dir).parameters()))
    assert got.keys() == want.keys()
    assert all(np.array_equal(np.array(got[k]), np.array(want[k])) for k in want)


ORACLE_QUANTIZED = """
import json, sys
import numpy as np, mlx.core as mx
from mlx_whisper.load_models import load_model
job = json.load(open(sys.argv[1]))
model = load_model(job["model"], mx.float32)
mel = mx.array(np.load(job["mel"]))
features = model.encoder(mel)
logits = model.decoder(mx.array(job["tokens"]), features)[0]
json.dump({"features": np.array(features).view(np.uint32).ravel().tolist(),
           "logits": np.array(logits).view(np.uint32).ravel().tolist()}, open(sys.argv[2], "w"))
"""


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_directory_computes_mlx_whisper_s_logits(mini_dir: Path, tmp_path: Path, bits: int) -> None:
    """MLX's affine quantization of the twin (harness.quality's recipe), loaded by both sides:
    the encoder output and the decoder's logits bit for bit."""
    from harness.quality.whisper_candidate import quantize_whisper_dir
    from models.whisper.load import load_model

    d = tmp_path / f"q{bits}"
    d.mkdir()
    quantize_whisper_dir(mini_dir, d, bits=bits, group_size=64)
    assert json.loads((d / "config.json").read_text())["quantization"] == {"group_size": 64, "bits": bits}
    rng = np.random.default_rng(bits)
    mel = rng.standard_normal((1, audio.N_FRAMES, 128)).astype(np.float32)
    np.save(tmp_path / "mel.npy", mel)
    tokens = [[50258, 50259, 50360, 50365, 440, 2068]]
    want = run_oracle(tmp_path, ORACLE_QUANTIZED, {"model": str(d), "mel": str(tmp_path / "mel.npy"), "tokens": tokens})
    model = load_model(d)
    assert isinstance(model.decoder.blocks[0].mlp1, nn.QuantizedLinear)
    features = model.embed_audio(mx.array(mel))
    assert u32(features) == want["features"]
    assert u32(model.logits(mx.array(tokens), features)[0]) == want["logits"]


ORACLE_RANKS = """
import base64, json, sys
from mlx_whisper.tokenizer import get_encoding
enc = get_encoding("gpt2")
json.dump({base64.b64encode(k).decode(): v for k, v in enc._mergeable_ranks.items()}, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    from harness.session import ParitySession

    session = ParitySession()
    return session.artifact(session.profile("whisper-tiny-en")).model_dir


def test_a_vocabulary_in_tokenizer_json_alone_is_mlx_whisper_s_gpt2(tiny_dir: Path, tmp_path: Path) -> None:
    """The CTranslate2 conversion ships vocabulary.txt and tokenizer.json; with tokenizer.json
    alone the ranks are still mlx-whisper's own gpt2.tiktoken."""
    from models.whisper.tokenizer import read_ranks

    only = tmp_path / "only-tokenizer-json"
    only.mkdir()
    shutil.copy(tiny_dir / "tokenizer.json", only / "tokenizer.json")
    want = run_oracle(tmp_path, ORACLE_RANKS, {})
    got = {base64.b64encode(k).decode(): v for k, v in read_ranks(only).items()}
    assert got == want
    assert got == {base64.b64encode(k).decode(): v for k, v in read_ranks(tiny_dir).items()}  # vocabulary.txt's


# ---------------------------------------------------------------- writers: "all"

ORACLE_WRITE_ALL = """
import json, sys
from mlx_whisper.writers import get_writer
job = json.load(open(sys.argv[1]))
for i, options in enumerate(job["options"]):
    get_writer("all", job["out"] + f"/{i}")(json.loads(json.dumps(job["result"])), "fox.wav", **options)
json.dump({}, open(sys.argv[2], "w"))
"""


def test_output_format_all_writes_what_mlx_whisper_s_all_writes(tmp_path: Path) -> None:
    from harness.checks.writers import FORMATS, WORD_OPTION_SETS
    from models.whisper.writers import get_writer
    from tests.conftest import fox_words_golden

    result = fox_words_golden()["transcript"]
    options = [WORD_OPTION_SETS[0], WORD_OPTION_SETS[1], WORD_OPTION_SETS[-1]]
    for i in range(len(options)):
        (tmp_path / "oracle" / str(i)).mkdir(parents=True)
    run_oracle(tmp_path, ORACLE_WRITE_ALL, {"result": result, "out": str(tmp_path / "oracle"), "options": options})
    for i, option_set in enumerate(options):
        out = tmp_path / "intree" / str(i)
        out.mkdir(parents=True)
        get_writer("all", out)(json.loads(json.dumps(result)), "fox.wav", **option_set)
        assert sorted(p.name for p in out.iterdir()) == sorted(f"fox.{f}" for f in FORMATS)
        for fmt in FORMATS:
            assert (out / f"fox.{fmt}").read_bytes() == (tmp_path / "oracle" / str(i) / f"fox.{fmt}").read_bytes(), fmt


# ---------------------------------------------------------------- the seek loop and the stream


@pytest.fixture(scope="module")
def small(tiny_dir: Path):
    """A seeded width-64 Whisper with the tiny.en vocabulary (as tests/test_whisper_stream.py's)."""
    from models.whisper.model import ModelDimensions, Whisper

    mx.random.seed(0)
    model = Whisper(ModelDimensions(80, 1500, 64, 2, 2, 51864, 448, 64, 2, 2), mx.float32)
    flat = nn.utils.tree_flatten(model.parameters())
    model.update(nn.utils.tree_unflatten([(k, mx.random.normal(v.shape) * 0.2) for k, v in flat]))
    model.decoder.positional_embedding = mx.random.normal((448, 64)) * 0.1
    mx.eval(model.parameters())
    return model


def same(a, b) -> bool:
    """Equal as JSON (a NaN log-probability of the random weights equals NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def seeks(record: dict) -> list[int]:
    return [int(call["seek"]) for call in record["decode_calls"]]


def test_fix_clip_start_starts_each_clip_where_openai_whisper_does(small, tiny_dir: Path) -> None:
    """mlx-whisper (the gates' oracle, which has no such option) goes on from where the previous
    clip stopped; openai-whisper's loop (`if seek < seek_clip_start: seek = seek_clip_start`, and
    the next clip's start on leaving one) starts each clip at its start."""
    from harness.runners.whisper_record import transcribe_record

    clips = "0,1,3,4.5"
    plain = transcribe_record(small, tiny_dir, FOX, OPTIONS | {"seed": 0, "clip_timestamps": clips})
    fixed = transcribe_record(
        small, tiny_dir, FOX, OPTIONS | {"seed": 0, "clip_timestamps": clips, "fix_clip_start": True}
    )
    assert seeks(plain)[0] == seeks(fixed)[0] == 0
    assert 300 not in seeks(plain) and seeks(plain)[1] < 300  # the second clip entered from the first's end
    assert seeks(fixed)[1] == 300


def test_a_reference_with_fewer_windows_ends_the_teacher_forced_run(small, tiny_dir: Path) -> None:
    """Teacher forcing follows the reference's windows; where the in-tree run's own seek would go
    on past the reference's last call, it stops there (the gates then report the difference)."""
    from harness.runners.whisper_record import transcribe_record

    long = AUDIO / "long.wav"
    free = transcribe_record(small, tiny_dir, long, OPTIONS | {"seed": 0})
    assert len(free["decode_calls"]) >= 2
    forced = transcribe_record(small, tiny_dir, long, OPTIONS | {"seed": 0}, forced=free["decode_calls"][:1])
    assert seeks(forced) == [0]
    first = [s for s in free["transcript"]["segments"] if s["seek"] == 0]
    assert same(forced["transcript"]["segments"], first)


def test_a_stream_without_a_seed_restarts_bit_exact(small, tiny_dir: Path) -> None:
    """Quiet speech, then loud after the first window: `finish` starts over, and without a seed
    it leaves mlx's generator alone (greedy: nothing is drawn), still the batch transcript."""
    from models.whisper.stream import StreamingTranscriber
    from models.whisper.tokenizer import load_encoding
    from models.whisper.transcribe import transcribe

    samples = np.concatenate([np.array(audio.load_audio(AUDIO / "long.wav")) * 0.001, np.array(audio.load_audio(FOX))])
    encoding = load_encoding(tiny_dir, small.num_languages, small.dims.n_vocab)
    stream = StreamingTranscriber(small, encoding, seed=None, **OPTIONS)
    for start in range(0, samples.size, 16000):
        stream.feed(samples[start : start + 16000], sample_rate=16000)
    result = stream.finish()
    assert (stream.windows_before_finish, stream.restarts) == (1, 1)
    assert same(result, transcribe(small, mx.array(samples), encoding, **OPTIONS))
