"""harness.tools.bench_paired: the worker protocol, the rotation of rounds and the statistics."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.tools.bench_paired import Worker, fmt, paired_rounds, quartiles, ratio_stats, side_stats, spread

# A worker speaking the protocol: decode_s is its name's length times the run number.
FAKE = textwrap.dedent(
    """
    import json, sys
    scale = float(sys.argv[1])
    print(json.dumps({"status": "ready", "tokens": [1, 2]}), flush=True)
    for n, line in enumerate(sys.stdin, 1):
        assert line.strip() == "run"
        print(json.dumps({"prefill_s": 0.5, "decode_s": scale * n, "peak_bytes": 10 * n}), flush=True)
    """
)


def fake(tmp_path: Path, name: str, scale: float) -> Worker:
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    return Worker(name, [sys.executable, str(script), str(scale)], {}, tmp_path)


def test_rounds_rotate_and_ratios_pair_rounds(tmp_path: Path) -> None:
    workers = [fake(tmp_path, "a", 1.0), fake(tmp_path, "b", 2.0)]
    try:
        assert [w.wait_ready()["tokens"] for w in workers] == [[1, 2], [1, 2]]
        runs = paired_rounds(workers, 3)
    finally:
        for w in workers:
            w.close()
    assert [r["round"] for r in runs["a"]] == [0, 1, 2]
    a, b = side_stats(runs["a"], steps=6, prompt_tokens=4), side_stats(runs["b"], steps=6, prompt_tokens=4)
    assert a["decode_tok_s"]["values"] == [6.0, 3.0, 2.0]
    assert a["decode_tok_s"]["best"] == 6.0 and a["decode_tok_s"]["median"] == 3.0
    assert a["prefill_tok_s"]["median"] == 8.0 and a["peak_memory_gb"] == 30 / 1e9
    # round i of a over round i of b: b is twice as slow in every round
    assert ratio_stats(a, b)["decode_tok_s"]["values"] == [2.0, 2.0, 2.0]


def test_spread_quartiles() -> None:
    s = spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["best"], s["median"], s["min"], s["max"], s["iqr"]) == (5.0, 3.0, 1.0, 5.0, [2.0, 4.0])
    with pytest.raises(HarnessError, match="no values"):
        spread([])


def test_quartiles_interpolate_between_sorted_values() -> None:
    """25th and 75th percentile at positions 0.25 * (n - 1) and 0.75 * (n - 1) of the sorted list."""
    # 8 values, unsorted: positions 1.75 and 5.25 of 1..8 -> 2.75 and 6.25
    assert quartiles([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]) == (2.75, 6.25)
    # 15 per-round ratios (the fewest docs/benchmarks.md quotes): positions 3.5 and 10.5
    ratios = [1.30, 0.95, 1.10, 1.02, 1.65, 1.08, 0.99, 1.21, 1.11, 1.04, 1.15, 0.97, 1.26, 1.06, 1.12]
    q1, q3 = quartiles(ratios)
    assert (round(q1, 10), round(q3, 10)) == (1.03, 1.18)
    assert spread(ratios)["iqr"] == [q1, q3] and spread(ratios)["median"] == 1.10
    assert quartiles([2.0]) == (2.0, 2.0)


def test_fmt_shows_the_iqr() -> None:
    assert fmt(spread([1.0, 2.0, 3.0, 4.0, 5.0]), "x") == "5.00x / 3.00x, IQR 2.00..4.00 (1.00..5.00)"


def test_dead_worker_is_named(tmp_path: Path) -> None:
    w = Worker("broken", [sys.executable, "-c", "import sys; sys.exit('no model here')"], {}, tmp_path)
    with pytest.raises(HarnessError, match=r"(?s)'broken'.*exit 1.*no model here"):
        w.wait_ready()


def test_worker_must_say_ready_first(tmp_path: Path) -> None:
    w = Worker("chatty", [sys.executable, "-c", 'print(\'{"status": "loading"}\')'], {}, tmp_path)
    with pytest.raises(HarnessError, match="expected a 'ready' line first"):
        w.wait_ready()
    w.close()


def test_rounds_need_one(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="at least 1"):
        paired_rounds([], 0)


def test_spread_of_times_takes_the_lowest_as_best() -> None:
    s = spread([3.0, 1.0, 2.0], lower_is_better=True)
    assert (s["best"], s["median"], s["min"], s["max"]) == (1.0, 2.0, 1.0, 3.0)


def test_a_worker_checks_the_answer_keys_it_was_given(tmp_path: Path) -> None:
    """A Whisper side answers seconds per clip: an LLM-shaped answer is refused, naming what it lacks."""
    (tmp_path / "fake.py").write_text(FAKE)
    w = Worker("whisper", [sys.executable, str(tmp_path / "fake.py"), "1"], {}, tmp_path, ("seconds", "peak_bytes"))
    try:
        w.wait_ready()
        with pytest.raises(HarnessError, match=r"lacks \['seconds'\]"):
            w.run()
    finally:
        w.close()
