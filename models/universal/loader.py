"""load_model: a model directory (config.json + safetensors) -> UniversalLlama.

Loading is strict: every tensor in the files must land on a parameter of the module tree
the config describes, and every parameter must be given a tensor, with the same shape.
Anything else is a WeightLoadError naming the tensors. Weights keep the dtype they were
stored in, as mlx-lm keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from models.universal.config import LlamaConfig, QuantSpec, read_config_json
from models.universal.errors import WeightLoadError
from models.universal.model import UniversalLlama

INDEX_FILE = "model.safetensors.index.json"
_MAX_NAMES = 20  # names listed in an error before "... and N more"


def load_model(path: str | Path) -> tuple[UniversalLlama, LlamaConfig]:
    """Build the model the config describes and load its weights into it, strictly."""
    path = Path(path)
    config = LlamaConfig.from_dict(read_config_json(path))
    weights = sanitize(read_safetensors(path), config)
    model = UniversalLlama(config)
    if config.quantization is not None:
        quantize_modules(model, config, weights)
    load_weights_strict(model, weights)
    model.eval()
    mx.eval(model.parameters())
    return model, config


def read_safetensors(path: Path) -> dict[str, mx.array]:
    """All tensors of the model: the shards named by the index, else model*.safetensors."""
    index_path = path / INDEX_FILE
    if index_path.exists():
        with open(index_path, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map = {}
        files = sorted(p.name for p in path.glob("model*.safetensors"))
    if not files:
        raise WeightLoadError(f"no model*.safetensors in {path}")
    weights: dict[str, mx.array] = {}
    for name in files:
        shard = path / name
        if not shard.exists():
            raise WeightLoadError(f"{INDEX_FILE} names {name}, which is not in {path}")
        tensors = mx.load(str(shard))
        duplicates = weights.keys() & tensors.keys()
        if duplicates:
            raise WeightLoadError(f"tensors stored twice (again in {name}): {_names(duplicates)}")
        weights.update(tensors)
    if weight_map:
        unlisted = weights.keys() - weight_map.keys()
        absent = weight_map.keys() - weights.keys()
        if unlisted or absent:
            raise WeightLoadError(
                f"{INDEX_FILE} disagrees with the shards: in shards but not indexed "
                f"{_names(unlisted)}; indexed but in no shard {_names(absent)}"
            )
    return weights


def sanitize(weights: dict[str, mx.array], config: LlamaConfig) -> dict[str, mx.array]:
    """Drop the tensors mlx-lm's Llama drops: cached rope tables and a tied lm_head."""
    kept = {k: v for k, v in weights.items() if "self_attn.rotary_emb.inv_freq" not in k}
    if config.tie_word_embeddings:
        kept.pop("lm_head.weight", None)
    return kept


def quantize_modules(model: nn.Module, config: LlamaConfig, weights: dict[str, mx.array]) -> None:
    """Swap Linear/Embedding modules for their quantized versions, as mlx-lm decides.

    mlx-lm's rule: a module named in the config's per-module map gets that entry (a spec,
    or `false` for none); otherwise it is quantized only if the files hold its `.scales`,
    with the group size and bits the stored shapes imply.
    """
    quantization = config.quantization
    assert quantization is not None

    def spec_for(path: str, module: nn.Module) -> dict | bool:
        if path in quantization.per_module:
            spec = quantization.per_module[path]
            return False if spec is None else spec.as_kwargs()
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return infer_spec(path, module, weights).as_kwargs()

    default = quantization.default
    nn.quantize(
        model,
        group_size=default.group_size,
        bits=default.bits,
        mode=default.mode,
        class_predicate=spec_for,
    )


def infer_spec(path: str, module: nn.Module, weights: dict[str, mx.array]) -> QuantSpec:
    """Recover group size, bits and mode from the packed shapes (mlx-lm's rule)."""
    scales = weights[f"{path}.scales"]
    packed = weights.get(f"{path}.weight")
    if packed is None:
        raise WeightLoadError(f"{path}.scales is stored but {path}.weight is missing")
    in_dims = module.weight.shape[-1]
    group_size = in_dims // scales.shape[-1]
    bits = (packed.shape[-1] * 32) // in_dims
    # Only affine keeps scales in a float dtype; the fp modes each allow one shape.
    if scales.dtype != mx.uint8:
        return QuantSpec(group_size=group_size, bits=bits, mode="affine")
    fp_modes = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}
    if (bits, group_size) not in fp_modes:
        raise WeightLoadError(f"{path}: cannot infer the quantization mode of {bits} bits, group size {group_size}")
    return QuantSpec(group_size=group_size, bits=bits, mode=fp_modes[(bits, group_size)])


def load_weights_strict(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Put every tensor on its parameter; any mismatch is one error listing all of them."""
    expected = dict(tree_flatten(model.parameters()))
    unknown = weights.keys() - expected.keys()
    missing = expected.keys() - weights.keys()
    problems = []
    if unknown:
        problems.append(f"unknown tensors (no such parameter): {_names(unknown)}")
    if missing:
        problems.append(f"missing tensors (parameter not in the files): {_names(missing)}")
    for name in sorted(weights.keys() & expected.keys()):
        want, got = expected[name], weights[name]
        if want.shape != got.shape:
            problems.append(f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif want.dtype == mx.uint32 and got.dtype != mx.uint32:
            problems.append(f"{name}: packed weight stored as {got.dtype}, expected uint32")
    if problems:
        raise WeightLoadError("weights do not match the model:\n  " + "\n  ".join(problems))
    model.update(tree_unflatten(list(weights.items())))


def _names(names: set[str] | frozenset[str]) -> str:
    ordered = sorted(names)
    shown = ", ".join(ordered[:_MAX_NAMES])
    extra = len(ordered) - _MAX_NAMES
    return shown + (f" ... and {extra} more" if extra > 0 else "")
