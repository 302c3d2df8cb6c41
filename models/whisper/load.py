"""Load an mlx-whisper model directory (config.json + weights.safetensors or weights.npz).

Strict where mlx-whisper's loader is lenient: its `model.update` silently ignores a
misnamed tensor and leaves the random initialisation in place. Here every parameter of
the graph must be present with its exact shape, nothing unknown may be left over (the
optional `alignment_heads` int tensor aside), and the config must hold exactly the
ModelDimensions keys plus `model_type` and an optional `quantization`.

An MLX-quantized directory (config `quantization: {group_size, bits[, mode]}`, as
mlx-whisper's convert `-q` writes it) is loaded the way mlx-whisper's `load_models` loads
it: every `nn.Linear` / `nn.Embedding` whose `<path>.scales` the weights hold becomes a
`QuantizedLinear` / `QuantizedEmbedding` (`nn.quantize` with that predicate) before the
weights are put in; the packed weights must then be uint32 and the scales / biases float.

Weights keep their stored dtype; `dtype` is the model dtype mlx-whisper takes (it sets
the encoder's sinusoids and the causal mask, and is what the caller casts the mel to).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from models.whisper.model import ModelDimensions, Whisper

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("weights.safetensors", "weights.npz")
ALIGNMENT_HEADS = "alignment_heads"

_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
_INT_DTYPES = (mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64)


QUANTIZATION_KEY = "quantization"
_QUANTIZATION_FIELDS = {"group_size", "bits", "mode"}


def _read_config(model_dir: Path) -> tuple[Path, dict]:
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {model_dir}")
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if config.get("model_type", "whisper") != "whisper":
        raise ValueError(f"{path}: model_type {config['model_type']!r} is not 'whisper'")
    return path, config


def read_dimensions(model_dir: Path) -> ModelDimensions:
    _, config = _read_config(model_dir)
    return ModelDimensions.from_dict({k: v for k, v in config.items() if k != QUANTIZATION_KEY})


def read_quantization(model_dir: Path) -> dict | None:
    """The config's `quantization` ({group_size, bits[, mode]}: nn.quantize's keywords, as
    mlx-whisper passes them), or None for an unquantized model."""
    path, config = _read_config(model_dir)
    setting = config.get(QUANTIZATION_KEY)
    if setting is None:
        return None
    if not isinstance(setting, dict):
        raise ValueError(f"{path}: {QUANTIZATION_KEY} must be an object {{group_size, bits}}, got {setting!r}")
    unknown = sorted(set(setting) - _QUANTIZATION_FIELDS)
    ints = [k for k in ("group_size", "bits") if type(setting.get(k)) is not int or setting[k] <= 0]
    if unknown or ints or setting.get("mode", "affine") != "affine":
        raise ValueError(
            f"{path}: {QUANTIZATION_KEY} must hold positive integer group_size and bits (mode 'affine' if "
            f"given), got {setting!r}" + (f"; unknown keys {unknown}" if unknown else "")
        )
    return dict(setting)


def _weights_file(model_dir: Path) -> Path:
    for name in WEIGHT_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise FileNotFoundError(f"no {' or '.join(WEIGHT_FILES)} in {model_dir}")


def check_weights(model: Whisper, weights: dict[str, mx.array]) -> None:
    """Raise ValueError naming every missing, unknown or misshaped tensor (a quantized module's
    packed weight must be uint32 like the model's, every other tensor a float)."""
    params = {name: p for name, p in tree_flatten(model.parameters()) if name != ALIGNMENT_HEADS}
    expected = {name: tuple(p.shape) for name, p in params.items()}
    problems = []
    for name, shape in sorted(expected.items()):
        packed = params[name].dtype == mx.uint32
        if name not in weights:
            problems.append(f"missing tensor {name} (expected shape {list(shape)})")
        elif tuple(weights[name].shape) != shape:
            problems.append(f"tensor {name} has shape {list(weights[name].shape)}, expected {list(shape)}")
        elif packed and weights[name].dtype != mx.uint32:
            problems.append(f"tensor {name} has dtype {weights[name].dtype}, expected uint32 (quantized)")
        elif not packed and weights[name].dtype not in _FLOAT_DTYPES:
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
    quantization = read_quantization(model_dir)
    if quantization is not None:
        # mlx-whisper's load_models: quantize exactly the modules the weights hold scales for.
        nn.quantize(
            model,
            **quantization,
            class_predicate=lambda path, m: isinstance(m, nn.Linear | nn.Embedding) and f"{path}.scales" in weights,
        )
    check_weights(model, weights)
    if ALIGNMENT_HEADS in weights:
        model.set_alignment_heads(weights.pop(ALIGNMENT_HEADS))
    model.update(tree_unflatten(list(weights.items())))
    mx.eval(model.parameters())
    return model
