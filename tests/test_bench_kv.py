"""harness.tools.bench_kv: theoretical KV bytes, the budget planner, the report and the CLI's argument errors.

No timing is asserted: the benchmark's figures are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import mlx.core as mx
import pytest

from harness.cli import main as harness_main
from harness.errors import HarnessError
from harness.oracle.sources import load_common
from harness.paths import REPO_ROOT
from harness.tools.bench_kv import bench, load_prior
from harness.tools.bench_kv_budget import alone_s, attention_work, estimate_run_s, plan_cell, startup_s
from harness.tools.bench_kv_configs import (
    DEFAULT_CONFIGS,
    LayerFormat,
    configs,
    parse_configs,
    theoretical_kv_bytes,
    theoretical_kv_bytes_per_token,
)
from harness.tools.bench_kv_report import plot_png, table
from models.universal.cache import KVCache
from models.universal.quantized_cache import QuantizedKVCache

# The minicpm5-2b-mini twin's attention: 4 layers, 2 KV heads of 64, float32 activations.
LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 64


def stored_bytes_per_token(fmt: LayerFormat, dtype: mx.Dtype, tokens: int = 256) -> float:
    """What mx itself stores for one layer's K and V of `tokens` positions, per position."""
    x = mx.zeros((1, KV_HEADS, tokens, HEAD_DIM), dtype=dtype)
    arrays = [x] if fmt.bits is None else list(mx.quantize(x, group_size=fmt.group_size, bits=fmt.bits))
    return 2 * sum(a.nbytes for a in arrays) / tokens


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("fmt", [LayerFormat(None), LayerFormat(8, 64), LayerFormat(4, 64), LayerFormat(4, 32)])
def test_theoretical_bytes_are_what_mx_stores_for_exact_buffers(fmt: LayerFormat, dtype: mx.Dtype) -> None:
    per_token = theoretical_kv_bytes_per_token([fmt] * LAYERS, KV_HEADS, HEAD_DIM, dtype.size)
    assert per_token == LAYERS * stored_bytes_per_token(fmt, dtype)


def test_theoretical_bytes_of_each_configuration() -> None:
    known = configs(LAYERS)
    per_token = {
        name: theoretical_kv_bytes(known[name], 2048, LAYERS, KV_HEADS, HEAD_DIM, 4)["per_held_token"]
        for name in ("plain", "kv8", "kv4", "mixed", "streaming", "rotating-q4", "rotating")
    }
    # 4 layers x K,V x 2 heads x 64 = 1024 elements a token: 4 bytes, 1 + 8/64, 0.5 + 8/64 each;
    # mixed = two 8-bit layers and two 4-bit ones.
    assert per_token == {
        "plain": 4096,
        "kv8": 1152,
        "kv4": 640,
        "mixed": 896,
        "streaming": 640,
        "rotating-q4": 640,
        "rotating": 4096,
    }
    rotating = theoretical_kv_bytes(known["rotating-q4"], 8192, LAYERS, KV_HEADS, HEAD_DIM, 4)
    assert rotating["tokens_held"] == 1024 and rotating["bytes"] == 1024 * 640
    assert rotating["per_context_token"] == 1024 * 640 / 8192
    unbounded = theoretical_kv_bytes(known["kv4"], 8192, LAYERS, KV_HEADS, HEAD_DIM, 4)
    assert unbounded["per_context_token"] == unbounded["per_held_token"] == 640


def test_theoretical_bytes_refuse_nonsense() -> None:
    with pytest.raises(HarnessError, match="group size 48 does not divide head_dim 64"):
        theoretical_kv_bytes_per_token([LayerFormat(4, 48)], KV_HEADS, HEAD_DIM, 4)
    with pytest.raises(HarnessError, match="need layers"):
        theoretical_kv_bytes_per_token([], KV_HEADS, HEAD_DIM, 4)


def test_measured_bytes_show_the_256_position_blocks() -> None:
    """300 positions live in a 512-position buffer: measured = theoretical x 512/300, float or quantized."""
    keys = mx.ones((1, KV_HEADS, 300, HEAD_DIM))
    for cache_class, fmt in ((KVCache, LayerFormat(None)), (QuantizedKVCache, LayerFormat(4, 64))):
        caches = [cache_class() if fmt.bits is None else cache_class(group_size=64, bits=4) for _ in range(LAYERS)]
        for c in caches:
            c.update_and_fetch(keys, keys)
        measured = load_common("kv_bench").cache_bytes(caches)
        theory = theoretical_kv_bytes_per_token([fmt] * LAYERS, KV_HEADS, HEAD_DIM, 4)
        assert (measured["offset"], measured["tokens_held"]) == (300, 300)
        assert measured["nbytes"] == theory * 512, cache_class.__name__


def test_streaming_converts_half_way_through_the_decode() -> None:
    job = configs(LAYERS)["streaming"].job(context=4096, steps=64)
    assert job["composition"] == {"kind": "streaming_kv", "kv_bits": 4, "kv_group_size": 64, "quantized_kv_start": 4128}
    assert configs(LAYERS)["streaming"].composition.get("quantized_kv_start") is None  # the template is untouched
    mixed = configs(LAYERS)["mixed"].job(1024, 64)["composition"]["kv_config"]
    assert [e["bits"] for e in mixed] == [8, 4, 4, 8]


def test_config_names_are_checked() -> None:
    assert [c.name for c in parse_configs(",".join(DEFAULT_CONFIGS), LAYERS)] == list(DEFAULT_CONFIGS)
    with pytest.raises(HarnessError, match=r"unknown configuration\(s\) \['kv3'\]; expected some of"):
        parse_configs("plain,kv3", LAYERS)
    with pytest.raises(HarnessError, match="named twice"):
        parse_configs("kv4,kv4", LAYERS)


def _cell(config: str, context: int, prefill_s: float, decode_s: float, wall_s: float) -> dict:
    runs = [{"prefill_s": prefill_s, "decode_s": decode_s}]
    return {"config": config, "context": context, "wall_s": wall_s, "sides": {"in-tree": {"runs": runs}}}


def test_attention_work_counts_query_key_pairs() -> None:
    # 1024 tokens in chunks of 2048: 1023 queries against themselves, then the last token against all.
    assert attention_work(1024, 2048) == 1023 * 1023 + 1024
    # chunks of 512 over 1537 tokens: 512 x 512, 512 x 1024, 512 x 1536, then 1537 keys for the last
    assert attention_work(1537, 512) == 512 * 512 + 512 * 1024 + 512 * 1536 + 1537
    # a window of 600 keeps 599 old keys per chunk and shows the last token 600
    assert attention_work(1537, 512, window=600) == 512 * 512 + 512 * (512 + 512) + 512 * (599 + 512) + 600


def test_budget_planner_drops_the_oracle_then_the_cell() -> None:
    kv4, mixed = configs(LAYERS)["kv4"], configs(LAYERS)["mixed"]
    cells = [_cell("plain", 1024, 10.0, 4.0, 40.0), _cell("kv4", 1024, 5.0, 2.0, 30.0)]
    work = attention_work(4096, 2048) / attention_work(1024, 2048)
    assert estimate_run_s(kv4, 1024, 2048, cells) is None  # nothing shorter measured: no estimate, run it
    assert estimate_run_s(kv4, 4096, 2048, cells) == 5.0 * work + 2.0 * 4  # its own run: prefill x work, decode x held
    assert estimate_run_s(mixed, 4096, 2048, cells) == 10.0 * work + 4.0 * 4  # none of its own: the slowest
    assert startup_s(cells) == 40.0 - 14.0  # the most a cell spent outside its runs
    per_run = 5.0 * work + 8.0
    assert plan_cell(kv4, 4096, 1, True, 26 + 2 * per_run, 900.0, 2048, cells) == (True, {})
    oracle, notes = plan_cell(kv4, 4096, 1, True, 26 + per_run + 1, 900.0, 2048, cells)
    assert not oracle and "both sides estimated" in notes["oracle_not_run"] and "not_run" not in notes
    oracle, notes = plan_cell(kv4, 4096, 1, True, 26 + per_run - 1, 900.0, 2048, cells)
    assert f"estimated {26 + per_run:.0f} s for the in-tree side alone" in notes["not_run"]
    # the in-tree sides still to run at this context come before this cell's oracle side
    reserve = alone_s(mixed, 4096, 1, 2048, cells)
    assert reserve == 26 + 10.0 * work + 16
    oracle, notes = plan_cell(kv4, 4096, 1, True, 26 + 2 * per_run, 900.0, 2048, cells, reserve)
    assert not oracle and "kept for the in-tree sides still to run" in notes["oracle_not_run"]
    assert alone_s(kv4, 1024, 1, 2048, cells) == 0.0  # nothing to estimate from
    assert plan_cell(kv4, 1024, 1, True, 0.0, 900.0, 2048, cells)[1] == {
        "not_run": "over budget: the --budget-s 900 s are spent"
    }


def test_two_contexts_of_a_configuration_fit_linear_plus_attention_work() -> None:
    kv4 = configs(LAYERS)["kv4"]
    a, b = 2e-3, 1e-6  # seconds per token, per query-key pair

    def prefill(n: int) -> float:
        return a * n + b * attention_work(n, 2048)

    cells = [_cell("kv4", 1024, prefill(1024), 3.0, 30.0), _cell("kv4", 2048, prefill(2048), 3.0, 30.0)]
    assert estimate_run_s(kv4, 8192, 2048, cells) == pytest.approx(prefill(8192) + 3.0 * 4)
    # one context only: all of the prefill scaled by the attention work, an upper bound
    assert estimate_run_s(kv4, 8192, 2048, cells[:1]) > prefill(8192) + 3.0 * 8


def test_resume_keeps_measured_cells_and_refuses_another_setup(tmp_path) -> None:
    kv4 = configs(LAYERS)["kv4"]
    measured = _cell("kv4", 1024, 5.0, 2.0, 30.0)
    earlier = {"model": "m", "steps": 64, "prefill_step_size": 2048, "shape": {"layers": 4}, "command": "c"}
    earlier["cells"] = [measured, {"config": "kv4", "context": 4096, "not_run": "over budget"}]
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    same = {"model": "m", "steps": 64, "prefill_step_size": 2048, "shape": {"layers": 4}}
    prior, resumed = load_prior(path, same)
    assert list(prior) == [("kv4", 1024)] and prior["kv4", 1024]["resumed_from"] == str(path)
    assert [r["command"] for r in resumed] == ["c"]
    # resumed again: each cell keeps the session it was measured in, and the sessions chain
    again = earlier | {"cells": [prior["kv4", 1024]], "resumed": resumed, "command": "c2"}
    (tmp_path / "again.json").write_text(json.dumps(again))
    prior2, resumed2 = load_prior(tmp_path / "again.json", same)
    assert prior2["kv4", 1024]["resumed_from"] == str(path)
    assert [r["command"] for r in resumed2] == ["c2", "c"]
    # every planned cell already measured: nothing runs (no setup is needed), the cell is kept
    assert bench([kv4], [1024], [1], True, 900.0, {"prefill_step_size": 2048}, {}, prior) == [prior["kv4", 1024]]
    with pytest.raises(HarnessError, match=r"--resume .*earlier.json: its steps is 64, this run's is 32"):
        load_prior(path, same | {"steps": 32})
    path.write_text("{not json")
    with pytest.raises(HarnessError, match="expected a bench-kv result JSON"):
        load_prior(path, same)


def _side(kv_bytes: int, tokens: list[int], classes: dict) -> dict:
    speed = {"best": 2.0, "median": 1.5, "min": 1.0, "max": 2.0, "iqr": [1.0, 2.0], "values": [1.5]}
    theory = {"bytes": 1.0, "per_held_token": 640.0, "per_context_token": 640.0, "tokens_held": 1}
    kv = {"bytes": kv_bytes, "tokens_fed": 10, "tokens_held": 10, "per_held_token": kv_bytes / 10}
    kv |= {"per_context_token": kv_bytes / 10, "cache_types": classes, "theoretical": theory}
    kv["measured_over_theoretical"] = 1.25
    return {"prefill_tok_s": speed, "decode_tok_s": speed, "peak_mb": 50.0, "peak_over_weights_mb": 6.0} | {
        "rss_peak_mb": 100.0,
        "kv": kv,
    }


def test_report_flags_differences_and_cells_not_run() -> None:
    ratio = {k: {"median": 1.1} for k in ("decode_tok_s", "prefill_tok_s")}
    result = {
        "model": "m",
        "shape": {"layers": 4, "kv_heads": 2, "head_dim": 64},
        "prompt": {"scenario": "s", "tokens": 7},
        "steps": 8,
        "prefill_step_size": 2048,
        "budget_s": 900,
        "configs": {"kv4": {"tier": "L1", "oracle": "mlx-lm", "what": "kv_bits 4"}},
        "cells": [
            {
                "config": "kv4",
                "context": 1024,
                "sides": {
                    "in-tree": _side(8000, [1, 2], {"QuantizedKVCache": 4}),
                    "mlx-lm": _side(8000, [1, 3], {"KVCache": 4}),
                },
                "ratio_in_tree_over_oracle": ratio,
                "same_tokens": False,
                "same_cache_classes": False,
                "loadavg_1m_before_after": [1.0, 2.0],
            },
            {"config": "kv4", "context": 8192, "rounds": 1, "not_run": "over budget: estimated 999 s"},
        ],
        "machine": {"device": {"key": "cpu-x", "processor": "p"}, "nproc": 2, "python": "3.11", "date": "d"},
        "command": "python -m harness bench-kv",
    }
    text = table(result)
    assert "tokens DIFFER; cache classes DIFFER" in text
    assert "| kv4 | 8192 | — | not run: over budget: estimated 999 s" in text
    assert "| 800 / 800 | 640 | 1.250 |" in text
    assert plot_png(result).startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--configs", "plain,kv3"], r"--configs: unknown configuration\(s\) \['kv3'\]"),
        (["--contexts", "1024,lots"], "--contexts: expected comma-separated integers"),
        (["--contexts", "8"], "--contexts: expected comma-separated integers >= 65"),
        (["--contexts", "1024,4096", "--rounds", "1,1,1"], "--rounds: expected one number or one per context"),
        (["--steps", "0"], "need positive values"),
    ],
)
def test_argument_errors_exit_2_naming_the_argument(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        harness_main(["bench-kv", *args])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_cli_bad_config_exits_2_before_loading_anything() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness", "bench-kv", "--configs", "nope"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--configs: unknown configuration(s) ['nope']; expected some of" in out.stderr
    assert out.stdout == ""


# A tiny random Llama whose head dim (64) takes the g64 configurations, for the in-tree worker.
TINY = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-5,
    "vocab_size": 64,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def tiny_model():
    from mlx.utils import tree_flatten, tree_unflatten

    from models.universal import LlamaConfig, UniversalLlama

    mx.random.seed(5)
    llama = UniversalLlama(LlamaConfig.from_dict(TINY))
    llama.update(tree_unflatten([(n, mx.random.normal(v.shape) * 0.3) for n, v in tree_flatten(llama.parameters())]))
    llama.eval()
    mx.eval(llama.parameters())
    return llama


# Every run here ends holding 40 + 7 positions: the unbounded caches in one 256-position block;
# the rotating one concatenated its prefill chunks (39 positions), then grew one block in place.
BUFFER = {"rotating-q4": 39 + 256}
CLASSES = {"plain": "KVCache", "rotating-q4": "RotatingQuantizedKVCache"}


@pytest.mark.parametrize("name", DEFAULT_CONFIGS)
def test_worker_measures_every_configuration(tiny_model, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.tools.bench_kv_worker import run_starter, timed_run
    from models.universal.composed import kv_paths

    monkeypatch.setattr(kv_paths, "initial_caches", kv_paths.initial_caches)  # the recorder's wrap is undone
    config = configs(2)[name]
    start = run_starter(tiny_model, config.job(context=40, steps=6), prefill_step_size=16)
    prompt = [(7 * i) % 60 + 3 for i in range(40)]
    first, second = timed_run(start, prompt, 6), timed_run(start, prompt, 6)
    assert len(first["tokens"]) == 7 and first["tokens"] == second["tokens"]
    assert first["active_before_bytes"] == second["active_before_bytes"]  # the first run's cache was freed
    kv = first["kv"]
    assert (kv["offset"], kv["tokens_held"], kv["dtype"]) == (47, 47, "mlx.core.float32")
    assert kv["types"] == {CLASSES.get(name, "QuantizedKVCache"): 2}  # streaming converted at 43 of 47
    per_token = theoretical_kv_bytes(config, kv["offset"], 2, 1, 64, 4)["per_held_token"]
    assert kv["nbytes"] == per_token * BUFFER.get(name, 256)
