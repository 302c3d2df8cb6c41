"""The error paths of models/universal/: each test feeds one bad input to the function that
reaches a `raise` and asserts the exact exception type and that its message names the offending
thing. These are the branches the gates' branch coverage credits as 'error paths tested by make
test' (docs/coverage.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import mlx.core as mx
import mlx.nn as nn
import pytest
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel

from models.universal import (
    BatchKVCache,
    ChatTokenizer,
    ConfigError,
    LlamaConfig,
    RotatingKVCache,
    TokenizerError,
    UniversalLlama,
    WeightLoadError,
    batch_greedy_steps,
    chat_turn_steps,
    greedy_steps,
)
from models.universal.chat_template import render
from models.universal.compiled_step import CompiledDecoder
from models.universal.composed import CompositionError, composed_steps, parse_composition
from models.universal.composed.caches import trim
from models.universal.composed.spec import check_against_model
from models.universal.detokenize import ByteLevelStream, SentencePieceStream
from models.universal.loader import infer_spec, read_safetensors
from models.universal.response import ResponseBuilder, tool_format
from models.universal.rope import make_rope
from models.universal.speculative import speculative_generate
from models.universal.tool_calls import _as_boolean, typed_value

CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 64,
}
WORDS = ["<unk>", "<s>", "</s>", "hello", "world"]
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def tiny_model(**overrides: Any) -> UniversalLlama:
    """A randomly initialised two-layer Llama (no weights are loaded)."""
    return UniversalLlama(LlamaConfig.from_dict({**CONFIG, **overrides}))


@pytest.fixture(scope="module")
def model() -> UniversalLlama:
    return tiny_model()


def tokenizer_dir(path: Path, settings: dict[str, Any] | None = None, words: list[str] = WORDS) -> Path:
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "removed")
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "chat_template": TEMPLATE}
    (path / "tokenizer_config.json").write_text(json.dumps({**config, **(settings or {})}))
    return path


# -- config.json ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, named",
    [
        pytest.param([CONFIG], "expected a JSON object, got list", id="not-an-object"),
        pytest.param({**CONFIG, "hidden_size": 0}, "config.hidden_size: must be positive, got 0", id="hidden-size-0"),
        pytest.param({**CONFIG, "vocab_size": 0}, r"num_attention_heads / vocab_size: must be positive", id="vocab-0"),
        pytest.param({**CONFIG, "hidden_size": 66}, r"config.head_dim: absent, and hidden_size=66", id="head-dim"),
        pytest.param({**CONFIG, "rms_norm_eps": 0.0}, r"config.rms_norm_eps: must be positive", id="eps-0"),
        pytest.param(
            {**CONFIG, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
            r"config.max_position_embeddings: required for rope_type 'dynamic'",
            id="dynamic-rope-without-max-positions",
        ),
        pytest.param({**CONFIG, "quantization": 4}, r"config.quantization: expected an object, got 4", id="quant-int"),
        pytest.param(
            {**CONFIG, "quantization": {"model.embed_tokens": {"bits": 4, "scale": 1}}},
            r"config.quantization\['model.embed_tokens'\]: unsupported keys \['scale'\]",
            id="quant-unknown-key",
        ),
        pytest.param(
            {**CONFIG, "quantization": {"mode": "int3"}}, r"config.quantization.mode: 'int3' is not one of", id="mode"
        ),
        pytest.param(
            {**CONFIG, "quantization": {"group_size": "64"}},
            r"config.quantization: group_size and bits must be integers",
            id="group-size-string",
        ),
        pytest.param(
            {**CONFIG, "quantization": {"bits": 7}}, r"config.quantization.bits: 7 is not a supported", id="bits-7"
        ),
    ],
)
def test_bad_config_is_a_config_error_naming_the_key(raw: Any, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        LlamaConfig.from_dict(raw)


def test_make_rope_refuses_a_rope_type_validation_would_have_caught() -> None:
    config = LlamaConfig(**{**CONFIG, "rope_scaling": {"type": "su"}})  # built without from_dict's checks
    with pytest.raises(ValueError, match="unsupported rope_type 'su'"):
        make_rope(config)


# -- weights ----------------------------------------------------------------------------------


def test_a_directory_without_safetensors_is_named(tmp_path: Path) -> None:
    with pytest.raises(WeightLoadError, match=r"no model\*.safetensors in"):
        read_safetensors(tmp_path)


def test_an_index_naming_a_missing_shard_is_named(tmp_path: Path) -> None:
    index = {"weight_map": {"a": "model-00001-of-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightLoadError, match="names model-00001-of-00001.safetensors, which is not in"):
        read_safetensors(tmp_path)


def test_a_tensor_stored_in_two_shards_is_named(tmp_path: Path) -> None:
    for name in ("model-1.safetensors", "model-2.safetensors"):
        mx.save_safetensors(str(tmp_path / name), {"model.norm.weight": mx.ones((4,))})
    with pytest.raises(WeightLoadError, match=r"tensors stored twice \(again in model-2.safetensors\): model.norm"):
        read_safetensors(tmp_path)


@pytest.mark.parametrize(
    "weights, named",
    [
        pytest.param({"p.scales": mx.ones((8, 2))}, "p.scales is stored but p.weight is missing", id="no-weight"),
        pytest.param(
            {"p.scales": mx.ones((8, 2), dtype=mx.uint8), "p.weight": mx.zeros((8, 6), dtype=mx.uint32)},
            "p: cannot infer the quantization mode of 3 bits, group size 32",
            id="uint8-scales-of-no-fp-mode",
        ),
    ],
)
def test_infer_spec_names_the_module(weights: dict[str, mx.array], named: str) -> None:
    with pytest.raises(WeightLoadError, match=named):
        infer_spec("p", nn.Linear(64, 8), weights)


# -- decode loops -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, named",
    [
        pytest.param({"prefill_batch_size": 0}, "prefill_batch_size: must be a positive int, got 0", id="batch-0"),
        pytest.param(
            {"n_tokens": 2, "forced_tokens": [[99]]},
            r"forced_tokens\[0\]: token ids must be ints in \[0, 64\), got \[99\]",
            id="forced-id-past-vocab",
        ),
    ],
)
def test_batch_arguments_name_the_argument(model: UniversalLlama, kwargs: dict[str, Any], named: str) -> None:
    arguments = {"n_tokens": 1, **kwargs}
    with pytest.raises(ValueError, match=named):
        batch_greedy_steps(model, [[3, 4]], arguments.pop("n_tokens"), **arguments)


def test_batch_cache_has_no_sliding_window() -> None:
    with pytest.raises(NotImplementedError, match="window_size: a BatchKVCache mask has no sliding window"):
        BatchKVCache([0, 1]).make_mask(1, window_size=4)


def test_chat_turns_need_a_positive_n_tokens(model: UniversalLlama) -> None:
    with pytest.raises(ValueError, match="n_tokens: must be a positive int, got 0"):
        chat_turn_steps(model, [[3, 4]], 0)


def test_greedy_steps_needs_a_positive_prefill_step(model: UniversalLlama) -> None:
    with pytest.raises(ValueError, match="prefill_step_size: must be positive, got 0"):
        next(greedy_steps(model, [3, 4], 1, prefill_step_size=0))


def test_compiled_decoder_names_an_unknown_variant(model: UniversalLlama) -> None:
    with pytest.raises(ValueError, match=r"variant: expected one of .*, got 'fastest'"):
        CompiledDecoder(model, "fastest")


@pytest.mark.parametrize(
    "prompt, kwargs, error, named",
    [
        pytest.param(
            [3],
            {"forced_prefix": 5},
            CompositionError,
            "forced_prefix: expected a list of token ids, got int",
            id="prefix-int",
        ),
        pytest.param(
            [3],
            {"forced_tokens": [3, 99]},
            CompositionError,
            r"forced_tokens: expected token ids .*got \[99\]",
            id="forced-past-vocab",
        ),
        pytest.param([], {}, ValueError, "prompt_ids: need at least one token", id="empty-prompt"),
        pytest.param(
            [3],
            {"prefill_step_size": True},
            ValueError,
            "prefill_step_size: expected a positive int, got True",
            id="prefill-bool",
        ),
    ],
)
def test_composed_steps_name_the_argument(
    model: UniversalLlama, prompt: list[int], kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as raised:
        composed_steps(model, prompt, 3, {"kind": "ngram_draft"}, **kwargs)
    assert raised.type is error


def test_composition_entries_are_named() -> None:
    with pytest.raises(CompositionError, match=r"kv_config\[0\]: expected an object with layer_idx"):
        parse_composition({"kind": "mixed_kv", "kv_config": [4]})
    mixed = parse_composition({"kind": "mixed_kv", "kv_config": [{"layer_idx": 0, "bits": 4, "group_size": 64}]})
    with pytest.raises(CompositionError, match=r"kv_config\[0\].group_size: 64 does not divide the head dim 16"):
        check_against_model(mixed, 2, 16)


def test_a_rotating_cache_cannot_be_trimmed() -> None:
    with pytest.raises(NotImplementedError, match="trimming a rotating cache"):
        trim(RotatingKVCache(8, keep=4), 1)


@pytest.mark.parametrize(
    "prompt, counts, named",
    [
        pytest.param([], (1, 1, 1), "prompt_ids: need at least one token", id="empty-prompt"),
        pytest.param([3], (0, 1, 1), "n_tokens: must be a positive int, got 0", id="n-tokens-0"),
        pytest.param([3], (1, 0, 1), "num_draft_tokens: must be a positive int, got 0", id="drafts-0"),
        pytest.param([3], (1, 1, False), "prefill_step_size: must be a positive int, got False", id="prefill-bool"),
    ],
)
def test_speculative_arguments_are_named(
    model: UniversalLlama, prompt: list[int], counts: tuple[Any, Any, Any], named: str
) -> None:
    n_tokens, drafts, step = counts
    with pytest.raises(ValueError, match=named):
        speculative_generate(model, model, prompt, n_tokens, drafts, prefill_step_size=step)


def test_a_draft_with_a_larger_vocabulary_is_refused(model: UniversalLlama) -> None:
    with pytest.raises(ValueError, match=r"draft: its vocabulary \(128\) is larger than the target's \(64\)"):
        speculative_generate(model, tiny_model(vocab_size=128), [3], 1, 1)


# -- chat templates and tokenizers ------------------------------------------------------------


@pytest.mark.parametrize(
    "source, messages, error, named",
    [
        pytest.param(
            "{% set ns = namespace(_secret=1) %}{{ messages[0].content }}",
            [{"role": "user", "content": "hi"}],
            jinja2.exceptions.SecurityError,
            "underscore attributes on a namespace: '_secret'",
            id="underscore-namespace",
        ),
        pytest.param(TEMPLATE, ["hello"], TypeError, "chat messages must be dicts, got 'hello'", id="str-message"),
        pytest.param(TEMPLATE, [], ValueError, "cannot render an empty conversation", id="empty-conversation"),
    ],
)
def test_render_refuses(source: str, messages: list[Any], error: type[Exception], named: str) -> None:
    with pytest.raises(error, match=named) as raised:
        render(source, messages, add_generation_prompt=True)
    assert raised.type is error


@pytest.mark.parametrize(
    "settings, named",
    [
        pytest.param({"added_tokens_decoder": {"5": "<x>"}}, r"added_tokens_decoder\[5\]: expected an object", id="a"),
        pytest.param({"bos_token": 5}, "tokenizer_config.bos_token: expected a string, got 5", id="bos-int"),
        pytest.param({"tokenizer_class": "GPT2TokenizerFast"}, "gpt2 tokenizer expects a BPE", id="gpt2-on-wordlevel"),
        pytest.param({"chat_template": 5}, "tokenizer_config.chat_template: unexpected int", id="template-int"),
    ],
)
def test_malformed_tokenizer_config_is_named(tmp_path: Path, settings: dict[str, Any], named: str) -> None:
    with pytest.raises(TokenizerError, match=named):
        ChatTokenizer.from_dir(tokenizer_dir(tmp_path, settings))


def test_a_directory_without_tokenizer_json_is_named(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer.json not found \(only tokenizer.json is supported\)"):
        ChatTokenizer.from_dir(tmp_path)


@pytest.mark.parametrize(
    "templates, name, named",
    [
        pytest.param({}, None, "this tokenizer has no chat template", id="none"),
        pytest.param({"default": TEMPLATE}, "tool_use", "no chat template named 'tool_use'", id="unknown-name"),
        pytest.param(
            {"a": TEMPLATE, "b": TEMPLATE}, None, r"several chat templates and none is 'default': \['a', 'b'\]", id="ab"
        ),
    ],
)
def test_chat_template_choice_is_named(templates: dict[str, str], name: str | None, named: str) -> None:
    tokenizer = ChatTokenizer(Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")), {}, templates, frozenset())
    with pytest.raises(TokenizerError, match=named):
        tokenizer.chat_template(name)


def test_detokenizers_name_the_token() -> None:
    with pytest.raises(TokenizerError, match="token id 1 has no token string in the vocabulary"):
        ByteLevelStream(["a", None]).add(1)
    with pytest.raises(TokenizerError, match=r"token id 5 is past the vocabulary \(1 tokens\)"):
        SentencePieceStream(["a"], trim_first_space=True).add(5)
    with pytest.raises(TokenizerError, match="token id 1 has no token string in the vocabulary"):
        SentencePieceStream(["a", None], trim_first_space=True)


@pytest.fixture
def chat_tokenizer(tmp_path: Path) -> ChatTokenizer:
    return ChatTokenizer.from_dir(tokenizer_dir(tmp_path))


def test_response_builder_refuses_an_unknown_parser_and_no_tokens(chat_tokenizer: ChatTokenizer) -> None:
    with pytest.raises(TokenizerError, match="tool parser 'qwen3' is not implemented in-tree"):
        ResponseBuilder(chat_tokenizer, None, "qwen3")
    with pytest.raises(ValueError, match="response: no tokens to answer with"):
        ResponseBuilder(chat_tokenizer, None, None).texts([], 4)


def test_tool_format_refuses_what_is_not_implemented(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> None:
    with pytest.raises(TokenizerError, match="a chat_template_type response format is not implemented"):
        tool_format(chat_tokenizer, {"chat_template_type": "xtml"})
    xtml_dir = tmp_path / "xtml"
    xtml_dir.mkdir()
    xtml = ChatTokenizer.from_dir(
        tokenizer_dir(xtml_dir, words=[*WORDS, "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"])
    )
    with pytest.raises(TokenizerError, match="an XTML vocabulary's structural markers are not implemented"):
        tool_format(xtml, {})


def test_a_boolean_parameter_that_is_no_boolean_is_refused() -> None:
    with pytest.raises(ValueError, match="^maybe$"):
        _as_boolean(" Maybe ")
    assert typed_value("Maybe", {"boolean"}) == "Maybe"  # the reader's refusal falls through to the text
