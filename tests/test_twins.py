"""Tests of the synthetic twins (harness/twins): build, layout, tokenizer, template, logits, family.

Everything runs on the mini MiniCPM5 twin (about 48 MB, built in seconds) with the
in-tree universal Llama and ChatTokenizer; the full twin's facts are checked from its
spec and config without building 1.5 GB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from harness.artifacts.twins import TWIN_FILE, TWIN_VERSION, TWINS, build_twin, detect_family, get_twin
from harness.artifacts.twins.bpe import PLACEHOLDER
from harness.artifacts.twins.minicpm5 import MINICPM5_2B, MINICPM5_2B_MINI, model_config
from harness.artifacts.twins.weights import INDEX_FILE, logical_parameters, plan_modules, plan_shards
from models.universal import ChatTokenizer, greedy_steps, load_model

MINI = "minicpm5-2b-mini"
EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    INDEX_FILE,
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    TWIN_FILE,
}
SPECIAL_IDS = {
    "<unk>": 0,
    "</s>": 1,
    "<s>": 2,
    "<|im_start|>": 130072,
    "<|im_end|>": 130073,
    "<think>": 130074,
    "</think>": 130075,
    "<tool_call>": 130076,
    "</tool_call>": 130077,
    "<tool_response>": 130078,
    "</tool_response>": 130079,
}
PLAIN = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
PLAIN_PROMPT = (
    "<s><|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon <FR>\nRhone"}}},
        ],
    },
    {"role": "tool", "content": '{"temperature": 21}'},
    {"role": "tool", "content": '{"temperature": 19}'},
    {"role": "user", "content": "And in Berlin?"},
]


@pytest.fixture(scope="module")
def mini_twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("twins") / "mini"
    return path, build_twin(MINI, path)


@pytest.fixture(scope="module")
def mini_tokenizer(mini_twin: tuple[Path, dict[str, Any]]) -> ChatTokenizer:
    return ChatTokenizer.from_dir(mini_twin[0])


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- registry and build


def test_unknown_twin_id_names_it_and_lists_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'no-such-twin'") as info:
        build_twin("no-such-twin", tmp_path / "x")
    for known in TWINS:
        assert known in str(info.value)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="no-such-twin"):
        get_twin("no-such-twin")


def test_registry_holds_both_minicpm5_twins() -> None:
    assert TWINS["minicpm5-2b"] is MINICPM5_2B
    assert TWINS[MINI] is MINICPM5_2B_MINI
    assert TWIN_VERSION


def test_the_half_precision_mini_twins_are_the_mini_draw_in_their_dtype() -> None:
    """bf16 and fp16 (make mutants --model): the mini twin's seed and shape, only the dtype of the
    scales, biases and norms differs, so a verdict that differs between them is the rounding."""
    for twin_id, dtype in (("minicpm5-2b-mini-bf16", "bfloat16"), ("minicpm5-2b-mini-fp16", "float16")):
        twin = get_twin(twin_id)
        assert (twin.seed, twin.shape, twin.float_dtype) == (MINICPM5_2B_MINI.seed, MINICPM5_2B_MINI.shape, dtype)
        assert twin.config_summary() == MINICPM5_2B_MINI.config_summary() | {"float_dtype": dtype}


def test_identity_is_returned_and_recorded(mini_twin: tuple[Path, dict[str, Any]]) -> None:
    path, identity = mini_twin
    assert identity["id"] == MINI
    assert identity["twin_version"] == TWIN_VERSION
    assert identity["seed"] == MINICPM5_2B_MINI.seed
    assert identity["config"]["vocab_size"] == 130560
    assert set(identity["files"]) == EXPECTED_FILES - {TWIN_FILE}
    assert read_json(path / TWIN_FILE) == identity


def test_two_builds_are_byte_identical(mini_twin: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    first, identity = mini_twin
    again = build_twin(MINI, tmp_path / "again")
    assert again == identity
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    for name in names:
        assert (first / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_build_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_twin(MINI, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


# --------------------------------------------------------------------------- layout


def test_layout_files_and_index_cover_every_shard_tensor(mini_twin: tuple[Path, dict[str, Any]]) -> None:
    path, _ = mini_twin
    assert {p.name for p in path.iterdir()} == EXPECTED_FILES
    index = read_json(path / INDEX_FILE)
    weight_map: dict[str, str] = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    seen: dict[str, mx.array] = {}
    for shard in shards:
        tensors = mx.load(str(path / shard))
        assert set(tensors) == {name for name, file in weight_map.items() if file == shard}
        seen.update(tensors)
    assert set(seen) == set(weight_map)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in seen.values())
    modules = plan_modules(MINICPM5_2B_MINI.shape)
    assert set(seen) == {name for module in modules for name in module.tensor_names()}
    assert index["metadata"]["total_parameters"] == logical_parameters(modules)
    for name, tensor in seen.items():
        expected = mx.uint32 if name.endswith(".weight") and not name.endswith("norm.weight") else mx.float32
        assert tensor.dtype == expected, name
    # 4-bit, group 64: 8 values per uint32, one scale per 64 inputs; untied lm_head.
    assert seen["lm_head.weight"].shape == (130560, 256 // 8)
    assert seen["lm_head.scales"].shape == (130560, 256 // 64)
    assert seen["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 64, 256 // 8)


def test_config_files_carry_the_artifact_facts(mini_twin: tuple[Path, dict[str, Any]]) -> None:
    path, _ = mini_twin
    config = read_json(path / "config.json")
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == 130560
    assert config["tie_word_embeddings"] is False
    assert config["rope_theta"] == 5_000_000
    assert config["quantization"] == config["quantization_config"] == {"group_size": 64, "bits": 4}
    assert config["eos_token_id"] == [1, 130073]
    assert config["num_attention_heads"] // config["num_key_value_heads"] == 2  # GQA kept
    assert read_json(path / "generation_config.json")["eos_token_id"] == [1, 130073]
    tokenizer_config = read_json(path / "tokenizer_config.json")
    assert "chat_template" not in tokenizer_config
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert {tokenizer_config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")} <= set(SPECIAL_IDS)
    assert (path / "chat_template.jinja").read_text().startswith("{#-")


def test_full_twin_config_is_the_exact_2b_shape() -> None:
    """Checked from the spec: the full build (1.5 GB) is too big for a unit test."""
    config = model_config(MINICPM5_2B)
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size")} == {
        "num_hidden_layers": 42,
        "hidden_size": 2048,
        "intermediate_size": 6144,
    }
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (16, 2, 128)
    assert config["vocab_size"] == 130560 and config["tie_word_embeddings"] is False
    assert config["quantization"] == {"group_size": 64, "bits": 4}
    assert detect_family(config) == "minicpm5-2b"
    assert detect_family(model_config(MINICPM5_2B_MINI)) == "llama"
    modules = plan_modules(MINICPM5_2B.shape)
    assert logical_parameters(modules) == 2_516_756_480
    shards = plan_shards(modules, MINICPM5_2B.num_shards, MINICPM5_2B.quantization)
    assert len(shards) == 2 and shards[0][0].name == "model.embed_tokens" and shards[1][-1].name == "lm_head"


# --------------------------------------------------------------------------- tokenizer


def test_special_tokens_sit_at_their_ids(mini_twin: tuple[Path, dict[str, Any]]) -> None:
    raw = Tokenizer.from_file(str(mini_twin[0] / "tokenizer.json"))
    assert raw.get_vocab_size() == 130560
    for content, token_id in SPECIAL_IDS.items():
        assert raw.token_to_id(content) == token_id
        assert raw.encode(content, add_special_tokens=False).ids == [token_id]
    # Every id the embedding has is a token; the next one is not.
    assert raw.id_to_token(130559) is not None and raw.id_to_token(130560) is None
    assert raw.id_to_token(100_000) == PLACEHOLDER.format(100_000)


def test_tokenizer_encodes_real_merges_never_placeholders(mini_tokenizer: ChatTokenizer) -> None:
    text = "The assistant calls get_weather for Paris: 21 degrees, sunny. Ünïcödé ✓"
    ids = mini_tokenizer.encode(text)
    assert len(ids) < len(text.encode("utf-8")) / 2  # merges apply
    assert max(ids) < 130072  # no special, no placeholder
    assert mini_tokenizer.decode(ids) == text
    assert mini_tokenizer.eos_token_ids == frozenset({1, 130073})


def test_chat_tokenizer_agrees_with_raw_tokenizer(
    mini_twin: tuple[Path, dict[str, Any]], mini_tokenizer: ChatTokenizer
) -> None:
    raw = Tokenizer.from_file(str(mini_twin[0] / "tokenizer.json"))
    prompt = mini_tokenizer.render_chat(TOOL_CONVERSATION, tools=[WEATHER_TOOL], enable_thinking=True)
    ids = mini_tokenizer.encode(prompt, add_special_tokens=False)
    assert ids == raw.encode(prompt, add_special_tokens=False).ids
    assert ids[0] == SPECIAL_IDS["<s>"] and ids[-2:] == [SPECIAL_IDS["<think>"], raw.token_to_id("Ċ")]


# --------------------------------------------------------------------------- chat template


@pytest.mark.parametrize(
    ("options", "ending"),
    [
        ({}, ""),
        ({"enable_thinking": True}, "<think>\n"),
        ({"enable_thinking": False}, "<think>\n\n</think>\n\n"),
    ],
    ids=["unset", "thinking-on", "thinking-off"],
)
def test_generation_prompt_thinking_states(mini_tokenizer: ChatTokenizer, options: dict, ending: str) -> None:
    assert mini_tokenizer.render_chat(PLAIN, add_generation_prompt=True, **options) == PLAIN_PROMPT + ending


def test_without_generation_prompt_the_turns_end_closed(mini_tokenizer: ChatTokenizer) -> None:
    rendered = mini_tokenizer.render_chat(PLAIN, add_generation_prompt=False, enable_thinking=True)
    assert rendered == PLAIN_PROMPT.removesuffix("<|im_start|>assistant\n")


def test_tool_call_conversation_renders_function_xml(mini_tokenizer: ChatTokenizer) -> None:
    rendered = mini_tokenizer.render_chat(TOOL_CONVERSATION, tools=[WEATHER_TOOL], enable_thinking=False)
    system, rest = rendered.split("<|im_end|>\n", 1)
    assert system.startswith("<s><|im_start|>system\n# Tools")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n</tools>" in system
    assert rest == (
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<function name="get_weather"><param name="city">Paris</param><param name="days">2</param></function>\n'
        '<function name="get_weather"><param name="city"><![CDATA[Lyon <FR>\nRhone]]></param></function>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temperature": 21}\n</tool_response>\n'
        '<tool_response>\n{"temperature": 19}\n</tool_response><|im_end|>\n'
        "<|im_start|>user\nAnd in Berlin?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_reasoning_is_kept_only_after_the_last_user_query(mini_tokenizer: ChatTokenizer) -> None:
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add."},
        {"role": "user", "content": "Times 3?"},
        {"role": "assistant", "content": "12", "reasoning_content": "Multiply."},
    ]
    rendered = mini_tokenizer.render_chat(messages, add_generation_prompt=False)
    assert "Add." not in rendered
    assert rendered.endswith("<|im_start|>assistant\n<think>\nMultiply.\n</think>\n\n12<|im_end|>\n")


# --------------------------------------------------------------------------- logits


def test_greedy_logits_are_not_degenerate(
    mini_twin: tuple[Path, dict[str, Any]], mini_tokenizer: ChatTokenizer
) -> None:
    model, config = load_model(mini_twin[0])
    assert config.vocab_size == 130560 and config.quantization is not None
    prompt = mini_tokenizer.encode(mini_tokenizer.render_chat(PLAIN, enable_thinking=False), add_special_tokens=False)
    steps = list(greedy_steps(model, prompt, 8))
    logits = np.stack([np.array(step.logits) for step in steps])
    tokens = [step.token for step in steps]
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    assert (logits.std(axis=-1) > 1.0).all()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    assert (margins < 1.0).any()  # some steps are close calls, not a forced argmax
    assert len(set(tokens)) >= 3  # not one token forever
    placeholders = sum(mini_tokenizer.decode([t]) == PLACEHOLDER.format(t) for t in tokens)
    assert placeholders <= len(tokens) // 2  # live rows favoured: output is mostly real tokens


# --------------------------------------------------------------------------- family


def minicpm5_2b_config(**changes: Any) -> dict[str, Any]:
    config = {
        "model_type": "llama",
        "num_hidden_layers": 42,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 130560,
        "rms_norm_eps": 1e-6,
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def minicpm5_1b_config(**changes: Any) -> dict[str, Any]:
    config = {"model_type": "llama", "num_hidden_layers": 24, "hidden_size": 1536, "num_attention_heads": 12}
    config.update(changes)
    return config


def test_detect_family_exact_shapes() -> None:
    assert detect_family(minicpm5_2b_config()) == "minicpm5-2b"
    assert detect_family(minicpm5_2b_config(head_dim=None)) == "minicpm5-2b"  # 2048 / 16 = 128 still
    assert detect_family(minicpm5_1b_config()) == "minicpm5-1b"


@pytest.mark.parametrize(
    "changes",
    [
        {"num_hidden_layers": 41},
        {"num_hidden_layers": 43},
        {"hidden_size": 2304},
        {"intermediate_size": 6400},
        {"num_attention_heads": 32},
        {"num_key_value_heads": 4},
        {"num_key_value_heads": None},  # defaults to 16 KV heads
        {"head_dim": 64},
        {"vocab_size": 130561},
        {"vocab_size": 151936},
        {"num_hidden_layers": 42.0},
    ],
)
def test_detect_family_widened_2b_is_plain_llama(changes: dict[str, Any]) -> None:
    assert detect_family(minicpm5_2b_config(**changes)) == "llama"


@pytest.mark.parametrize("changes", [{"num_hidden_layers": 25}, {"num_hidden_layers": 28}, {"hidden_size": 2048}])
def test_detect_family_widened_1b_is_plain_llama(changes: dict[str, Any]) -> None:
    assert detect_family(minicpm5_1b_config(**changes)) == "llama"


@pytest.mark.parametrize(
    "config",
    [
        minicpm5_2b_config(model_type="mistral"),
        minicpm5_2b_config(model_type="minicpm"),
        minicpm5_2b_config(num_local_experts=8),
        {"hidden_size": 2048},
    ],
)
def test_detect_family_non_llama_is_unsupported(config: dict[str, Any]) -> None:
    assert detect_family(config) == "unsupported"


def test_the_float_control_twin_is_the_quantized_twins_draws(
    mini_twin: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """minicpm5-2b-mini-float (a quality pair's control) holds the very values the 4-bit mini twin
    quantized: mx.quantize of its matrices gives the 4-bit twin's stored tensors, bit for bit."""
    import mlx.core as mx

    float_dir = tmp_path / "float"
    build_twin("minicpm5-2b-mini-float", float_dir)
    config = read_json(float_dir / "config.json")
    assert (
        "quantization" not in config and config["vocab_size"] == read_json(mini_twin[0] / "config.json")["vocab_size"]
    )
    assert (float_dir / "tokenizer.json").read_bytes() == (mini_twin[0] / "tokenizer.json").read_bytes()
    floats = {k: v for p in sorted(float_dir.glob("*.safetensors")) for k, v in mx.load(str(p)).items()}
    quantized = {k: v for p in sorted(mini_twin[0].glob("*.safetensors")) for k, v in mx.load(str(p)).items()}
    for module in ("model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj", "lm_head"):
        packed, scales, biases = mx.quantize(floats[f"{module}.weight"], group_size=64, bits=4)
        for name, value in (("weight", packed), ("scales", scales), ("biases", biases)):
            assert mx.array_equal(value, quantized[f"{module}.{name}"]).item(), f"{module}.{name}"
    norm = "model.layers.1.input_layernorm.weight"
    assert mx.array_equal(floats[norm], quantized[norm]).item()
