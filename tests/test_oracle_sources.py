"""harness.oracle.sources.load_common: the benchmark helpers both sides of a paired benchmark
measure with, loaded by path into the harness's process, never what a golden depends on."""

from __future__ import annotations

import pytest

from harness.oracle.descriptor import ORACLES
from harness.oracle.sources import common_sources, load_common, script_sources

SHARED_WITH_THE_HARNESS = ("bench_timing", "kv_bench")


@pytest.mark.parametrize("oracle", sorted(name for name, o in ORACLES.items() if "generate.py" in o.scripts))
def test_no_generator_loads_a_module_the_harness_loads(oracle: str) -> None:
    # A module the harness process also runs could let our side's bits reach the goldens.
    assert not set(common_sources(oracle)) & set(SHARED_WITH_THE_HARNESS)


def test_the_bench_scripts_load_them_by_name() -> None:
    assert "common/bench_timing.py" in script_sources("mlx-whisper", "bench.py")
    assert "common/kv_bench.py" in script_sources("mlx-lm", "bench_kv.py")
    assert "common/kv_bench.py" in script_sources("mlx-optiq", "bench_kv.py")


def test_best_of_runs_once_untimed_then_keeps_the_fastest() -> None:
    calls = []
    best = load_common("bench_timing").best_of(lambda: calls.append(1), 3)
    assert len(calls) == 4 and 0 <= best < 1


def test_an_unknown_module_is_named() -> None:
    with pytest.raises(FileNotFoundError, match="oracles/common/no_such_helper.py"):
        load_common("no_such_helper")
