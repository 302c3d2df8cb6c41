"""Twins of mlx-community/whisper-large-v3-turbo: its mlx-whisper layout, seeded random weights.

Design notes: docs/twins.md ("Whisper large-v3-turbo twins")."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from harness.artifacts.wheels import WheelMember, fetch_wheel_member
from models.whisper.model import ModelDimensions

EMBEDDING_GAIN = 3.0
POSITION_STD = 2.0
CROSS_ATTENTION_GAIN = 2.4
NORM_JITTER = 0.1
BIAS_STD = 0.02
WEIGHT_DTYPES = {"float32": np.float32, "float16": np.float16}

# The multilingual vocabulary, from the mlx-whisper wheel (openai-whisper ships only an
# sdist on PyPI; the file is the same data openai-whisper's assets hold).
VOCABULARY_FILE = "multilingual.tiktoken"
VOCABULARY_SOURCE = WheelMember(
    package="mlx-whisper",
    version="0.4.3",
    file="mlx_whisper/assets/multilingual.tiktoken",
    sha256="b34b360dbb493e781e479794586d661700670d65564001f23024971d1f2fa126",
)

LARGE_V3_TURBO_DIMS = ModelDimensions(
    n_mels=128,
    n_audio_ctx=1500,
    n_audio_state=1280,
    n_audio_head=20,
    n_audio_layer=32,
    n_vocab=51866,
    n_text_ctx=448,
    n_text_state=1280,
    n_text_head=20,
    n_text_layer=4,
)
# the mini twin: large-v3-turbo's Mel bins, contexts and vocabulary, a smaller body
LARGE_V3_TURBO_MINI_DIMS = replace(  # the encoder and the decoder alike: width 64, 2 heads, 2 layers
    LARGE_V3_TURBO_DIMS,
    **{f"n_{side}_{key}": n for side in ("audio", "text") for key, n in (("state", 64), ("head", 2), ("layer", 2))},
)
LARGE_V3_TURBO_ALIGNMENT_HEADS = ((2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14))
MINI_ALIGNMENT_HEADS = ((1, 0), (1, 1))


@dataclass(frozen=True)
class WhisperTwinSpec:
    """One registered Whisper twin; `write` is a pure function of the spec (same bytes every build)."""

    twin_id: str
    description: str
    seed: int
    dims: ModelDimensions
    weight_dtype: str
    alignment_heads: tuple[tuple[int, int], ...]
    write: Callable[[WhisperTwinSpec, Path], None]

    def config_summary(self) -> dict[str, Any]:
        return {
            "model_type": "whisper",
            **self.dims.to_dict(),
            "weight_dtype": self.weight_dtype,
            "alignment_heads": [list(pair) for pair in self.alignment_heads],
            "vocabulary": f"{VOCABULARY_SOURCE.package}=={VOCABULARY_SOURCE.version}:{VOCABULARY_SOURCE.file}",
        }


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True)
class TensorInit:
    name: str
    shape: tuple[int, ...]
    std: float
    center: float = 0.0  # norms: 1 + jitter


def _linear(name: str, n_out: int, n_in: int, gain: float = 1.0, bias: bool = True) -> list[TensorInit]:
    tensors = [TensorInit(f"{name}.weight", (n_out, n_in), gain * n_in**-0.5)]
    return tensors + ([TensorInit(f"{name}.bias", (n_out,), BIAS_STD)] if bias else [])


def _norm(name: str, n: int) -> list[TensorInit]:
    return [TensorInit(f"{name}.weight", (n,), NORM_JITTER, 1.0), TensorInit(f"{name}.bias", (n,), BIAS_STD)]


def _block(prefix: str, n: int, residual_gain: float, cross: bool) -> list[TensorInit]:
    tensors = _norm(f"{prefix}.attn_ln", n)
    tensors += _linear(f"{prefix}.attn.query", n, n)
    tensors += _linear(f"{prefix}.attn.key", n, n, bias=False)
    tensors += _linear(f"{prefix}.attn.value", n, n)
    tensors += _linear(f"{prefix}.attn.out", n, n, residual_gain)
    if cross:
        tensors += _norm(f"{prefix}.cross_attn_ln", n)
        tensors += _linear(f"{prefix}.cross_attn.query", n, n)
        tensors += _linear(f"{prefix}.cross_attn.key", n, n, bias=False)
        tensors += _linear(f"{prefix}.cross_attn.value", n, n)
        tensors += _linear(f"{prefix}.cross_attn.out", n, n, CROSS_ATTENTION_GAIN)
    tensors += _norm(f"{prefix}.mlp_ln", n)
    tensors += _linear(f"{prefix}.mlp1", 4 * n, n)
    tensors += _linear(f"{prefix}.mlp2", n, 4 * n, residual_gain)
    return tensors


def plan_tensors(dims: ModelDimensions) -> list[TensorInit]:
    """Every float tensor of the mlx-whisper layout with its init; conv weights are [out, k, in]."""
    audio, text = dims.n_audio_state, dims.n_text_state
    tensors = [
        TensorInit("encoder.conv1.weight", (audio, 3, dims.n_mels), (3 * dims.n_mels) ** -0.5),
        TensorInit("encoder.conv1.bias", (audio,), BIAS_STD),
        TensorInit("encoder.conv2.weight", (audio, 3, audio), (3 * audio) ** -0.5),
        TensorInit("encoder.conv2.bias", (audio,), BIAS_STD),
    ]
    encoder_gain = (2 * dims.n_audio_layer) ** -0.5
    for i in range(dims.n_audio_layer):
        tensors += _block(f"encoder.blocks.{i}", audio, encoder_gain, cross=False)
    tensors += _norm("encoder.ln_post", audio)
    embedding_std = EMBEDDING_GAIN * text**-0.5
    tensors += [
        TensorInit("decoder.token_embedding.weight", (dims.n_vocab, text), embedding_std),
        TensorInit("decoder.positional_embedding", (dims.n_text_ctx, text), POSITION_STD),
    ]
    decoder_gain = (3 * dims.n_text_layer) ** -0.5
    for i in range(dims.n_text_layer):
        tensors += _block(f"decoder.blocks.{i}", text, decoder_gain, cross=True)
    tensors += _norm("decoder.ln", text)
    return sorted(tensors, key=lambda t: t.name)


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def draw_tensor(init: TensorInit, seed: int) -> np.ndarray:
    """The tensor's float32 values: its own PCG64 stream, seeded by (seed, name)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _name_key(init.name)])))
    values = rng.standard_normal(init.shape, dtype=np.float32)
    values *= np.float32(init.std)
    if init.center:
        values += np.float32(init.center)
    return values


def make_weights(
    dims: ModelDimensions, seed: int, weight_dtype: str, alignment_heads: tuple[tuple[int, int], ...]
) -> Iterator[tuple[str, mx.array]]:
    """(name, tensor) in name order: the float tensors, then `alignment_heads` (int64)."""
    np_dtype = WEIGHT_DTYPES[weight_dtype]
    for init in plan_tensors(dims):
        yield init.name, mx.array(draw_tensor(init, seed).astype(np_dtype, copy=False))
    yield "alignment_heads", mx.array(np.asarray(alignment_heads, dtype=np.int64).reshape(-1, 2))


def write_whisper_weights(
    out_dir: Path, dims: ModelDimensions, seed: int, weight_dtype: str, alignment_heads: tuple[tuple[int, int], ...]
) -> None:
    """config.json and weights.safetensors (no vocabulary: that needs the pinned wheel)."""
    config = {**dims.to_dict(), "model_type": "whisper"}
    (out_dir / "config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    tensors = dict(make_weights(dims, seed, weight_dtype, alignment_heads))
    mx.save_safetensors(str(out_dir / "weights.safetensors"), tensors)


def write_whisper_twin(spec: WhisperTwinSpec, out_dir: Path) -> None:
    """Write the artifact's files for `spec` (plus the vocabulary) into the empty `out_dir`."""
    write_whisper_weights(out_dir, spec.dims, spec.seed, spec.weight_dtype, spec.alignment_heads)
    shutil.copyfile(fetch_wheel_member(VOCABULARY_SOURCE), out_dir / VOCABULARY_FILE)


def _spec(twin_id: str, description: str, dims: ModelDimensions, weight_dtype: str, heads) -> WhisperTwinSpec:
    for layer, head in heads:
        if not (0 <= layer < dims.n_text_layer and 0 <= head < dims.n_text_head):
            raise ValueError(f"{twin_id}: alignment head ({layer}, {head}) out of range")
    return WhisperTwinSpec(
        twin_id=twin_id,
        description=description,
        seed=51_866,
        dims=dims,
        weight_dtype=weight_dtype,
        alignment_heads=heads,
        write=write_whisper_twin,
    )


WHISPER_LARGE_V3_TURBO = _spec(
    "whisper-large-v3-turbo",
    "mlx-community/whisper-large-v3-turbo: exact dims, seeded random weights in float32 (CPU)",
    LARGE_V3_TURBO_DIMS,
    "float32",
    LARGE_V3_TURBO_ALIGNMENT_HEADS,
)
WHISPER_LARGE_V3_TURBO_FP16 = _spec(
    "whisper-large-v3-turbo-fp16",
    "mlx-community/whisper-large-v3-turbo: exact dims, the float32 twin's weights rounded to float16 (GPU)",
    LARGE_V3_TURBO_DIMS,
    "float16",
    LARGE_V3_TURBO_ALIGNMENT_HEADS,
)
WHISPER_LARGE_V3_TURBO_MINI = _spec(
    "whisper-large-v3-turbo-mini",
    "whisper-large-v3-turbo structure, 128 mels, 51866 ids; width 64, 2 heads, 2+2 layers (fast tests)",
    LARGE_V3_TURBO_MINI_DIMS,
    "float32",
    MINI_ALIGNMENT_HEADS,
)
WHISPER_TWINS = (WHISPER_LARGE_V3_TURBO, WHISPER_LARGE_V3_TURBO_FP16, WHISPER_LARGE_V3_TURBO_MINI)
