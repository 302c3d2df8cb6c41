"""The L2 composed paths (models.universal.composed), in-tree side, on the mini MiniCPM5 twin.

mlx-optiq is not importable here; the bit-exact comparison with it runs through the
oracle (oracles/mlx-optiq). These tests pin what that comparison rests on: compositions are
validated with errors naming the key, every path runs and is deterministic, the paths agree
where optiq's do (all-4-bit mixed KV, streaming conversion and mlx-lm's kv_bits are one
computation), and for each path a perturbation of its one distinguishing parameter (a
layer's bits, the tile size, the window, the drafting window) changes what a gate compares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map

from harness.artifacts.twins import build_twin
from models.universal import UniversalLlama, greedy_steps, load_model
from models.universal.composed import (
    CompositionError,
    NgramIndex,
    composed_steps,
    parse_composition,
)
from models.universal.composed.fused_sdpa import fused_quantized_attention
from models.universal.model import quantized_scaled_dot_product_attention

# A prompt whose tail repeats earlier n-grams, so lookup drafting has something to copy.
PROMPT = [300, 301, 302, 303, 304, 305, 306, 307, 300, 301, 302, 303, 304, 305, 306, 307, 300, 301, 302]
MIXED = [{"layer_idx": 0, "bits": 8}, {"layer_idx": 1, "bits": 4, "group_size": 32}, {"layer_idx": 3, "bits": 4}]


@pytest.fixture(scope="module")
def twin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("twin") / "mini"
    build_twin("minicpm5-2b-mini", path)
    return path


@pytest.fixture(scope="module")
def model(twin_path: Path) -> UniversalLlama:
    return load_model(twin_path)[0]


@pytest.fixture(scope="module")
def half_model(twin_path: Path) -> UniversalLlama:
    """The twin in bfloat16 (packed weights kept): the fused kernel only runs on half-precision queries."""
    half = load_model(twin_path)[0]
    half.update(
        tree_map(lambda v: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v, half.parameters())
    )
    mx.eval(half.parameters())
    return half


def run(model: UniversalLlama, composition: dict[str, Any], n: int = 10, **kw: Any) -> list[Any]:
    kw.setdefault("prefill_step_size", 8)
    return list(composed_steps(model, PROMPT, n, composition, **kw))


def bits(steps: list[Any]) -> np.ndarray:
    return np.stack([np.array(s.logits.astype(mx.float32)).view(np.uint32) for s in steps])


def same(a: list[Any], b: list[Any]) -> bool:
    return bits(a).tobytes() == bits(b).tobytes() and [s.token for s in a] == [s.token for s in b]


# ---- validation ----


@pytest.mark.parametrize(
    ("composition", "named"),
    [
        ("mixed_kv", "expected a dict"),
        ({"kind": "paged_kv"}, "composition.kind"),
        ({"kv_bits": 4}, "composition.kind"),
        ({"kind": "streaming_kv"}, "missing required key(s) ['kv_bits']"),
        ({"kind": "streaming_kv", "kv_bits": 4, "kv_bit": 4}, "unknown key(s) ['kv_bit']"),
        ({"kind": "streaming_kv", "kv_bits": 7}, "kv_bits: expected one of"),
        ({"kind": "streaming_kv", "kv_bits": True}, "kv_bits: expected an int"),
        ({"kind": "streaming_kv", "kv_bits": 4, "quantized_kv_start": -1}, "quantized_kv_start: expected an int >= 0"),
        ({"kind": "fused_sdpa", "kv_bits": 4, "n_chunk": 0}, "n_chunk: expected an int >= 1"),
        ({"kind": "mixed_kv", "kv_config": []}, "kv_config: expected a non-empty list"),
        ({"kind": "mixed_kv", "kv_config": [{"layer_idx": 0}]}, "kv_config[0]: missing required key 'bits'"),
        ({"kind": "mixed_kv", "kv_config": [{"layer_idx": 0, "bits": 4, "groups": 64}]}, "kv_config[0]: unknown key"),
        ({"kind": "mixed_kv", "kv_config": [{"layer_idx": 0, "bits": 4, "group_size": 48}]}, "kv_config[0].group_size"),
        ({"kind": "rotating_quantized_kv", "max_kv_size": 24, "kv_bits": 4}, "missing required key(s) ['keep']"),
        (
            {"kind": "rotating_quantized_kv", "max_kv_size": 4, "keep": 4, "kv_bits": 4},
            "max_kv_size: expected an int >= 5",
        ),
        ({"kind": "ngram_draft", "ngram_min": 3, "ngram_max": 2}, "ngram_max: expected an int >= 3"),
        ({"kind": "ngram_draft", "num_draft_tokens": 0}, "num_draft_tokens: expected an int >= 1"),
        ({"kind": "ngram_draft", "max_kv_size": 32}, "unknown key(s) ['max_kv_size']"),
    ],
)
def test_bad_compositions_are_named(composition: Any, named: str) -> None:
    with pytest.raises(CompositionError) as e:
        parse_composition(composition)
    assert named in str(e.value)


def test_model_dependent_checks_run_before_any_step(model: UniversalLlama) -> None:
    with pytest.raises(CompositionError, match=r"kv_config\[0\]\.layer_idx: expected a layer index below 4"):
        composed_steps(model, PROMPT, 4, {"kind": "mixed_kv", "kv_config": [{"layer_idx": 4, "bits": 4}]})
    with pytest.raises(CompositionError, match="kv_group_size: 128 does not divide the head dim 64"):
        composed_steps(model, PROMPT, 4, {"kind": "streaming_kv", "kv_bits": 4, "kv_group_size": 128})
    with pytest.raises(ValueError, match="forced_tokens: 1 given, 3 needed"):
        composed_steps(model, PROMPT, 4, {"kind": "streaming_kv", "kv_bits": 4}, forced_tokens=[5])


def test_defaults_are_optiq_and_mlx_lm_defaults() -> None:
    assert parse_composition({"kind": "streaming_kv", "kv_bits": 4}).quantized_kv_start == 5000  # mlx-lm's
    assert parse_composition({"kind": "ngram_draft"}).quantized_kv_start == 0  # ngram_generate_step's
    assert parse_composition({"kind": "fused_sdpa", "kv_bits": 4}).n_chunk == 512
    mixed = parse_composition({"kind": "mixed_kv", "kv_config": [{"layer_idx": 2, "bits": 8}]})
    assert mixed.bit_map() == {2: (8, 64)}


# ---- the paths run, agree where optiq's do, and record the final cache ----


def test_mixed_kv_quantizes_only_the_listed_layers_at_the_threshold(model: UniversalLlama) -> None:
    steps = run(model, {"kind": "mixed_kv", "kv_config": MIXED, "quantized_kv_start": 24}, n=10)
    final = steps[-1].info["final_cache"]
    assert [(c["type"], c.get("bits"), c.get("group_size")) for c in final] == [
        ("QuantizedKVCache", 8, 64),
        ("QuantizedKVCache", 4, 32),
        ("KVCache", None, None),
        ("QuantizedKVCache", 4, 64),
    ]
    assert all(c["offset"] == len(PROMPT) + 10 for c in final)  # the look-ahead step fed the last token
    assert all(s.info == {} for s in steps[:-1])
    # Delayed: the steps before the conversion (offset 19..23) are those of a float cache.
    plain = list(greedy_steps(model, PROMPT, 10, prefill_step_size=8))
    assert bits(steps)[:5].tobytes() == bits(plain)[:5].tobytes()
    assert bits(steps)[6:].tobytes() != bits(plain)[6:].tobytes()


def test_uniform_mixed_kv_and_streaming_conversion_are_mlx_lm_kv_bits(model: UniversalLlama) -> None:
    everything = [{"layer_idx": i, "bits": 4} for i in range(4)]
    mixed = run(model, {"kind": "mixed_kv", "kv_config": everything, "quantized_kv_start": 20})
    streaming = run(model, {"kind": "streaming_kv", "kv_bits": 4, "quantized_kv_start": 20})
    stock = list(greedy_steps(model, PROMPT, 10, prefill_step_size=8, kv_bits=4, quantized_kv_start=20))
    assert same(mixed, streaming) and same(streaming, stock)


def test_rotating_quantized_kv_runs_past_the_wrap(model: UniversalLlama) -> None:
    direct = run(model, {"kind": "rotating_quantized_kv", "max_kv_size": 24, "keep": 4, "kv_bits": 4}, n=12)
    final = direct[-1].info["final_cache"]
    assert {c["type"] for c in final} == {"RotatingQuantizedKVCache"}
    assert final[0]["offset"] == len(PROMPT) + 12 > 24  # wrapped
    converted = run(
        model,
        {"kind": "rotating_quantized_kv", "max_kv_size": 24, "keep": 4, "kv_bits": 4, "quantized_kv_start": 22},
        n=12,
    )
    assert not same(direct, converted)  # float until offset 22, then the converted window
    float_window = list(greedy_steps(model, PROMPT, 12, prefill_step_size=8, max_kv_size=24))
    assert bits(converted)[:3].tobytes() == bits(float_window)[:3].tobytes()


def test_fused_sdpa_is_stock_attention_on_fp32_and_its_own_on_bf16(
    model: UniversalLlama, half_model: UniversalLlama
) -> None:
    fused = {"kind": "fused_sdpa", "kv_bits": 4, "quantized_kv_start": 0, "n_chunk": 8}
    stock = {"kind": "streaming_kv", "kv_bits": 4, "quantized_kv_start": 0}
    assert same(run(model, fused, n=4), run(model, stock, n=4))  # optiq falls back for fp32 queries
    short = {"n": 3, "prefill_step_size": 6}
    half_fused = run(half_model, fused, **short)
    assert half_fused[0].logits.dtype == mx.bfloat16
    assert not same(half_fused, run(half_model, stock, **short))  # the tiled kernel rounds its own way


def test_fused_kernel_falls_back_where_optiq_does() -> None:
    mx.random.seed(0)
    q = mx.random.normal((1, 4, 3, 64)).astype(mx.bfloat16)
    k = list(mx.quantize(mx.random.normal((1, 2, 20, 64)).astype(mx.bfloat16), group_size=64, bits=4))
    v = list(mx.quantize(mx.random.normal((1, 2, 20, 64)).astype(mx.bfloat16), group_size=64, bits=4))
    stock = quantized_scaled_dot_product_attention(q, k, v, 0.125, "causal", 64, 4)
    tiled = fused_quantized_attention(q, k, v, scale=0.125, mask="causal", group_size=64, bits=4, n_chunk=8)
    assert np.allclose(np.array(stock.astype(mx.float32)), np.array(tiled.astype(mx.float32)), atol=0.05)
    mask = mx.ones((3, 20), dtype=mx.bool_)  # an array mask (a rotating window's): stock path
    assert mx.array_equal(
        fused_quantized_attention(q, k, v, scale=0.125, mask=mask, group_size=64, bits=4, n_chunk=8),
        quantized_scaled_dot_product_attention(q, k, v, 0.125, mask, 64, 4),
    ).item()
    q32 = q.astype(mx.float32)
    assert mx.array_equal(
        fused_quantized_attention(q32, k, v, scale=0.125, mask="causal", group_size=64, bits=4, n_chunk=8),
        quantized_scaled_dot_product_attention(q32, k, v, 0.125, "causal", 64, 4),
    ).item()


def test_ngram_index_proposes_the_best_agreeing_occurrence() -> None:
    index = NgramIndex(2, 3)
    index.extend([1, 2, 3, 9, 7, 1, 2, 3, 4, 5, 8, 2, 3])
    # "8 2 3" occurs only at the end; "2 3" also ended at 3 and 8. Both agree with the
    # current tail on 2 tokens ([1, 2, 3] and [1, 2, 3] against [8, 2, 3]): the later one wins.
    assert index.propose(3) == [4, 5, 8]
    assert index.propose(0) == []
    index.append(6)
    assert index.propose(3) == []


def test_ngram_drafting_runs_reports_counters_and_the_final_cache(model: UniversalLlama) -> None:
    steps = run(model, {"kind": "ngram_draft", "num_draft_tokens": 4, "ngram_min": 1, "ngram_max": 2}, n=16)
    assert all(set(s.info) >= {"drafted", "accepted"} for s in steps)
    assert sum(s.info["drafted"] for s in steps) > 0
    assert all(0 <= s.info["accepted"] <= s.info["drafted"] or s.info["drafted"] == 0 for s in steps)
    final = steps[-1].info["final_cache"]
    assert [c["offset"] for c in final] == [len(PROMPT) + 16] * 4  # every yielded token, nothing more
    assert [s.token for s in steps] == [int(mx.argmax(s.logits).item()) for s in steps]


def test_ngram_teacher_forced_with_its_own_tokens_is_the_free_run(model: UniversalLlama) -> None:
    composition = {"kind": "ngram_draft", "num_draft_tokens": 4, "ngram_min": 1, "ngram_max": 2, "kv_bits": 8}
    free = run(model, composition, n=12)
    forced = run(model, composition, n=12, forced_tokens=[s.token for s in free])
    assert same(free, forced) and [s.info for s in free] == [s.info for s in forced]


def test_forced_prefix_forces_tokens_on_both_loops(model: UniversalLlama) -> None:
    for composition in ({"kind": "streaming_kv", "kv_bits": 8}, {"kind": "ngram_draft", "ngram_min": 1}):
        steps = run(model, composition, n=5, forced_prefix=[7, 8, 1])
        assert [s.token for s in steps[:3]] == [7, 8, 1]


@pytest.mark.parametrize(
    "composition",
    [
        {"kind": "mixed_kv", "kv_config": MIXED, "quantized_kv_start": 0},
        {"kind": "rotating_quantized_kv", "max_kv_size": 20, "keep": 4, "kv_bits": 8},
        {"kind": "ngram_draft", "num_draft_tokens": 3, "ngram_min": 1, "ngram_max": 2},
    ],
)
def test_paths_are_deterministic(model: UniversalLlama, composition: dict[str, Any]) -> None:
    a, b = run(model, composition, n=6), run(model, composition, n=6)
    assert same(a, b) and [s.info for s in a] == [s.info for s in b]


# ---- perturbations: what a gate compares changes ----


def test_one_layers_bits_changed_changes_the_logits(model: UniversalLlama) -> None:
    perturbed = [dict(MIXED[0]), dict(MIXED[1], bits=8), dict(MIXED[2])]
    a = run(model, {"kind": "mixed_kv", "kv_config": MIXED, "quantized_kv_start": 0}, n=4)
    b = run(model, {"kind": "mixed_kv", "kv_config": perturbed, "quantized_kv_start": 0}, n=4)
    assert bits(a).tobytes() != bits(b).tobytes()
    assert a[-1].info["final_cache"] != b[-1].info["final_cache"]


def test_conversion_threshold_changed_changes_the_logits(model: UniversalLlama) -> None:
    a = run(model, {"kind": "streaming_kv", "kv_bits": 4, "quantized_kv_start": 22}, n=8)
    b = run(model, {"kind": "streaming_kv", "kv_bits": 4, "quantized_kv_start": 24}, n=8)
    assert bits(a)[:3].tobytes() == bits(b)[:3].tobytes()  # both still float
    assert bits(a).tobytes() != bits(b).tobytes()


def test_tile_size_changed_changes_the_logits(half_model: UniversalLlama) -> None:
    base = {"kind": "fused_sdpa", "kv_bits": 4, "quantized_kv_start": 0}
    a = run(half_model, {**base, "n_chunk": 8}, n=3, prefill_step_size=6)
    b = run(half_model, {**base, "n_chunk": 5}, n=3, prefill_step_size=6)
    assert bits(a).tobytes() != bits(b).tobytes()


def test_window_changed_changes_the_logits_and_cache(model: UniversalLlama) -> None:
    a = run(model, {"kind": "rotating_quantized_kv", "max_kv_size": 24, "keep": 4, "kv_bits": 4}, n=10)
    b = run(model, {"kind": "rotating_quantized_kv", "max_kv_size": 24, "keep": 2, "kv_bits": 4}, n=10)
    assert bits(a).tobytes() != bits(b).tobytes()
    assert a[-1].info["final_cache"] != b[-1].info["final_cache"]


def test_drafting_window_changed_changes_the_counters(model: UniversalLlama) -> None:
    a = run(model, {"kind": "ngram_draft", "num_draft_tokens": 4, "ngram_min": 1, "ngram_max": 2}, n=12)
    b = run(model, {"kind": "ngram_draft", "num_draft_tokens": 2, "ngram_min": 1, "ngram_max": 2}, n=12)
    assert [s.info for s in a] != [s.info for s in b]
