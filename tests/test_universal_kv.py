"""The universal Llama's generation options: quantized and rotating KV caches, forced prefixes,
and the tokenizer's thinking detection. mlx-lm is not importable here: these tests pin the
behaviours that the bit-exact comparison against mlx-lm (run elsewhere) rests on. Where a test
states what mlx-lm does (the rotating cache with kv_bits, the default quantized_kv_start), mlx-lm
itself is run on this module's model in its oracle venv and compared.
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
from models.universal.generate import DEFAULT_QUANTIZED_KV_START
from models.universal.masks import create_causal_mask
from models.universal.model import quantized_scaled_dot_product_attention
from models.universal.prompt_cache import maybe_quantize_kv_cache
from models.universal.quantized_cache import QuantizedKVCache
from models.universal.rotating_cache import RotatingKVCache
from tests.oracle_call import oracle_answer

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
# The tests that read the oracle's answer share one worker under `make test` (-n, loadgroup),
# so the module-scoped fixture starts the oracle venv once.
ORACLE_GROUP = pytest.mark.xdist_group("oracle-mlx-lm-rotating")
# head_dim = hidden_size / num_attention_heads: the KV quantization groups must divide it.
HEAD_DIM = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]


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


@ORACLE_GROUP
def test_quantized_generation_changes_the_logits_only_after_the_conversion(
    model: UniversalLlama, mlx_lm_runs: dict[str, Any]
) -> None:
    base = logit_bits(run(model))
    late = logit_bits(run(model, kv_bits=8, kv_group_size=32, quantized_kv_start=len(PROMPT) + 4))
    assert np.array_equal(base[:5], late[:5])  # steps 0-4 run on the float cache
    assert not np.array_equal(base[5:], late[5:])
    # The default start is mlx-lm's, and more positions than the run's cache ever holds.
    assert DEFAULT_QUANTIZED_KV_START == mlx_lm_runs["default_quantized_kv_start"]
    never = logit_bits(run(model, kv_bits=4, kv_group_size=32))
    assert DEFAULT_QUANTIZED_KV_START > len(PROMPT) + len(never)
    assert np.array_equal(base, never)


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
    assert cache.make_mask(2) == "causal"  # two queries are a prompt: causal, never the one-query None
    assert cache.make_mask(8) == "causal"  # 0 + 8 == 8 still fits the window (mlx-lm: an array only past it)
    mask = cache.make_mask(9)  # more queries than the window: an explicit windowed mask
    assert isinstance(mask, mx.array) and mask.shape == (9, 9)
    assert np.array_equal(np.array(mask), np.array(create_causal_mask(9, 0, window_size=8)))
    assert not bool(mask[8, 0]) and bool(mask[8, 1])
    cache.update_and_fetch(positions(20), positions(20))
    mask = cache.make_mask(3)  # the offset counts as max_size - 1 positions
    assert np.array_equal(np.array(mask), np.array(create_causal_mask(3, 7, window_size=8)))
    assert cache.make_mask(1) is None
    with pytest.raises(NotImplementedError, match="sliding-window attention over a rotating cache"):
        cache.make_mask(1, window_size=4)
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
        ({"kv_bits": 8, "kv_group_size": 2 * HEAD_DIM}, f"head dim {HEAD_DIM}"),  # a group wider than a head
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


# The rotating cache with kv_bits, run by mlx-lm (below) and in-tree on this module's model.
# Positions in the cache after each model call: the prompt is prefilled in chunks of 4 (4, 8,
# then 9 = len(PROMPT) - 1), step 0's call feeds its last token (len(PROMPT)), step i's call
# feeds one more (len(PROMPT) + i). The conversion after each call meets the cache at that size.
ROTATING = {"max_kv_size": 8, "prefill_step_size": 4, "kv_bits": 8, "kv_group_size": HEAD_DIM}
MID_DECODE_START = len(PROMPT) + 3  # reached by the call of step 3
ROTATING_CASES: dict[str, dict[str, Any]] = {
    # reached by the first prefill chunk: no step is handed out
    "start-0": {**ROTATING, "n": 4, "quantized_kv_start": 0},
    # reached mid-decode, after some steps were handed out
    "start-mid-decode": {**ROTATING, "n": 6, "quantized_kv_start": MID_DECODE_START},
    # never reached (the default start): runs as it runs unquantized
    "default-start": {**ROTATING, "n": 4},
    "unquantized": {**{k: v for k, v in ROTATING.items() if not k.startswith("kv_")}, "n": 4},
}

# mlx-lm runs each case as the oracle generator does (oracles/mlx-lm/generate.py): its cache
# (make_cache: RotatingKVCache(max_kv_size, keep=4) per layer), generate_step with the greedy
# sampler, and the logit tap of oracles/common/lm_steps.py. Each case gives the tokens yielded,
# the raw logits of their steps (as float32 bits), and the exception that ended it, if any.
ORACLE_ROTATING = """
import importlib.util, json, sys
from pathlib import Path
import mlx.core as mx
import numpy as np
from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START, generate_step
from mlx_lm.utils import load_model

job = json.load(open(sys.argv[1]))
oracles = Path(job["oracles"])
sys.path.insert(0, str(oracles / "common"))
from lm_steps import LogitTap
spec = importlib.util.spec_from_file_location("mlx_lm_generator", oracles / "mlx-lm" / "generate.py")
generator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generator)

model, _ = load_model(Path(job["model_dir"]))
out = {"default_quantized_kv_start": DEFAULT_QUANTIZED_KV_START, "cases": {}}
for name, case in job["cases"].items():
    tap = LogitTap(model)
    options = {k: case[k] for k in ("kv_bits", "kv_group_size", "quantized_kv_start") if k in case}
    tokens, raised = [], None
    try:
        for token, _ in generate_step(
            mx.array(job["prompt"]),
            tap,
            max_tokens=case["n"],
            prompt_cache=generator.make_cache(model, case),
            prefill_step_size=case["prefill_step_size"],
            **options,
        ):
            tokens.append(int(token))
    except Exception as exc:
        raised = type(exc).__name__
    # The tapped calls: the prefill chunks (all of the prompt but its last token), then the steps.
    chunks = -(-(len(job["prompt"]) - 1) // case["prefill_step_size"])
    rows = tap.rows[chunks : chunks + len(tokens)]
    bits = [np.array(r.astype(mx.float32)).reshape(-1).view(np.uint32).tolist() for r in rows]
    out["cases"][name] = {"tokens": tokens, "logit_bits": bits, "raised": raised}
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def mlx_lm_runs(model: UniversalLlama, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """mlx-lm's run of every ROTATING_CASES case on this module's model (one oracle venv start)."""
    from harness.paths import oracles_dir

    model_dir = tmp_path_factory.mktemp("kv-model")
    mx.save_safetensors(str(model_dir / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (model_dir / "config.json").write_text(json.dumps(CONFIG))
    job = {"oracles": str(oracles_dir()), "model_dir": str(model_dir), "prompt": PROMPT, "cases": ROTATING_CASES}
    return oracle_answer("mlx-lm", ORACLE_ROTATING, job, tmp_path_factory.mktemp("mlx-lm-rotating"))


def in_tree_rotating(model: UniversalLlama, case: dict[str, Any]) -> dict[str, Any]:
    """The in-tree run of a ROTATING_CASES case, recorded as the oracle script records mlx-lm's."""
    options = {k: v for k, v in case.items() if k != "n"}
    steps, raised = [], None
    try:
        for step in greedy_steps(model, PROMPT, case["n"], **options):
            steps.append(step)
    except Exception as exc:
        raised = type(exc).__name__
    bits = logit_bits(steps).tolist() if steps else []
    return {"tokens": [s.token for s in steps], "logit_bits": bits, "raised": raised}


def rotating_differences(model: UniversalLlama, mlx_lm_runs: dict[str, Any], case: str) -> list[str]:
    """What of the in-tree run of `case` differs from mlx-lm's: raised, tokens, logit_bits."""
    ours, theirs = in_tree_rotating(model, ROTATING_CASES[case]), mlx_lm_runs["cases"][case]
    return [field for field in ("raised", "tokens", "logit_bits") if ours[field] != theirs[field]]


@ORACLE_GROUP
@pytest.mark.parametrize("case", list(ROTATING_CASES))
def test_rotating_cache_with_kv_bits_fails_like_mlx_lm(
    model: UniversalLlama, mlx_lm_runs: dict[str, Any], case: str
) -> None:
    # The same exception (mlx-lm's RotatingKVCache.to_quantized raises NotImplementedError) after
    # the same steps, whose tokens and logits are mlx-lm's bit for bit; no exception and the
    # same steps where the start is never reached.
    assert rotating_differences(model, mlx_lm_runs, case) == []


@ORACLE_GROUP
def test_rotating_cases_fail_and_run_where_they_should(model: UniversalLlama, mlx_lm_runs: dict[str, Any]) -> None:
    # Not a vacuous comparison: in mlx-lm's own runs, both cases reaching the start fail. The
    # call that reaches it is the first prefill chunk's, or step k's = MID_DECODE_START -
    # len(PROMPT); generate_step queues step k before handing out step k - 1, so steps 0..k-2
    # come out first. The case never reaching the start runs as the unquantized one.
    answers = mlx_lm_runs["cases"]
    assert answers["start-0"]["raised"] is not None and answers["start-0"]["tokens"] == []
    assert answers["start-mid-decode"]["raised"] == answers["start-0"]["raised"]
    assert len(answers["start-mid-decode"]["tokens"]) == MID_DECODE_START - len(PROMPT) - 1 > 0
    assert answers["default-start"] == answers["unquantized"] and answers["unquantized"]["raised"] is None
    assert len(answers["unquantized"]["tokens"]) == ROTATING_CASES["unquantized"]["n"]
    # The in-tree error names the option combination.
    with pytest.raises(NotImplementedError, match="max_kv_size"):
        run(model, 4, **{k: v for k, v in ROTATING_CASES["start-0"].items() if k != "n"})


@ORACLE_GROUP
def test_rotating_comparison_fails_when_the_in_tree_side_never_quantizes(
    model: UniversalLlama, mlx_lm_runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above can fail: an in-tree loop that skipped the KV conversion runs on where
    mlx-lm fails, and only there."""
    import models.universal.generate as generate

    monkeypatch.setattr(generate, "maybe_quantize_kv_cache", lambda *args, **kwargs: None)
    for case in ("start-0", "start-mid-decode"):
        assert {"raised", "tokens"} <= set(rotating_differences(model, mlx_lm_runs, case)), case
    for case in ("default-start", "unquantized"):
        assert rotating_differences(model, mlx_lm_runs, case) == [], case


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
