"""Load an mlx-whisper model directory (config.json + weights.safetensors or weights.npz).

Strict where mlx-whisper's loader is lenient: its `model.update` silently ignores a
misnamed tensor and leaves the random initialisation in place. Here every parameter of
the graph must be present with its exact shape, nothing unknown may be left over (the
optional `alignment_heads` int tensor aside), and the config must hold exactly the
ModelDimensions keys plus `model_type`.

Weights keep their stored dtype; `dtype` is the model dtype mlx-whisper takes (it sets
the encoder's sinusoids and the causal mask, and is what the caller casts the mel to).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from models.whisper.model import ModelDimensions, Whisper

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("weights.safetensors", "weights.npz")
ALIGNMENT_HEADS = "alignment_heads"

_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
_INT_DTYPES = (mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64)


def read_dimensions(model_dir: Path) -> ModelDimensions:
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {model_dir}")
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if "quantization" in config:
        raise ValueError(f"{path}: quantized Whisper checkpoints are not supported")
    if config.get("model_type", "whisper") != "whisper":
        raise ValueError(f"{path}: model_type {config['model_type']!r} is not 'whisper'")
    return ModelDimensions.from_dict(config)


def _weights_file(model_dir: Path) -> Path:
    for name in WEIGHT_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise FileNotFoundError(f"no {' or '.join(WEIGHT_FILES)} in {model_dir}")


def check_weights(model: Whisper, weights: dict[str, mx.array]) -> None:
    """Raise ValueError naming every missing, unknown or misshaped tensor."""
    expected = {name: tuple(p.shape) for name, p in tree_flatten(model.parameters()) if name != ALIGNMENT_HEADS}
    problems = []
    for name, shape in sorted(expected.items()):
        if name not in weights:
            problems.append(f"missing tensor {name} (expected shape {list(shape)})")
        elif tuple(weights[name].shape) != shape:
            problems.append(f"tensor {name} has shape {list(weights[name].shape)}, expected {list(shape)}")
        elif weights[name].dtype not in _FLOAT_DTYPES:
            problems.append(f"tensor {name} has dtype {weights[name].dtype}, expected a float dtype")
    for name in sorted(set(weights) - set(expected)):
        if name == ALIGNMENT_HEADS:
            heads = weights[name]
            if heads.ndim != 2 or heads.shape[1] != 2 or heads.dtype not in _INT_DTYPES:
                problems.append(
                    f"tensor {name} must be [n, 2] integer (layer, head) pairs, got {list(heads.shape)} {heads.dtype}"
                )
        else:
            problems.append(f"unknown tensor {name} (shape {list(weights[name].shape)})")
    if problems:
        raise ValueError("whisper weights do not match the model:\n  " + "\n  ".join(problems))


def load_model(model_dir: str | Path, dtype: mx.Dtype = mx.float32) -> Whisper:
    """The Whisper in `model_dir`, weights loaded and evaluated."""
    model_dir = Path(model_dir)
    dims = read_dimensions(model_dir)
    weights = mx.load(str(_weights_file(model_dir)))
    assert isinstance(weights, dict)
    model = Whisper(dims, dtype)
    check_weights(model, weights)
    if ALIGNMENT_HEADS in weights:
        model.set_alignment_heads(weights.pop(ALIGNMENT_HEADS))
    model.update(tree_unflatten(list(weights.items())))
    mx.eval(model.parameters())
    return model
