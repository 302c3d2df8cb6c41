"""The universal Llama's generation options: quantized and rotating KV caches, forced prefixes,
and the tokenizer's thinking detection. mlx-lm is not importable here: these tests pin the
behaviours that the bit-exact comparison against mlx-lm (run elsewhere) rests on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel

from models.universal import ChatTokenizer, KVCache, LlamaConfig, UniversalLlama, greedy_steps
from models.universal.cache import (
    QuantizedKVCache,
    RotatingKVCache,
    create_causal_mask,
    maybe_quantize_kv_cache,
)
from models.universal.generate import DEFAULT_QUANTIZED_KV_START
from models.universal.model import quantized_scaled_dot_product_attention

VOCAB = 64
CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,  # GQA, head_dim 32: quantizable with groups 32
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
}
PROMPT = [1, 5, 8, 9, 10, 11, 12, 13, 14, 15]
EOS = 2


@pytest.fixture(scope="module")
def model() -> UniversalLlama:
    mx.random.seed(3)
    llama = UniversalLlama(LlamaConfig.from_dict(CONFIG))
    params = [
        (name, mx.random.normal(v.shape) * 0.3 if v.ndim == 2 else 1 + mx.random.normal(v.shape) * 0.05)
        for name, v in tree_flatten(llama.parameters())
    ]
    llama.update(tree_unflatten(params))
    llama.eval()
    mx.eval(llama.parameters())
    return llama


def run(model: UniversalLlama, n: int = 12, **options: Any) -> list[Any]:
    return list(greedy_steps(model, PROMPT, n, **options))


def logit_bits(steps: list[Any]) -> np.ndarray:
    return np.stack([np.array(s.logits.astype(mx.float32)).view(np.uint32) for s in steps])


def positions(n: int, start: int = 0, dim: int = 32) -> mx.array:
    """(1, 1, n, dim) keys whose every entry is the position: cache contents are readable."""
    return mx.broadcast_to(mx.arange(start, start + n, dtype=mx.float32)[None, None, :, None], (1, 1, n, dim))


def cached_positions(keys: mx.array) -> list[int]:
    return [int(x) for x in np.array(keys[0, 0, :, 0])]


# --- quantized cache -------------------------------------------------------------------


def test_to_quantized_quantizes_the_whole_buffer_and_keeps_the_offset() -> None:
    cache = KVCache()
    cache.update_and_fetch(positions(5), positions(5))
    quantized = cache.to_quantized(group_size=32, bits=8)
    assert isinstance(quantized, QuantizedKVCache) and (quantized.bits, quantized.group_size) == (8, 32)
    assert quantized.offset == 5
    # The whole 256-position buffer (zero tail included), as mlx-lm's to_quantized does.
    assert [x.shape for x in quantized.keys] == [(1, 1, 256, 8), (1, 1, 256, 1), (1, 1, 256, 1)]
    for got, want in zip(quantized.keys, mx.quantize(cache.keys, group_size=32, bits=8), strict=True):
        assert mx.array_equal(got, want)
    keys, _ = quantized.keys_and_values()
    assert keys[0].shape[2] == 5
    # Appending past the buffer grows it like KVCache: cut to the offset, add 256 blocks.
    quantized.update_and_fetch(positions(252, start=5), positions(252, start=5))
    assert quantized.offset == 257 and quantized.keys[0].shape[2] == 5 + 256
    keys, _ = quantized.keys_and_values()
    restored = mx.dequantize(*keys, group_size=32, bits=8)
    assert cached_positions(restored) == pytest.approx(list(range(257)), abs=1.5)
    assert quantized.make_mask(1) is None and quantized.make_mask(3) == "causal"


def test_maybe_quantize_converts_at_the_threshold_only() -> None:
    caches: list[Any] = [KVCache(), KVCache()]
    for c in caches:
        c.update_and_fetch(positions(4), positions(4))
    maybe_quantize_kv_cache(caches, quantized_kv_start=0, kv_group_size=32, kv_bits=None)
    assert all(type(c) is KVCache for c in caches)  # kv_bits None: never
    maybe_quantize_kv_cache(caches, quantized_kv_start=5, kv_group_size=32, kv_bits=4)
    assert all(type(c) is KVCache for c in caches)  # offset 4 < 5
    maybe_quantize_kv_cache(caches, quantized_kv_start=4, kv_group_size=32, kv_bits=4)
    assert all(type(c) is QuantizedKVCache and c.bits == 4 for c in caches)
    converted = list(caches)
    maybe_quantize_kv_cache(caches, quantized_kv_start=0, kv_group_size=32, kv_bits=4)
    assert caches == converted  # a quantized cache stays as it is
    rotating: list[Any] = [RotatingKVCache(max_size=8, keep=4)]
    rotating[0].update_and_fetch(positions(4), positions(4))
    with pytest.raises(NotImplementedError, match="RotatingKVCache cannot be quantized"):
        maybe_quantize_kv_cache(rotating, quantized_kv_start=0, kv_group_size=32, kv_bits=8)


def test_conversion_runs_after_every_model_call_including_prefill_chunks(
    model: UniversalLlama, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int, str]] = []
    original = UniversalLlama.__call__

    def spy(self: UniversalLlama, inputs: mx.array, cache: Any = None) -> mx.array:
        calls.append((inputs.shape[1], cache[0].offset, type(cache[0]).__name__))
        return original(self, inputs, cache)

    monkeypatch.setattr(UniversalLlama, "__call__", spy)
    # Chunks of 4 over 9 prompt tokens: offsets 0, 4, 8; the start (5) is reached after chunk 2.
    run(model, 3, prefill_step_size=4, kv_bits=8, kv_group_size=32, quantized_kv_start=5)
    assert calls == [
        (4, 0, "KVCache"),
        (4, 4, "KVCache"),
        (1, 8, "QuantizedKVCache"),  # the last prefill chunk: one token
        (1, 9, "QuantizedKVCache"),  # step 0
        (1, 10, "QuantizedKVCache"),
        (1, 11, "QuantizedKVCache"),
    ]
    calls.clear()
    # Mid-decode: step i's call ends at offset 10 + i; the conversion follows step 2's call.
    run(model, 5, kv_bits=4, kv_group_size=32, quantized_kv_start=len(PROMPT) + 2)
    assert [c[2] for c in calls] == ["KVCache"] * 4 + ["QuantizedKVCache"] * 2


def test_quantized_attention_matches_a_float_reference() -> None:
    mx.random.seed(0)
    queries = mx.random.normal((1, 4, 3, 32))
    keys, values = mx.random.normal((1, 2, 7, 32)), mx.random.normal((1, 2, 7, 32))
    q_keys, q_values = mx.quantize(keys, group_size=32, bits=8), mx.quantize(values, group_size=32, bits=8)
    out = quantized_scaled_dot_product_attention(queries, q_keys, q_values, 0.25, "causal", group_size=32, bits=8)
    k = mx.repeat(mx.dequantize(*q_keys, group_size=32, bits=8), 2, axis=1)
    v = mx.repeat(mx.dequantize(*q_values, group_size=32, bits=8), 2, axis=1)
    scores = (queries * 0.25) @ k.transpose(0, 1, 3, 2)
    scores = mx.where(create_causal_mask(3, 4), scores, -mx.inf)
    reference = mx.softmax(scores, axis=-1) @ v
    assert out.shape == (1, 4, 3, 32)
    assert np.allclose(np.array(out), np.array(reference), atol=1e-4)
    # The "causal" string means the bool mask aligned to the end of the keys.
    explicit = quantized_scaled_dot_product_attention(
        queries, q_keys, q_values, 0.25, create_causal_mask(3, 4), group_size=32, bits=8
    )
    assert mx.array_equal(out, explicit)


def test_quantized_generation_changes_the_logits_only_after_the_conversion(model: UniversalLlama) -> None:
    base = logit_bits(run(model))
    late = logit_bits(run(model, kv_bits=8, kv_group_size=32, quantized_kv_start=len(PROMPT) + 4))
    assert np.array_equal(base[:5], late[:5])  # steps 0-4 run on the float cache
    assert not np.array_equal(base[5:], late[5:])
    never = logit_bits(run(model, kv_bits=4, kv_group_size=32))  # mlx-lm's default start: 5000
    assert DEFAULT_QUANTIZED_KV_START == 5000 and np.array_equal(base, never)


# --- rotating cache --------------------------------------------------------------------


def test_rotating_cache_trims_rotates_and_reorders() -> None:
    cache = RotatingKVCache(max_size=8, keep=2)
    keys, _ = cache.update_and_fetch(positions(10), positions(10))  # concat: kept whole
    assert cached_positions(keys) == list(range(10)) and cache.offset == 10 and cache._idx == 10
    # In place: first trimmed to max_size (dropping the oldest after `keep`), then, the
    # buffer being full, written at `keep`.
    keys, _ = cache.update_and_fetch(positions(1, 10), positions(1, 10))
    assert cached_positions(keys) == [0, 1, 10, 5, 6, 7, 8, 9] and cache._idx == 3
    for position in (11, 12):
        keys, _ = cache.update_and_fetch(positions(1, position), positions(1, position))
    assert cached_positions(keys) == [0, 1, 10, 11, 12, 7, 8, 9] and cache.offset == 13
    # A multi-token update puts the ring back in temporal order, keeps max_size - 1 old
    # positions (the kept ones included) and appends.
    keys, _ = cache.update_and_fetch(positions(3, 13), positions(3, 13))
    assert cached_positions(keys) == [0, 1, 8, 9, 10, 11, 12, 13, 14, 15]
    assert cache.offset == 16 and cache._idx == 10


def test_rotating_cache_grows_in_place_up_to_max_size() -> None:
    cache = RotatingKVCache(max_size=6, keep=1)
    for i in range(8):
        keys, _ = cache.update_and_fetch(positions(1, i), positions(1, i))
    assert cache.keys.shape[2] == 6 and cache.offset == 8
    assert cached_positions(keys) == [0, 6, 7, 3, 4, 5]
    assert cache._temporal_order(cache.keys).shape[2] == 6
    assert cached_positions(cache._temporal_order(cache.keys)) == [0, 3, 4, 5, 6, 7]


def test_rotating_cache_masks() -> None:
    cache = RotatingKVCache(max_size=8, keep=2)
    assert cache.make_mask(1) is None
    assert cache.make_mask(5) == "causal"  # 0 + 5 <= 8
    mask = cache.make_mask(9)  # more queries than the window: an explicit windowed mask
    assert isinstance(mask, mx.array) and mask.shape == (9, 9)
    assert np.array_equal(np.array(mask), np.array(create_causal_mask(9, 0, window_size=8)))
    assert not bool(mask[8, 0]) and bool(mask[8, 1])
    cache.update_and_fetch(positions(20), positions(20))
    mask = cache.make_mask(3)  # the offset counts as max_size - 1 positions
    assert np.array_equal(np.array(mask), np.array(create_causal_mask(3, 7, window_size=8)))
    assert cache.make_mask(1) is None
    # The unbounded caches: None for one query, "causal" otherwise, arrays on request.
    plain = KVCache()
    assert plain.make_mask(1) is None and plain.make_mask(4) == "causal"
    assert plain.make_mask(4, return_array=True).shape == (4, 4)


def test_rotating_generation_matches_the_plain_cache_until_the_window_fills(model: UniversalLlama) -> None:
    base = logit_bits(run(model, 20, prefill_step_size=4))
    roomy = logit_bits(run(model, 20, prefill_step_size=4, max_kv_size=64))
    assert np.array_equal(base, roomy)
    # max_size 16: step i attends to 10 + i positions; they all fit up to step 6.
    small = logit_bits(run(model, 20, prefill_step_size=4, max_kv_size=16))
    assert np.array_equal(base[:7], small[:7])
    assert not np.array_equal(base[7:8], small[7:8])
    # The prompt alone overflowing the window (chunks larger and smaller than it).
    for step in (3, 2048):
        steps = run(model, 8, prefill_step_size=step, max_kv_size=6)
        assert len(steps) == 8 and all(np.isfinite(np.array(s.logits)).all() for s in steps)


def test_make_cache_builds_rotating_caches(model: UniversalLlama) -> None:
    caches = model.make_cache(max_kv_size=24)
    assert all(isinstance(c, RotatingKVCache) and (c.max_size, c.keep) == (24, 4) for c in caches)
    assert all(type(c) is KVCache for c in model.make_cache())


# --- forced prefix ---------------------------------------------------------------------


def test_forced_prefix_forces_tokens_and_keeps_raw_logits(model: UniversalLlama) -> None:
    prefix = [EOS, 7, EOS, 30]
    base = run(model)
    forced = run(model, forced_prefix=prefix)
    assert [s.token for s in forced[:4]] == prefix
    # The logits are the model's own: step 0 is unchanged, later steps follow the forced feed.
    assert np.array_equal(logit_bits(base[:1]), logit_bits(forced[:1]))
    fed = prefix + [s.token for s in forced[4:-1]]
    teacher = run(model, forced_tokens=fed)
    assert np.array_equal(logit_bits(forced), logit_bits(teacher))
    assert all(s.token == int(np.argmax(np.array(s.logits))) for s in forced[4:])


def test_forced_prefix_in_teacher_forced_mode_reports_the_forced_choice(model: UniversalLlama) -> None:
    base = run(model)
    fed = [s.token for s in base[:-1]]
    steps = run(model, forced_tokens=fed, forced_prefix=[EOS, EOS])
    assert [s.token for s in steps[:2]] == [EOS, EOS]
    assert [s.token for s in steps[2:]] == [s.token for s in base[2:]]
    assert np.array_equal(logit_bits(steps), logit_bits(base))
    # An empty prefix is no prefix (mlx-lm installs no processor).
    assert np.array_equal(logit_bits(run(model, forced_prefix=[])), logit_bits(base))


def test_forced_prefix_combines_with_cache_options(model: UniversalLlama) -> None:
    prefix = [EOS, 3, 4]
    for options in ({"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0}, {"max_kv_size": 12}):
        steps = run(model, forced_prefix=prefix, **options)
        assert [s.token for s in steps[:3]] == prefix
        teacher = run(model, forced_tokens=prefix + [s.token for s in steps[3:-1]], **options)
        assert np.array_equal(logit_bits(steps), logit_bits(teacher))


# --- determinism and validation --------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 0, "prefill_step_size": 3},
        {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 12},
        {"max_kv_size": 8, "prefill_step_size": 3},
        {"forced_prefix": [EOS, 9], "max_kv_size": 8},
    ],
)
def test_options_are_deterministic(model: UniversalLlama, options: dict[str, Any]) -> None:
    first, second = run(model, **options), run(model, **options)
    assert np.array_equal(logit_bits(first), logit_bits(second))
    assert [s.token for s in first] == [s.token for s in second]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"kv_bits": 7}, "kv_bits"),
        ({"kv_bits": 0}, "kv_bits"),
        ({"kv_bits": True}, "kv_bits"),
        ({"kv_bits": "8"}, "kv_bits"),
        ({"kv_bits": 8, "kv_group_size": 48}, "kv_group_size"),
        ({"kv_group_size": 16}, "kv_group_size"),
        ({"kv_bits": 8, "kv_group_size": 64}, "head dim 32"),  # 64 does not divide head_dim 32
        ({"kv_bits": 8, "quantized_kv_start": -1}, "quantized_kv_start"),
        ({"kv_bits": 8, "quantized_kv_start": 1.5}, "quantized_kv_start"),
        ({"max_kv_size": 4}, "max_kv_size"),
        ({"max_kv_size": 0}, "max_kv_size"),
        ({"max_kv_size": "24"}, "max_kv_size"),
        ({"forced_prefix": [VOCAB]}, "forced_prefix"),
        ({"forced_prefix": [-1]}, "forced_prefix"),
        ({"forced_prefix": [1.0]}, "forced_prefix"),
        ({"forced_prefix": "12"}, "forced_prefix"),
    ],
)
def test_bad_option_values_are_named(model: UniversalLlama, options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        run(model, 2, **options)


def test_rotating_cache_with_kv_bits_fails_like_mlx_lm(model: UniversalLlama) -> None:
    # mlx-lm raises NotImplementedError once the rotating cache reaches the start...
    with pytest.raises(NotImplementedError, match="max_kv_size"):
        run(model, 4, max_kv_size=8, kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    # ... and runs unquantized while it has not.
    steps = run(model, 4, max_kv_size=8, kv_bits=8, kv_group_size=32)
    assert np.array_equal(logit_bits(steps), logit_bits(run(model, 4, max_kv_size=8)))


# --- thinking detection ----------------------------------------------------------------

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined %}[thinking={{ enable_thinking }}]{% endif %}{% endif %}"
)


def tokenizer_with(tmp_path: Path, extra_tokens: list[str]) -> ChatTokenizer:
    words = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hi", "\n"]
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "removed")
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    if extra_tokens:
        tokenizer.add_tokens(extra_tokens)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "chat_template": TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    return ChatTokenizer.from_dir(tmp_path)


@pytest.mark.parametrize(
    ("tokens", "markers"),
    [
        ([], None),
        (["<think>"], None),  # both ends are needed
        (["<think>", "</think>"], ("<think>", "</think>")),
        (["<longcat_think>", "</longcat_think>"], ("<longcat_think>", "</longcat_think>")),
        (["<|think:start|>", "<|think:end|>"], ("<|think:start|>", "<|think:end|>")),
        (["<|channel>", "<channel|>"], ("<|channel>thought", "<channel|>")),
        (["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"], ("<|open|>think<|sep|>", "<|close|>think<|sep|>")),
        (["<|open|>", "<|close|>", "<|sep|>"], None),
    ],
)
def test_has_thinking_follows_mlx_lm(tmp_path: Path, tokens: list[str], markers: tuple[str, str] | None) -> None:
    tok = tokenizer_with(tmp_path, tokens)
    assert tok.think_markers == markers
    assert tok.has_thinking is (markers is not None)


def test_render_chat_like_mlx_lm_defaults_enable_thinking(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = tokenizer_with(tmp_path, [])
    assert plain.render_chat(messages).endswith("assistant\n")  # render_chat passes nothing
    assert plain.render_chat_like_mlx_lm(messages).endswith("assistant\n[thinking=False]")
    assert plain.render_chat_like_mlx_lm(messages, enable_thinking=True).endswith("[thinking=True]")
    thinking = tokenizer_with(tmp_path, ["<think>", "</think>"])
    assert thinking.render_chat_like_mlx_lm(messages).endswith("[thinking=True]")
    assert thinking.render_chat_like_mlx_lm(messages, enable_thinking=False).endswith("[thinking=False]")
    assert thinking.render_chat_like_mlx_lm(messages, add_generation_prompt=False).endswith("<|im_end|>\n")
