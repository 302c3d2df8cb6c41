"""harness.tools.bench_whisper: per-clip RTF figures and per-round speed-ups from paired rounds (no model)."""

from __future__ import annotations

from harness.tools.bench_whisper import summarize, table


def rounds(seconds: list[float]) -> list[dict]:
    return [{"seconds": {"/c/fox.wav": s}, "peak_bytes": 1, "round": i} for i, s in enumerate(seconds)]


def test_speedups_pair_the_rounds_and_rtf_best_is_the_lowest() -> None:
    ready = {
        side: {"texts": {"/c/fox.wav": "the fox"}, "tokens_sha256": {"/c/fox.wav": "ab"}}
        for side in ("faithful", "fast", "mlx-whisper")
    }
    ready["mlx-whisper"] = {"texts": {"/c/fox.wav": "the fox"}}
    runs = {
        "faithful": rounds([2.0, 4.0, 3.0]),
        "fast": rounds([1.0, 1.0, 1.0]),
        "mlx-whisper": rounds([4.0, 4.0, 6.0]),  # a slow host in round 2 slows every side
    }
    (row,) = summarize(["/c/fox.wav"], {"/c/fox.wav": 2.0}, ready, runs)
    assert row["rtf"]["faithful"]["best"] == 1.0 and row["rtf"]["faithful"]["median"] == 1.5
    assert row["speedup"]["faithful/mlx-whisper"]["values"] == [2.0, 1.0, 2.0]
    assert row["speedup"]["fast/mlx-whisper"]["values"] == [4.0, 4.0, 6.0]
    assert row["speedup"]["fast/faithful"]["best"] == 4.0
    assert row["same_text"] and row["fast_same_tokens_as_faithful"]
    result = {
        "model": "m",
        "rounds": 3,
        "options": {},
        "paths": ["faithful", "fast", "mlx-whisper"],
        "rows": [row],
        "machine": {"device": {"key": "k", "processor": "p"}, "nproc": 2, "python": "3", "date": "d"},
    }
    text = table(result)
    assert "| fox.wav | 2.00 | 1.000 / 1.500 (1.000..2.000)" in text
    assert "| 2.000x / 2.000x (1.000..2.000) | 6.000x / 4.000x (4.000..6.000) |" in text


def test_different_texts_are_flagged() -> None:
    ready = {"faithful": {"texts": {"/c/a.wav": "x"}}, "mlx-whisper": {"texts": {"/c/a.wav": "y"}}}
    runs = {"faithful": rounds([1.0]), "mlx-whisper": rounds([1.0])}
    runs = {k: [{"seconds": {"/c/a.wav": 1.0}, "peak_bytes": 1}] for k in runs}
    (row,) = summarize(["/c/a.wav"], {"/c/a.wav": 1.0}, ready, runs)
    assert not row["same_text"] and "fast_same_tokens_as_faithful" not in row
