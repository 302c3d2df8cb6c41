"""Seeded random Llama weights, quantized as they are made, written as mlx-lm's shards.

Design notes: docs/twins.md ("Twin weights")."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from harness.artifacts.twins.spec import LlamaShape, QuantSettings

CHUNK_ELEMENTS = 1 << 24
NORM_JITTER = 0.1
LM_HEAD_GAIN = 3.0
QUIET_ROW_GAIN = 0.5
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class ModuleInit:
    """One module of the model: a matrix to quantize or a norm vector to keep."""

    name: str  # module path, e.g. "model.layers.3.mlp.down_proj"
    rows: int  # output features (embedding: vocabulary rows)
    cols: int  # input features; 0 for a norm
    std: float  # norms: the jitter around 1
    # Row ranges [start, stop) drawn at `std`; the other rows at `std * QUIET_ROW_GAIN`.
    # None: every row at `std`.
    live_rows: tuple[tuple[int, int], ...] | None = None

    @property
    def is_norm(self) -> bool:
        return self.cols == 0

    def nbytes(self, quant: QuantSettings | None) -> int:
        """Stored bytes: packed uint32 weight plus float32 scales and biases, or a float32 norm
        (or matrix, unquantized)."""
        if self.is_norm or quant is None:
            return 4 * self.rows * max(self.cols, 1)
        groups = self.cols // quant.group_size
        return self.rows * self.cols * quant.bits // 8 + 2 * 4 * self.rows * groups

    def tensor_names(self, quantized: bool = True) -> list[str]:
        if self.is_norm or not quantized:
            return [f"{self.name}.weight"]
        return [f"{self.name}.{part}" for part in ("weight", "scales", "biases")]


def plan_modules(shape: LlamaShape, live_vocab: tuple[tuple[int, int], ...] | None = None) -> list[ModuleInit]:
    """Every module: embedding, the layers in order (modules by name), final norm, lm_head."""
    hidden, inter = shape.hidden_size, shape.intermediate_size
    residual_gain = (2 * shape.num_hidden_layers) ** -0.5
    modules = [ModuleInit("model.embed_tokens", shape.vocab_size, hidden, 1.0)]
    for i in range(shape.num_hidden_layers):
        prefix = f"model.layers.{i}"
        modules += [
            ModuleInit(f"{prefix}.input_layernorm", hidden, 0, NORM_JITTER),
            ModuleInit(f"{prefix}.mlp.down_proj", hidden, inter, residual_gain * inter**-0.5),
            ModuleInit(f"{prefix}.mlp.gate_proj", inter, hidden, hidden**-0.5),
            ModuleInit(f"{prefix}.mlp.up_proj", inter, hidden, hidden**-0.5),
            ModuleInit(f"{prefix}.post_attention_layernorm", hidden, 0, NORM_JITTER),
            ModuleInit(f"{prefix}.self_attn.k_proj", shape.kv_size, hidden, hidden**-0.5),
            ModuleInit(f"{prefix}.self_attn.o_proj", hidden, shape.q_size, residual_gain * shape.q_size**-0.5),
            ModuleInit(f"{prefix}.self_attn.q_proj", shape.q_size, hidden, hidden**-0.5),
            ModuleInit(f"{prefix}.self_attn.v_proj", shape.kv_size, hidden, hidden**-0.5),
        ]
    modules.append(ModuleInit("model.norm", hidden, 0, NORM_JITTER))
    if not shape.tie_word_embeddings:
        modules.append(ModuleInit("lm_head", shape.vocab_size, hidden, LM_HEAD_GAIN * hidden**-0.5, live_vocab))
    return modules


def plan_shards(modules: list[ModuleInit], num_shards: int, quant: QuantSettings | None) -> list[list[ModuleInit]]:
    """Split the modules, in order and whole, into `num_shards` runs of similar byte size.

    A module goes to the shard its first byte falls in; a module's tensors never straddle
    two files, as in mlx-lm's shards (it splits between tensors, we between modules).
    """
    sizes = [m.nbytes(quant) for m in modules]
    total = sum(sizes)
    shards: list[list[ModuleInit]] = [[] for _ in range(num_shards)]
    offset = 0
    for module, size in zip(modules, sizes, strict=True):
        shards[min(offset * num_shards // total, num_shards - 1)].append(module)
        offset += size
    if any(not shard for shard in shards):
        raise ValueError(f"cannot split {len(modules)} modules into {num_shards} non-empty shards")
    return shards


def shard_file_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def _row_chunks(module: ModuleInit, seed: int) -> Iterator[np.ndarray]:
    """The module's values, `CHUNK_ELEMENTS` at most at a time, each chunk its own stream."""
    width = max(module.cols, 1)
    rows_per_chunk = max(1, CHUNK_ELEMENTS // width)
    for chunk, start in enumerate(range(0, module.rows, rows_per_chunk)):
        rows = min(rows_per_chunk, module.rows - start)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _name_key(module.name), chunk])))
        values = rng.standard_normal((rows, module.cols) if module.cols else (rows,), dtype=np.float32)
        values *= np.float32(module.std)
        if module.live_rows is not None:
            gains = np.full((rows, 1), QUIET_ROW_GAIN, dtype=np.float32)
            for live_start, live_stop in module.live_rows:
                gains[max(live_start - start, 0) : max(live_stop - start, 0)] = 1.0
            values *= gains
        if module.is_norm:
            values += np.float32(1.0)
        yield values


def make_module_tensors(module: ModuleInit, seed: int, quant: QuantSettings | None) -> dict[str, mx.array]:
    """Draw one module and return its stored tensors (weight[, scales, biases]); with `quant`
    None the matrix as drawn (float32), the values its quantized twin quantizes."""
    if module.is_norm:
        (values,) = list(_row_chunks(module, seed))
        return {f"{module.name}.weight": mx.array(values)}
    if quant is None:
        chunks = [mx.array(values) for values in _row_chunks(module, seed)]
        weight = chunks[0] if len(chunks) == 1 else mx.concatenate(chunks)
        mx.eval(weight)
        return {f"{module.name}.weight": weight}
    if module.cols % quant.group_size:
        raise ValueError(f"{module.name}: {module.cols} input features not a multiple of {quant.group_size}")
    parts: list[tuple[mx.array, mx.array, mx.array]] = []
    for values in _row_chunks(module, seed):
        packed, scales, biases = mx.quantize(mx.array(values), group_size=quant.group_size, bits=quant.bits)
        mx.eval(packed, scales, biases)  # free the float32 chunk before drawing the next
        parts.append((packed, scales, biases))
    tensors = {
        f"{module.name}.{kind}": parts[0][k] if len(parts) == 1 else mx.concatenate([p[k] for p in parts])
        for k, kind in enumerate(("weight", "scales", "biases"))
    }
    mx.eval(list(tensors.values()))
    return tensors


def logical_parameters(modules: list[ModuleInit]) -> int:
    """Parameter count as mlx-lm's index metadata counts it (unpacked weights, no scales)."""
    return sum(m.rows * max(m.cols, 1) for m in modules)


def write_weights(
    out_dir: Path,
    shape: LlamaShape,
    seed: int,
    quant: QuantSettings | None,
    num_shards: int,
    live_vocab: tuple[tuple[int, int], ...] | None = None,
    float_dtype: str = "float32",
) -> None:
    """Write the shards and model.safetensors.index.json into `out_dir`.

    With `float_dtype` other than float32, every floating tensor (scales, biases, norms) is
    the float32 draw rounded to that dtype, so a half-precision twin is the float32 twin's
    weights in half precision (its activations then run in that dtype).
    """
    modules = plan_modules(shape, live_vocab)
    shards = plan_shards(modules, num_shards, quant)
    weight_map: dict[str, str] = {}
    total_size = 0
    for index, shard_modules in enumerate(shards):
        file_name = shard_file_name(index, num_shards)
        tensors: dict[str, mx.array] = {}
        for module in shard_modules:
            tensors.update(make_module_tensors(module, seed, quant))
        if float_dtype != "float32":
            half = getattr(mx, float_dtype)
            tensors = {k: t.astype(half) if mx.issubdtype(t.dtype, mx.floating) else t for k, t in tensors.items()}
        mx.save_safetensors(str(out_dir / file_name), tensors, metadata={"format": "mlx"})
        total_size += sum(t.nbytes for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, file_name))
        del tensors
    index = {
        "metadata": {"total_size": total_size, "total_parameters": logical_parameters(modules)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=4) + "\n", encoding="utf-8")
