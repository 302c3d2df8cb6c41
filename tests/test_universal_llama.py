"""The universal Llama on its own: config, strict loading, cache, decode loop, tokenizer.

Bit-exactness against mlx-lm needs the oracle venv and is checked elsewhere; these tests
pin the in-tree behaviours that parity rests on, with tiny models built here. The EOS ids are
compared with what mlx-lm itself computes on the same directories, run in its oracle venv.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE, WordLevel

from models.universal import (
    ChatTokenizer,
    ConfigError,
    KVCache,
    LlamaConfig,
    QuantSpec,
    TokenizerError,
    UniversalLlama,
    WeightLoadError,
    greedy_steps,
    load_model,
)
from tests.oracle_call import oracle_answer

BASE_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 64,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "eos_token_id": 2,
}
QUANTIZATION = {
    "group_size": 32,
    "bits": 4,
    "model.embed_tokens": {"group_size": 32, "bits": 8},
    "model.layers.1.mlp.down_proj": False,
}
WORDS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
WORDS += ["hello", "world", "the", "capital", "of", "france", "is", "paris", "?", "!", "\n"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_weights(config: dict[str, Any], seed: int = 0) -> dict[str, mx.array]:
    """Random weights for `config`, quantized as its `quantization` section says."""
    mx.random.seed(seed)
    model = UniversalLlama(LlamaConfig.from_dict(config))
    # Matrices ~N(0, 0.3), norm weights ~1: logits far from uniform, so argmax ties are rare.
    randomized = [
        (name, mx.random.normal(v.shape) * 0.3 if v.ndim == 2 else 1 + mx.random.normal(v.shape) * 0.05)
        for name, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(randomized))
    quantization = config.get("quantization")
    if quantization is not None:
        overrides = {k: v for k, v in quantization.items() if k not in ("group_size", "bits")}
        nn.quantize(
            model,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            class_predicate=lambda path, m: overrides.get(path, hasattr(m, "to_quantized")),
        )
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    return weights


def write_tokenizer(path: Path, tokenizer_config: dict[str, Any] | None = None) -> None:
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Split(" ", "removed")]
    )
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.save(str(path / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "chat_template": CHATML,
    }
    settings.update(tokenizer_config or {})
    (path / "tokenizer_config.json").write_text(json.dumps(settings))


def write_model_dir(
    path: Path,
    config_overrides: dict[str, Any] | None = None,
    edit_weights: Any = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {**BASE_CONFIG, "quantization": QUANTIZATION, **(config_overrides or {})}
    weights = build_weights({k: v for k, v in config.items() if v is not None})
    if edit_weights is not None:
        edit_weights(weights)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[UniversalLlama, LlamaConfig]:
    return load_model(model_dir)


def logit_bits(steps: list[Any]) -> np.ndarray:
    return np.stack([np.array(s.logits.astype(mx.float32)).view(np.uint32) for s in steps])


# --- config ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "rms_norm_eps", "model_type"])
def test_config_missing_required_key_is_named(key: str) -> None:
    raw = {k: v for k, v in BASE_CONFIG.items() if k != key}
    with pytest.raises(ConfigError, match=key):
        LlamaConfig.from_dict(raw)


def test_config_wrong_type_is_named() -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        LlamaConfig.from_dict({**BASE_CONFIG, "num_hidden_layers": "2"})
    with pytest.raises(ConfigError, match="attention_bias"):
        LlamaConfig.from_dict({**BASE_CONFIG, "attention_bias": 1})


def test_config_records_unknown_keys_and_uses_mlx_lm_defaults() -> None:
    raw = {k: v for k, v in BASE_CONFIG.items() if k != "tie_word_embeddings"}
    config = LlamaConfig.from_dict({**raw, "torch_dtype": "bfloat16", "architectures": ["X"]})
    assert config.unused_keys == ("architectures", "torch_dtype")
    assert config.tie_word_embeddings is True  # mlx-lm's default, not transformers'
    assert config.rope_theta == 10000 and config.rope_type == "default"
    assert config.attention_head_dim == 16 and config.n_kv_heads == 2


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"model_type": "qwen2"}, "model_type"),
        ({"rope_scaling": {"rope_type": "mrope"}}, "rope_type"),
        ({"rope_scaling": {"rope_type": "llama3"}}, "rope_scaling.factor"),
        # transformers 5 refuses it too, so the oracle cannot load such a checkpoint (issue 53)
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}}, "high_freq_factor"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"quantization": {"group_size": 32, "bits": 4, "model.norm": 7}}, "model.norm"),
        ({"quantization": {"group_size": 48, "bits": 4}}, "group_size"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
    ],
)
def test_config_rejects_what_it_cannot_build(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        LlamaConfig.from_dict({**BASE_CONFIG, **overrides})


def test_config_quantization_overrides() -> None:
    config = LlamaConfig.from_dict({**BASE_CONFIG, "quantization": QUANTIZATION})
    assert config.quantization is not None
    assert config.quantization.default == QuantSpec(group_size=32, bits=4)
    assert config.quantization.per_module == {
        "model.embed_tokens": QuantSpec(group_size=32, bits=8),
        "model.layers.1.mlp.down_proj": None,
    }


# --- loader ---------------------------------------------------------------------------


def test_load_builds_the_configured_module_tree(loaded: tuple[UniversalLlama, LlamaConfig]) -> None:
    model, config = loaded
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert model.model.embed_tokens.bits == 8
    assert isinstance(model.layers[0].mlp.down_proj, nn.QuantizedLinear)
    assert model.layers[0].mlp.down_proj.bits == 4
    # `false` in the config keeps a module in float.
    assert type(model.layers[1].mlp.down_proj) is nn.Linear
    assert isinstance(model.lm_head, nn.QuantizedLinear)
    assert config.quantization is not None


def test_load_keeps_stored_dtypes(tmp_path: Path) -> None:
    def to_bf16(weights: dict[str, mx.array]) -> None:
        for name, value in weights.items():
            if value.dtype == mx.float32:
                weights[name] = value.astype(mx.bfloat16)

    model, _ = load_model(write_model_dir(tmp_path / "m", edit_weights=to_bf16))
    assert model.model.norm.weight.dtype == mx.bfloat16
    assert model.model.embed_tokens.scales.dtype == mx.bfloat16
    assert model(mx.array([[1, 2, 3]])).dtype == mx.bfloat16


def test_unknown_tensor_is_named(tmp_path: Path) -> None:
    def add(weights: dict[str, mx.array]) -> None:
        weights["model.layers.0.self_attn.extra.weight"] = mx.zeros((2,))

    with pytest.raises(WeightLoadError, match=r"unknown.*model\.layers\.0\.self_attn\.extra\.weight"):
        load_model(write_model_dir(tmp_path / "m", edit_weights=add))


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    def drop(weights: dict[str, mx.array]) -> None:
        del weights["model.layers.1.post_attention_layernorm.weight"]

    with pytest.raises(WeightLoadError, match=r"missing.*layers\.1\.post_attention_layernorm"):
        load_model(write_model_dir(tmp_path / "m", edit_weights=drop))


def test_shape_mismatch_is_named(tmp_path: Path) -> None:
    def shrink(weights: dict[str, mx.array]) -> None:
        weights["model.norm.weight"] = mx.ones((32,))

    with pytest.raises(WeightLoadError, match=r"model\.norm\.weight: shape \(32,\)"):
        load_model(write_model_dir(tmp_path / "m", edit_weights=shrink))


def test_sanitize_drops_rope_tables_and_tied_head(tmp_path: Path) -> None:
    def add(weights: dict[str, mx.array]) -> None:
        weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = mx.zeros((8,))
        weights["lm_head.weight"] = mx.zeros((64, 64))

    tied = {"tie_word_embeddings": True}
    model, config = load_model(write_model_dir(tmp_path / "m", tied, edit_weights=add))
    assert config.tie_word_embeddings and "lm_head" not in model


def test_sharded_weights_load_and_index_is_checked(tmp_path: Path, model_dir: Path) -> None:
    weights = mx.load(str(model_dir / "model.safetensors"))
    names = sorted(weights)
    target = tmp_path / "sharded"
    target.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (target / f).write_bytes((model_dir / f).read_bytes())
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        mx.save_safetensors(str(target / shard), {k: weights[k] for k in part})
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded, _ = load_model(target)
    single, _ = load_model(model_dir)
    tokens = mx.array([[1, 5, 8, 9]])
    assert np.array_equal(np.array(sharded(tokens)), np.array(single(tokens)))

    index["weight_map"]["model.ghost.weight"] = "model-00001-of-00002.safetensors"
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightLoadError, match="model.ghost.weight"):
        load_model(target)


# --- cache ----------------------------------------------------------------------------


def test_kv_cache_grows_in_blocks_and_slices_to_offset() -> None:
    cache = KVCache()

    def kv(n: int, fill: float) -> mx.array:
        return mx.full((1, 2, n, 4), fill)

    keys, _ = cache.update_and_fetch(kv(5, 1.0), kv(5, 1.0))
    assert cache.offset == 5 and cache.keys.shape[2] == 256 and keys.shape[2] == 5
    keys, _ = cache.update_and_fetch(kv(251, 2.0), kv(251, 2.0))
    assert cache.offset == 256 and keys.shape[2] == 256 and cache.keys.shape[2] == 256
    keys, values = cache.update_and_fetch(kv(1, 3.0), kv(1, 3.0))
    assert cache.offset == 257 and cache.keys.shape[2] == 512 and keys.shape[2] == 257
    column = np.array(values[0, 0, :, 0])
    assert (column[:5] == 1).all() and (column[5:256] == 2).all() and column[256] == 3
    assert cache.make_mask(1) is None and cache.make_mask(7) == "causal"


def test_model_cache_offsets_follow_the_tokens_fed(loaded: tuple[UniversalLlama, LlamaConfig]) -> None:
    model, _ = loaded
    cache = model.make_cache()
    assert len(cache) == 2
    model(mx.array([[1, 5, 8, 9, 10]]), cache=cache)
    model(mx.array([[11]]), cache=cache)
    assert [c.offset for c in cache] == [6, 6]
    assert cache[0].keys.shape == (1, 2, 256, 16)


def test_cached_steps_agree_with_a_full_forward(loaded: tuple[UniversalLlama, LlamaConfig]) -> None:
    model, _ = loaded
    prompt = [1, 5, 8, 9, 10, 3, 4]
    steps = list(greedy_steps(model, prompt, 3, prefill_step_size=2))
    fed = prompt + [s.token for s in steps[:-1]]
    full = model(mx.array([fed]))[0]
    for step in steps:
        position = len(prompt) - 1 + step.index
        assert np.allclose(np.array(step.logits), np.array(full[position]), atol=1e-4)


# --- decode loop ----------------------------------------------------------------------


def test_teacher_forcing_own_tokens_reproduces_free_running_bits(
    loaded: tuple[UniversalLlama, LlamaConfig],
) -> None:
    model, _ = loaded
    prompt = [1, 5, 8, 9, 10, 11, 12, 13, 14]
    free = list(greedy_steps(model, prompt, 12, prefill_step_size=4))
    forced = list(greedy_steps(model, prompt, 12, prefill_step_size=4, forced_tokens=[s.token for s in free]))
    assert np.array_equal(logit_bits(free), logit_bits(forced))
    assert [s.token for s in free] == [s.token for s in forced]


def test_runs_are_deterministic(loaded: tuple[UniversalLlama, LlamaConfig]) -> None:
    model, _ = loaded
    first = list(greedy_steps(model, [1, 5, 8], 10))
    second = list(greedy_steps(model, [1, 5, 8], 10))
    assert np.array_equal(logit_bits(first), logit_bits(second))


def test_steps_are_indexed_and_counted(loaded: tuple[UniversalLlama, LlamaConfig]) -> None:
    model, config = loaded
    steps = list(greedy_steps(model, [7], 4))  # a one-token prompt skips the prefill
    assert [s.index for s in steps] == [0, 1, 2, 3]
    assert all(s.logits.shape == (config.vocab_size,) for s in steps)
    assert all(s.token == int(np.argmax(np.array(s.logits))) for s in steps)
    assert list(greedy_steps(model, [7], 0)) == []
    with pytest.raises(ValueError, match="forced_tokens"):
        list(greedy_steps(model, [7], 4, forced_tokens=[1]))
    with pytest.raises(ValueError, match="prompt_ids"):
        list(greedy_steps(model, [], 4))


def test_forced_tokens_are_what_gets_fed(loaded: tuple[UniversalLlama, LlamaConfig]) -> None:
    model, _ = loaded
    free = list(greedy_steps(model, [1, 5, 8], 3))
    other = (free[0].token + 1) % 64
    forced = list(greedy_steps(model, [1, 5, 8], 3, forced_tokens=[other, other]))
    assert np.array_equal(logit_bits(free[:1]), logit_bits(forced[:1]))
    assert not np.array_equal(logit_bits(free[1:2]), logit_bits(forced[1:2]))


# --- tokenizer ------------------------------------------------------------------------


def tokenizer_dir(tmp_path: Path, settings: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "tok"
    path.mkdir(exist_ok=True)
    write_tokenizer(path, settings)
    (path / "config.json").write_text(json.dumps(BASE_CONFIG))
    return path


def test_render_chat_matches_the_template(tmp_path: Path) -> None:
    tok = ChatTokenizer.from_dir(tokenizer_dir(tmp_path))
    messages = [{"role": "user", "content": "hello world"}]
    assert tok.render_chat(messages) == ("<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n")
    assert tok.render_chat(messages, add_generation_prompt=False).endswith("<|im_end|>\n")


def test_render_chat_sees_special_tokens_and_kwargs(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% if m.name is defined %}({{ m.name }}){% endif %}{% endfor %}"
        "{{ extra | tojson }}{{ eos_token }}{% if fail %}{{ raise_exception('no') }}{% endif %}"
    )
    tok = ChatTokenizer.from_dir(tokenizer_dir(tmp_path, {"chat_template": template}))
    # None-valued keys are dropped (as transformers does); kwargs beat special tokens.
    messages = [{"role": "user", "content": "hi", "name": None}]
    rendered = tok.render_chat(messages, extra={"a": "<&>"}, eos_token="[END]")
    assert rendered == '<s>user:hi{"a": "<&>"}[END]'
    with pytest.raises(jinja2.TemplateError, match="no"):
        tok.render_chat(messages, extra=1, fail=True)


def test_chat_template_file_wins_over_config(tmp_path: Path) -> None:
    path = tokenizer_dir(tmp_path)
    (path / "chat_template.jinja").write_text("FILE{{ messages | length }}")
    tok = ChatTokenizer.from_dir(path)
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "FILE1"


def test_encode_follows_the_post_processor_not_add_bos_token(tmp_path: Path) -> None:
    # tokenizer.json's post-processor adds <s>; transformers 5 ignores add_bos_token.
    tok = ChatTokenizer.from_dir(tokenizer_dir(tmp_path, {"add_bos_token": False}))
    assert tok.encode("hello world", add_special_tokens=True) == [1, 8, 9]
    assert tok.encode("hello world", add_special_tokens=False) == [8, 9]
    assert tok.encode("<|im_start|>user\nhello", add_special_tokens=False) == [3, 5, 18, 8]
    assert tok.decode([8, 9]) == "hello world"


def test_gpt2_class_drops_the_digit_split(tmp_path: Path) -> None:
    # transformers' GPT2Tokenizer rebuilds the pipeline with only a ByteLevel pre-tokenizer.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(["<|endoftext|>", *alphabet, "12"])}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=[("1", "2")]))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps(BASE_CONFIG))
    for klass, expected in (("PreTrainedTokenizerFast", 2), ("GPT2Tokenizer", 1)):
        settings = {"tokenizer_class": klass, "eos_token": "<|endoftext|>"}
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
        assert len(ChatTokenizer.from_dir(tmp_path).encode("12")) == expected


def test_unsupported_tokenizer_class_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="Qwen2Tokenizer"):
        ChatTokenizer.from_dir(tokenizer_dir(tmp_path, {"tokenizer_class": "Qwen2Tokenizer"}))


# Model directories that differ in where their EOS ids come from. The tokenizer's own EOS is
# <|im_end|>, config.json's eos_token_id BASE_CONFIG's unless overridden; generation_config.json
# is written as the text given (None: no file).
EOS_CASES: dict[str, dict[str, Any]] = {
    "config-only": {},
    "config-list": {"config": {"eos_token_id": [2, 3]}},
    "config-none": {"config": {"eos_token_id": None}},
    "generation-list": {"generation_config": json.dumps({"eos_token_id": [0, 7]})},
    "generation-int": {"generation_config": json.dumps({"eos_token_id": 7})},
    "generation-zero": {"generation_config": json.dumps({"eos_token_id": 0})},  # falsy
    "generation-empty-list": {"generation_config": json.dumps({"eos_token_id": []})},  # falsy
    "generation-without-eos": {"generation_config": json.dumps({"bos_token_id": 1})},
    "generation-unreadable": {"generation_config": "{not json"},
    "eos-token-is-bos": {"tokenizer_config": {"eos_token": "<s>"}},
    "eos-token-not-in-vocab": {"tokenizer_config": {"eos_token": "<|no such token|>"}},
}

# The tests that read the oracle's answer share one worker under `make test` (-n, loadgroup),
# so the module-scoped fixture starts the oracle venv once.
ORACLE_GROUP = pytest.mark.xdist_group("oracle-mlx-lm-eos")

# mlx_lm.load's way to the tokenizer's EOS ids, less the weights: load_config (config.json, its
# eos_token_id replaced by generation_config.json's), then load_tokenizer given that eos_token_id.
ORACLE_EOS = """
import json, sys
from pathlib import Path
from mlx_lm.utils import load_config, load_tokenizer

job = json.load(open(sys.argv[1]))
out = {}
for name, path in job.items():
    config = load_config(Path(path))
    tokenizer = load_tokenizer(Path(path), eos_token_ids=config.get("eos_token_id", None))
    out[name] = sorted(int(i) for i in tokenizer.eos_token_ids)
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def eos_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eos")
    dirs = {}
    for name, case in EOS_CASES.items():
        path = root / name
        path.mkdir()
        write_tokenizer(path, case.get("tokenizer_config"))
        config = {**BASE_CONFIG, **case.get("config", {})}
        (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        if case.get("generation_config") is not None:
            (path / "generation_config.json").write_text(case["generation_config"])
        dirs[name] = path
    return dirs


@pytest.fixture(scope="module")
def mlx_lm_eos_ids(eos_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, frozenset[int]]:
    """mlx-lm's EOS ids for every directory of EOS_CASES (one oracle venv start)."""
    job = {name: str(path) for name, path in eos_dirs.items()}
    answer = oracle_answer("mlx-lm", ORACLE_EOS, job, tmp_path_factory.mktemp("mlx-lm-eos"))
    return {name: frozenset(ids) for name, ids in answer.items()}


def eos_mismatches(eos_dirs: dict[str, Path], mlx_lm_eos_ids: dict[str, frozenset[int]]) -> dict[str, tuple]:
    """{case: (in-tree ids, mlx-lm's)} for every case where the two differ."""
    ours = {name: ChatTokenizer.from_dir(path).eos_token_ids for name, path in eos_dirs.items()}
    return {
        name: (sorted(ours[name]), sorted(mlx_lm_eos_ids[name]))
        for name in EOS_CASES
        if ours[name] != mlx_lm_eos_ids[name]
    }


@ORACLE_GROUP
@pytest.mark.parametrize("case", list(EOS_CASES))
def test_eos_ids_follow_mlx_lm(case: str, eos_dirs: dict[str, Path], mlx_lm_eos_ids: dict[str, frozenset[int]]) -> None:
    assert ChatTokenizer.from_dir(eos_dirs[case]).eos_token_ids == mlx_lm_eos_ids[case]


@ORACLE_GROUP
def test_eos_cases_tell_the_sources_apart(mlx_lm_eos_ids: dict[str, frozenset[int]]) -> None:
    # Not a vacuous comparison: in mlx-lm's own answers, generation_config.json's ids replace
    # config.json's in some case and not in another, and the tokenizer's EOS adds an id.
    assert mlx_lm_eos_ids["generation-list"] != mlx_lm_eos_ids["config-only"]
    assert mlx_lm_eos_ids["generation-zero"] == mlx_lm_eos_ids["config-only"]
    assert mlx_lm_eos_ids["config-only"] > mlx_lm_eos_ids["config-none"]


@ORACLE_GROUP
def test_eos_comparison_fails_when_the_in_tree_rule_changes(
    eos_dirs: dict[str, Path], mlx_lm_eos_ids: dict[str, frozenset[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above can fail: an in-tree side that dropped the tokenizer's own EOS id
    differs from mlx-lm wherever that id is not also a config id."""
    from models.universal import tokenizer as tokenizer_module

    rule = tokenizer_module._eos_token_ids
    monkeypatch.setattr(
        tokenizer_module, "_eos_token_ids", lambda path, backend, eos, unk: rule(path, backend, None, unk)
    )
    assert {"config-only", "generation-list", "eos-token-is-bos"} <= set(eos_mismatches(eos_dirs, mlx_lm_eos_ids))
