"""The in-tree Whisper: audio stage, model graph and strict loader, on the mini turbo twin's shapes."""

from __future__ import annotations

import hashlib
import json
import wave
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from harness.artifacts.twins import build_twin, get_twin
from harness.artifacts.twins.whisper import (
    LARGE_V3_TURBO_DIMS,
    LARGE_V3_TURBO_MINI_DIMS,
    VOCABULARY_FILE,
    WHISPER_LARGE_V3_TURBO_MINI,
    plan_tensors,
    write_whisper_weights,
)
from models.whisper import audio
from models.whisper.load import load_model
from models.whisper.model import ModelDimensions, Whisper, sinusoids

MINI = WHISPER_LARGE_V3_TURBO_MINI.twin_id
# sha256 of the float32 bytes of mlx-whisper 0.4.3's assets/mel_filters.npz arrays
# (librosa.filters.mel(sr=16000, n_fft=400, n_mels=n)): computed here, never read from it.
MEL_FILTER_SHA256 = {
    80: "4f2701b1d287d74a0dc9871026e9519d98cb76426615f2539b0d151a0ae4ec2e",
    128: "2a5f9822897750e047c85dea37cc268d3be0ecfd23c28a5f10da129d99d05afe",
}


def bits(a: mx.array) -> np.ndarray:
    return np.array(a).view(np.uint32)


def tone(seconds: float = 1.5) -> np.ndarray:
    t = np.arange(int(seconds * audio.SAMPLE_RATE)) / audio.SAMPLE_RATE
    wave_ = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 1830 * t) * (t > 0.5)
    return np.round(wave_ * 32767).astype(np.int16)


def write_wav(path: Path, pcm: np.ndarray, rate: int = audio.SAMPLE_RATE, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def mini_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini twin's config and weights (no vocabulary: no download needed)."""
    out = tmp_path_factory.mktemp("whisper-mini")
    spec = WHISPER_LARGE_V3_TURBO_MINI
    write_whisper_weights(out, spec.dims, spec.seed, spec.weight_dtype, spec.alignment_heads)
    return out


@pytest.fixture(scope="module")
def mini_model(mini_dir: Path) -> Whisper:
    return load_model(mini_dir)


@pytest.fixture(scope="module")
def tone_mel() -> mx.array:
    pcm = tone()
    mel = audio.log_mel_spectrogram(mx.array(pcm.astype(np.float32) / 32768.0), n_mels=128, padding=audio.N_SAMPLES)
    return audio.pad_or_trim(mel, audio.N_FRAMES, axis=-2)[None]


@pytest.fixture(scope="module")
def tone_features(mini_model: Whisper, tone_mel: mx.array) -> mx.array:
    features = mini_model.embed_audio(tone_mel)
    mx.eval(features)
    return features


# --------------------------------------------------------------------------- audio


def test_constants() -> None:
    assert (audio.N_SAMPLES, audio.N_FRAMES) == (480000, 3000)
    assert (audio.N_SAMPLES_PER_TOKEN, audio.FRAMES_PER_SECOND, audio.TOKENS_PER_SECOND) == (320, 100, 50)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_are_librosa_slaney_bit_for_bit(n_mels: int) -> None:
    bank = np.array(audio.mel_filters(n_mels))
    assert bank.shape == (n_mels, audio.N_FFT // 2 + 1) and bank.dtype == np.float32
    assert hashlib.sha256(bank.tobytes()).hexdigest() == MEL_FILTER_SHA256[n_mels]
    assert (bank >= 0).all()
    for row in bank:  # one triangle per band: a single contiguous run of non-zero bins
        nonzero = np.flatnonzero(row)
        assert nonzero.size and (np.diff(nonzero) == 1).all()
    peaks = bank.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all()  # bands rise in frequency
    # Slaney normalisation: unit area per band in Hz (height 2 / width); sampling the
    # triangles on 40 Hz bins blurs that for narrow bands, so look at the typical band.
    areas = bank.sum(axis=1) * audio.SAMPLE_RATE / audio.N_FFT
    assert 0.97 < np.median(areas) < 1.03


def test_mel_filters_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="n_mels"):
        audio.mel_filters(0)


def test_hanning_is_periodic() -> None:
    window = np.array(audio.hanning(audio.N_FFT))
    assert window.shape == (400,) and window[0] == 0 and window.argmax() == 200
    assert np.allclose(window[1:200], window[399:200:-1])


def test_log_mel_spectrogram_shape_and_range() -> None:
    samples = mx.array(tone().astype(np.float32) / 32768.0)
    mel = audio.log_mel_spectrogram(samples, n_mels=80)
    assert mel.shape == (samples.size // audio.HOP_LENGTH, 80) and mel.dtype == mx.float32
    values = np.array(mel)
    assert values.max() - values.min() <= 2.0 + 1e-6  # 8 decades / 4
    padded = audio.log_mel_spectrogram(samples, n_mels=80, padding=audio.N_SAMPLES)
    assert padded.shape == ((samples.size + audio.N_SAMPLES) // audio.HOP_LENGTH, 80)


def test_log_mel_from_path_equals_from_samples(tmp_path: Path) -> None:
    pcm = tone(0.7)
    path = write_wav(tmp_path / "tone.wav", pcm)
    from_path = audio.log_mel_spectrogram(path, n_mels=80)
    from_samples = audio.log_mel_spectrogram(pcm.astype(np.float32) / 32768.0, n_mels=80)
    assert (bits(from_path) == bits(from_samples)).all()


def test_load_audio_reads_plain_pcm_wav(tmp_path: Path) -> None:
    pcm = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    loaded = audio.load_audio(write_wav(tmp_path / "a.wav", pcm))
    assert loaded.dtype == mx.float32
    assert (np.array(loaded) == pcm.astype(np.float32) / 32768.0).all()


def test_load_audio_without_ffmpeg_names_the_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stereo = write_wav(tmp_path / "stereo.wav", np.zeros(200, dtype=np.int16), channels=2)
    monkeypatch.setattr(audio.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="ffmpeg"):
        audio.load_audio(stereo)
    with pytest.raises(FileNotFoundError):
        audio.load_audio(tmp_path / "absent.wav")


def test_pad_or_trim() -> None:
    x = mx.arange(10).reshape(2, 5)
    assert audio.pad_or_trim(x, 3).tolist() == [[0, 1, 2], [5, 6, 7]]
    assert audio.pad_or_trim(x, 7).tolist() == [[0, 1, 2, 3, 4, 0, 0], [5, 6, 7, 8, 9, 0, 0]]
    assert audio.pad_or_trim(x, 3, axis=0).shape == (3, 5)


# --------------------------------------------------------------------------- model


def test_dimensions_from_dict_is_strict() -> None:
    config = {**LARGE_V3_TURBO_DIMS.to_dict(), "model_type": "whisper"}
    assert ModelDimensions.from_dict(config) == LARGE_V3_TURBO_DIMS
    with pytest.raises(ValueError, match="unknown keys \\['quantisation'\\]"):
        ModelDimensions.from_dict({**config, "quantisation": 1})
    with pytest.raises(ValueError, match="missing keys \\['n_mels'\\]"):
        ModelDimensions.from_dict({k: v for k, v in config.items() if k != "n_mels"})
    with pytest.raises(ValueError, match="n_vocab"):
        ModelDimensions.from_dict({**config, "n_vocab": 0})


def test_sinusoids_layout() -> None:
    table = np.array(sinusoids(1500, 64))
    assert table.shape == (1500, 64)
    assert (table[0, :32] == 0).all() and (table[0, 32:] == 1).all()


def test_twin_plan_matches_the_model_parameters() -> None:
    for dims in (LARGE_V3_TURBO_DIMS, LARGE_V3_TURBO_MINI_DIMS):
        model = Whisper(dims, mx.float32)  # parameters stay lazy: shapes only
        expected = {n: tuple(p.shape) for n, p in tree_flatten(model.parameters()) if n != "alignment_heads"}
        assert {t.name: t.shape for t in plan_tensors(dims)} == expected


def test_mini_shapes_and_attributes(mini_model: Whisper, tone_features: mx.array) -> None:
    model = mini_model
    assert model.dims == LARGE_V3_TURBO_MINI_DIMS and model.dtype == mx.float32
    assert model.is_multilingual and model.num_languages == 100
    assert model.alignment_heads.tolist() == [[1, 0], [1, 1]]
    features = tone_features
    assert features.shape == (1, 1500, 64) and features.dtype == mx.float32
    tokens = mx.array([[50258, 50259, 50360, 50364]])
    logits, cache, cross_qk = model.logits(tokens, features)
    assert logits.shape == (1, 4, 51866)
    assert len(cache) == 2 and cache[0][0][0].shape == (1, 4, 64) and cache[0][1][0].shape == (1, 1500, 64)
    assert len(cross_qk) == 2 and cross_qk[1].shape == (1, 2, 4, 1500)
    spread = float(np.array(logits[0, -1]).std())
    assert 1.0 < spread < 10.0  # informative, not flat, not saturated


def test_incremental_decoding_reuses_cross_kv(mini_model: Whisper, tone_features: mx.array) -> None:
    features = tone_features
    _, cache, _ = mini_model.logits(mx.array([[50258, 50259, 50360]]), features)
    cross = cache[1][1]
    logits, cache2, _ = mini_model.logits(mx.array([[50364]]), features, kv_cache=cache)
    assert logits.shape == (1, 1, 51866)
    assert cache2[0][0][0].shape == (1, 4, 64)  # self K/V grew by one step
    assert cache2[1][1][0] is cross[0] and cache2[1][1][1] is cross[1]  # projected once per window


def test_incremental_logits_follow_the_prompt(mini_model: Whisper, tone_features: mx.array) -> None:
    """A cached step sees the same context as the whole prompt (numerically; the bits differ by shape)."""
    features = tone_features
    prompt = [50258, 50259, 50360, 50364, 440]
    full, _, _ = mini_model.logits(mx.array([prompt]), features)
    _, cache, _ = mini_model.logits(mx.array([prompt[:-1]]), features)
    step, _, _ = mini_model.logits(mx.array([prompt[-1:]]), features, kv_cache=cache)
    assert np.allclose(np.array(step[0, 0]), np.array(full[0, -1]), atol=1e-4)


def test_logits_depend_on_the_audio(mini_model: Whisper, tone_features: mx.array) -> None:
    tokens = mx.array([[50258, 50259, 50360, 50364]])
    silent = audio.log_mel_spectrogram(mx.zeros(audio.N_SAMPLES), n_mels=128)[None, : audio.N_FRAMES]
    a = np.array(mini_model.logits(tokens, tone_features)[0])
    b = np.array(mini_model.logits(tokens, mini_model.embed_audio(silent))[0])
    assert np.abs(a - b).max() > 0.1


def test_mini_twin_greedy_decoding_is_varied(mini_model: Whisper, tone_features: mx.array) -> None:
    """The twin's init keeps greedy decoding from repeating one token (see harness/artifacts/twins/whisper.py)."""
    tokens, cache, picked = mx.array([[50258, 50259, 50360, 50364]]), None, []
    for _ in range(10):
        logits, cache, _ = mini_model.logits(tokens, tone_features, kv_cache=cache)
        picked.append(int(logits[0, -1].argmax()))
        tokens = mx.array([picked[-1:]])
    assert len(set(picked)) >= 5, picked


def test_model_is_deterministic(mini_dir: Path, tone_mel: mx.array) -> None:
    tokens = mx.array([[50258, 50259, 50360, 50364]])
    runs = [load_model(mini_dir)(tone_mel, tokens) for _ in range(2)]
    assert (bits(runs[0]) == bits(runs[1])).all()


def test_encoder_rejects_a_short_window(mini_model: Whisper) -> None:
    with pytest.raises(ValueError, match="30 s window"):
        mini_model.embed_audio(mx.zeros((1, 100, 128)))


def test_decoder_rejects_context_overflow(mini_model: Whisper, tone_mel: mx.array) -> None:
    with pytest.raises(ValueError, match="text context"):
        mini_model.logits(mx.zeros((1, 449), dtype=mx.int32), mx.zeros((1, 1500, 64)))


# --------------------------------------------------------------------------- loader


def _copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _rewrite_weights(model_dir: Path, edit) -> None:
    weights = mx.load(str(model_dir / "weights.safetensors"))
    edit(weights)
    mx.save_safetensors(str(model_dir / "weights.safetensors"), weights)


def test_loader_names_a_missing_tensor(mini_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(mini_dir, tmp_path / "m")
    _rewrite_weights(d, lambda w: w.pop("decoder.blocks.1.cross_attn.query.bias"))
    with pytest.raises(
        ValueError, match=r"missing tensor decoder\.blocks\.1\.cross_attn\.query\.bias \(expected shape \[64\]\)"
    ):
        load_model(d)


def test_loader_names_an_unknown_tensor(mini_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(mini_dir, tmp_path / "m")
    _rewrite_weights(d, lambda w: w.update({"decoder.blocks.0.attn.key.bias": mx.zeros((64,))}))
    with pytest.raises(ValueError, match=r"unknown tensor decoder\.blocks\.0\.attn\.key\.bias"):
        load_model(d)


def test_loader_names_a_misshaped_tensor(mini_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(mini_dir, tmp_path / "m")
    _rewrite_weights(d, lambda w: w.update({"encoder.conv1.weight": mx.zeros((64, 128, 3))}))
    with pytest.raises(ValueError, match=r"encoder\.conv1\.weight has shape \[64, 128, 3\], expected \[64, 3, 128\]"):
        load_model(d)


def test_loader_checks_alignment_heads(mini_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(mini_dir, tmp_path / "m")
    _rewrite_weights(d, lambda w: w.update({"alignment_heads": mx.array([[5, 0]])}))
    with pytest.raises(ValueError, match="out of range"):
        load_model(d)
    _rewrite_weights(d, lambda w: w.pop("alignment_heads"))
    assert load_model(d).alignment_heads.tolist() == [[1, 0], [1, 1]]  # the default: upper half


def test_loader_rejects_extra_config_keys(mini_dir: Path, tmp_path: Path) -> None:
    d = _copy_dir(mini_dir, tmp_path / "m")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "n_ctx": 3}))
    with pytest.raises(ValueError, match="unknown keys \\['n_ctx'\\]"):
        load_model(d)
    (d / "config.json").write_text(json.dumps({**config, "quantization": {"bits": 4}}))
    with pytest.raises(ValueError, match="quantization must hold positive integer group_size and bits"):
        load_model(d)
    (d / "config.json").write_text(json.dumps({**config, "quantization": {"bits": 4, "group_size": 64, "x": 1}}))
    with pytest.raises(ValueError, match=r"unknown keys \['x'\]"):
        load_model(d)


def _quantized_copy(mini_dir: Path, dst: Path, bits: int = 4) -> Path:
    from harness.quality.whisper_candidate import quantize_whisper_dir

    dst.mkdir()
    quantize_whisper_dir(mini_dir, dst, bits=bits, group_size=64)
    return dst


def test_loader_loads_an_mlx_quantized_directory(mini_dir: Path, tmp_path: Path, tone_features: mx.array) -> None:
    d = _quantized_copy(mini_dir, tmp_path / "q4")
    assert json.loads((d / "config.json").read_text())["quantization"] == {"group_size": 64, "bits": 4}
    model = load_model(d)
    # As mlx-whisper's load_models: every Linear / Embedding with scales is quantized, nothing else.
    assert isinstance(model.decoder.token_embedding, nn.QuantizedEmbedding)
    assert isinstance(model.encoder.blocks[0].attn.key, nn.QuantizedLinear)
    assert isinstance(model.decoder.blocks[1].mlp2, nn.QuantizedLinear)
    assert isinstance(model.encoder.conv1, nn.Conv1d) and isinstance(model.decoder.ln, nn.LayerNorm)
    # Every parameter is the file's tensor, bit for bit.
    stored = mx.load(str(d / "weights.safetensors"))
    for name, value in tree_flatten(model.parameters()):
        assert name in stored and np.array_equal(np.array(value), np.array(stored[name])), name
    # It computes: logits close to the float model's (4-bit), not equal.
    tokens = mx.array([[50258, 50259, 50360]])
    quantized = model.logits(tokens, tone_features)[0]
    full = load_model(mini_dir).logits(tokens, tone_features)[0]
    assert quantized.shape == full.shape and not np.array_equal(np.array(quantized), np.array(full))


def test_loader_names_a_broken_quantized_tensor(mini_dir: Path, tmp_path: Path) -> None:
    d = _quantized_copy(mini_dir, tmp_path / "q8", bits=8)
    name = "decoder.blocks.0.attn.query"
    _rewrite_weights(d, lambda w: w.update({f"{name}.weight": w[f"{name}.weight"].astype(mx.float32)}))
    with pytest.raises(ValueError, match=rf"tensor {name}\.weight has dtype mlx.core.float32, expected uint32"):
        load_model(d)
    _rewrite_weights(d, lambda w: w.pop(f"{name}.scales"))  # not quantized then: its packed tensors misfit
    with pytest.raises(ValueError, match=rf"unknown tensor {name}\.biases"):
        load_model(d)


def test_loader_keeps_stored_dtype_and_takes_model_dtype(mini_dir: Path) -> None:
    model = load_model(mini_dir, dtype=mx.float16)
    assert model.dtype == mx.float16
    assert model.encoder.conv1.weight.dtype == mx.float32  # as mlx-whisper: weights are not cast
    assert model.decoder._mask.dtype == mx.float16 and model.decoder._mask[0, 1].item() == -np.inf


# --------------------------------------------------------------------------- twin


def test_mini_twin_builds_identically_twice(tmp_path: Path) -> None:
    first = build_twin(MINI, tmp_path / "a")
    second = build_twin(MINI, tmp_path / "b")
    assert first["files"] == second["files"]
    assert set(first["files"]) == {"config.json", "weights.safetensors", VOCABULARY_FILE}
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config == {**LARGE_V3_TURBO_MINI_DIMS.to_dict(), "model_type": "whisper"}
    assert load_model(tmp_path / "a").dims == LARGE_V3_TURBO_MINI_DIMS


def test_full_twin_config_is_the_artifacts() -> None:
    spec = get_twin("whisper-large-v3-turbo")
    assert spec.config_summary()["weight_dtype"] == "float32"
    assert get_twin("whisper-large-v3-turbo-fp16").config_summary()["weight_dtype"] == "float16"
    assert spec.dims.to_dict() == {
        "n_mels": 128,
        "n_audio_ctx": 1500,
        "n_audio_state": 1280,
        "n_audio_head": 20,
        "n_audio_layer": 32,
        "n_vocab": 51866,
        "n_text_ctx": 448,
        "n_text_state": 1280,
        "n_text_head": 20,
        "n_text_layer": 4,
    }
