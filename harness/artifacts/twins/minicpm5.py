"""Twins of openbmb/MiniCPM5-2B-MLX (revision 3d00c3da500debfe345e60e25a87ed2669f5b1ee).

Design notes: docs/twins.md ("MiniCPM5-2B twins")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from harness.artifacts.twins.bpe import SpecialToken, build_tokenizer, live_id_ranges
from harness.artifacts.twins.corpus import CORPUS
from harness.artifacts.twins.spec import LlamaShape, QuantSettings, TwinSpec
from harness.artifacts.twins.weights import write_weights

VOCAB_SIZE = 130560
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<unk>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [
    SpecialToken(UNK, 0),
    SpecialToken(EOS, 1),
    SpecialToken(BOS, 2),
    SpecialToken(IM_START, 130072),
    SpecialToken(IM_END, 130073),
    SpecialToken("<think>", 130074),
    SpecialToken("</think>", 130075),
    SpecialToken("<tool_call>", 130076),
    SpecialToken("</tool_call>", 130077),
    SpecialToken("<tool_response>", 130078),
    SpecialToken("</tool_response>", 130079),
]
TOKEN_IDS = {t.content: t.token_id for t in SPECIAL_TOKENS}
EOS_TOKEN_IDS = (TOKEN_IDS[EOS], TOKEN_IDS[IM_END])
FIRST_BPE_ID = 3
BPE_VOCAB_SIZE = 4096  # an upper bound: the training text runs out of pairs first (~1.8k)
MAX_POSITIONS = 32768
RMS_NORM_EPS = 1e-06
ROPE_THETA = 5000000.0
CHAT_TEMPLATE_FILE = Path(__file__).with_name("minicpm5_chat_template.jinja")

MINICPM5_2B_SHAPE = LlamaShape(
    num_hidden_layers=42,
    hidden_size=2048,
    intermediate_size=6144,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=128,
    vocab_size=VOCAB_SIZE,
)
# the mini twin: the full model's vocabulary and grouped KV heads, a smaller body
MINICPM5_2B_MINI_SHAPE = dataclasses.replace(
    MINICPM5_2B_SHAPE, num_hidden_layers=4, hidden_size=256, intermediate_size=768, num_attention_heads=4, head_dim=64
)


def training_text() -> list[str]:
    """The BPE training text: the prose corpus plus the chat template, so chat markup
    tokenizes into a few pieces, as it does for a model trained on its own format."""
    return [*CORPUS, CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")]


def _token_dict(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def model_config(spec: TwinSpec) -> dict[str, Any]:
    """config.json, keys sorted and the quantization copied, as mlx-lm's save_config writes it."""
    shape = spec.shape
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": TOKEN_IDS[BOS],
        "eos_token_id": list(spec.eos_token_ids),
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        **(
            {"quantization": spec.quantization.as_config(), "quantization_config": spec.quantization.as_config()}
            if spec.quantization is not None
            else {"torch_dtype": spec.float_dtype}  # a float control twin: unquantized matrices
        ),
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "use_cache": True,
        "vocab_size": shape.vocab_size,
    }
    return dict(sorted(config.items()))


def tokenizer_config() -> dict[str, Any]:
    """tokenizer_config.json: no chat_template inside (it ships as chat_template.jinja).

    PreTrainedTokenizerFast makes transformers load tokenizer.json exactly as written.
    """
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {str(t.token_id): {**_token_dict(t.content), "special": True} for t in SPECIAL_TOKENS},
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_max_length": MAX_POSITIONS,
        "pad_token": PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
    }


def special_tokens_map() -> dict[str, Any]:
    return {
        "bos_token": _token_dict(BOS),
        "eos_token": _token_dict(EOS),
        "pad_token": _token_dict(PAD),
        "unk_token": _token_dict(UNK),
    }


def generation_config(spec: TwinSpec) -> dict[str, Any]:
    # mlx-lm replaces config.json's eos_token_id with this one when it is set.
    return {
        "bos_token_id": TOKEN_IDS[BOS],
        "eos_token_id": list(spec.eos_token_ids),
        "pad_token_id": TOKEN_IDS[PAD],
    }


def _write_json(path: Path, obj: Any, indent: int = 2) -> None:
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def write_minicpm5(spec: TwinSpec, out_dir: Path) -> None:
    """Write the artifact's files for `spec` into the empty directory `out_dir`."""
    vocab_size = spec.shape.vocab_size
    tokenizer = build_tokenizer(training_text(), BPE_VOCAB_SIZE, vocab_size, SPECIAL_TOKENS, FIRST_BPE_ID)
    live_vocab = live_id_ranges(tokenizer, vocab_size)
    write_weights(out_dir, spec.shape, spec.seed, spec.quantization, spec.num_shards, live_vocab, spec.float_dtype)
    _write_json(out_dir / "config.json", model_config(spec), indent=4)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config())
    _write_json(out_dir / "special_tokens_map.json", special_tokens_map())
    _write_json(out_dir / "generation_config.json", generation_config(spec))
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE_FILE.read_text(encoding="utf-8"), encoding="utf-8")


def _spec(
    twin_id: str, description: str, seed: int, shape: LlamaShape, float_dtype: str = "float32", quantized: bool = True
) -> TwinSpec:
    return TwinSpec(
        float_dtype=float_dtype,
        twin_id=twin_id,
        description=description,
        seed=seed,
        shape=shape,
        quantization=QuantSettings(group_size=64, bits=4) if quantized else None,
        num_shards=2,
        rope_theta=ROPE_THETA,
        eos_token_ids=EOS_TOKEN_IDS,
        write=write_minicpm5,
    )


MINICPM5_2B = _spec(
    "minicpm5-2b",
    "openbmb/MiniCPM5-2B-MLX@3d00c3da: exact config, seeded random 4-bit weights",
    seed=50_002,
    shape=MINICPM5_2B_SHAPE,
)
MINICPM5_2B_MINI = _spec(
    "minicpm5-2b-mini",
    "MiniCPM5-2B structure, vocabulary and special ids at small dimensions, for CPU tests",
    seed=50_003,
    shape=MINICPM5_2B_MINI_SHAPE,
)
# The mini twin's weights with bfloat16 scales, biases and norms: half-precision activations,
# which mlx-optiq's fused quantized SDPA needs to activate (it falls back to stock for fp32).
MINICPM5_2B_MINI_BF16 = _spec(
    "minicpm5-2b-mini-bf16",
    "the minicpm5-2b-mini twin with bfloat16 scales, biases and norms (half-precision activations)",
    seed=50_003,
    shape=MINICPM5_2B_MINI_SHAPE,
    float_dtype="bfloat16",
)
# The same weights with float16 scales, biases and norms: the float16 counterpart of the bf16 twin,
# for faults that half-precision rounding shows and float32 hides (`make mutants --model`).
MINICPM5_2B_MINI_FP16 = _spec(
    "minicpm5-2b-mini-fp16",
    "the minicpm5-2b-mini twin with float16 scales, biases and norms (half-precision activations)",
    seed=50_003,
    shape=MINICPM5_2B_MINI_SHAPE,
    float_dtype="float16",
)
# A smaller twin of the same tokenizer with other seeded weights: a draft model for the mini
# twin's speculative-decoding scenarios that (random against random) is always rejected.
MINICPM5_2B_MINI_DRAFT = _spec(
    "minicpm5-2b-mini-draft",
    "a 2-layer MiniCPM5 twin (the mini twin's vocabulary and dims, other seed): a draft model",
    seed=50_004,
    shape=dataclasses.replace(MINICPM5_2B_MINI_SHAPE, num_hidden_layers=2),
)
# The full-size twin in bfloat16 (the real artifact's likely dtype): for the GPU, where half
# precision is fast and mlx-optiq's fused quantized SDPA activates.
MINICPM5_2B_BF16 = _spec(
    "minicpm5-2b-bf16",
    "openbmb/MiniCPM5-2B-MLX@3d00c3da: exact config, the full twin's weights with bfloat16 scales/biases/norms",
    seed=50_002,
    shape=MINICPM5_2B_SHAPE,
    float_dtype="bfloat16",
)
# Float controls of the quality pairs (docs/quality.md): the same seeded draws as the 4-bit twins
# above, before they are quantized, so "4-bit twin against float control twin" is what "official
# 4-bit against its BF16 source" is for the real weights. bfloat16 at full size (the real source's
# dtype, for the GPU); float32 for the mini (the CPU computes half precision 10-40x slower).
MINICPM5_2B_FLOAT_BF16 = _spec(
    "minicpm5-2b-float-bf16",
    "the minicpm5-2b twin's seeded draws unquantized, in bfloat16: the float control of its quality pair",
    seed=50_002,
    shape=MINICPM5_2B_SHAPE,
    float_dtype="bfloat16",
    quantized=False,
)
MINICPM5_2B_MINI_FLOAT = _spec(
    "minicpm5-2b-mini-float",
    "the minicpm5-2b-mini twin's seeded draws unquantized, in float32: the float control of its quality pair",
    seed=50_003,
    shape=MINICPM5_2B_MINI_SHAPE,
    quantized=False,
)
