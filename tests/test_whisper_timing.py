"""Word timestamps: the timing stage against its definitions, against mlx-whisper's own
timing functions, and end to end against mlx-whisper's `word_timestamps=True` transcript.

The unit tests check the DTW against an exhaustive search and a cell-by-cell recurrence,
and the median filter against a direct per-position median. The oracle tests run
mlx-whisper 0.4.3 in its venv: its `dtw`, `median_filter` and `merge_punctuations` on the
same inputs (bits compared), and its generator on fox.wav with word timestamps (the golden
the `transcript` gate judges, words included). Perturbations (median filter width, a DTW
path off by one frame) must change the words.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from harness.artifacts.resolve import resolve_artifact
from harness.checks.compare import compare_json
from harness.oracle.venvs import ensure_oracle_env
from harness.paths import REPO_ROOT, profiles_dir
from harness.profile.load import load_profile
from models.whisper import timing
from models.whisper.timing import WordTiming, dtw, median_filter, merge_punctuations
from tests.conftest import WORD_OPTIONS, fox_words_golden

FOX = REPO_ROOT / "fixtures" / "audio" / "fox.wav"


# ---------------------------------------------------------------- definitions


def path_cost(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> float:
    return float(np.sum(x[rows, cols], dtype=np.float64))


def all_monotonic_paths(n: int, m: int):
    """Every path from (0, 0) to (n-1, m-1) moving down, right or diagonally."""

    def extend(path):
        i, j = path[-1]
        if (i, j) == (n - 1, m - 1):
            yield path
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < n and j + dj < m:
                yield from extend(path + [(i + di, j + dj)])

    yield from extend([(0, 0)])


def recurrence_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The DTW written cell by cell (column-major), ties: diagonal only if strictly
    cheapest, then up if strictly cheapest, else left."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, np.float32)
    cost[0, 0] = 0
    move = {}
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            d, u, left = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if d < u and d < left:
                c, step = d, (1, 1)
            elif u < d and u < left:
                c, step = u, (1, 0)
            else:
                c, step = left, (0, 1)
            cost[i, j] = np.float32(x[i - 1, j - 1]) + c
            move[i, j] = step
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        di, dj = move[i, j] if i > 0 and j > 0 else ((1, 0) if j == 0 else (0, 1))
        i, j = i - di, j - dj
    path = np.array(path[::-1])
    return path[:, 0], path[:, 1]


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (4, 1), (3, 4), (4, 6), (5, 5)])
def test_dtw_finds_the_cheapest_monotonic_path(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        x = rng.permutation(shape[0] * shape[1]).reshape(shape).astype(np.float32)  # exact sums
        costs = {tuple(p): path_cost(x, *np.array(p).T) for p in all_monotonic_paths(*shape)}
        best = min(costs.values())
        winners = [p for p, c in costs.items() if c == best]
        rows, cols = dtw(x)
        assert path_cost(x, rows, cols) == best
        if len(winners) == 1:
            assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == list(winners[0])


@pytest.mark.parametrize("shape", [(2, 3), (7, 30), (30, 7), (12, 150)])
def test_dtw_equals_the_cell_by_cell_recurrence(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    for x in (
        rng.standard_normal(shape).astype(np.float32),
        rng.integers(0, 3, shape).astype(np.float32),  # many ties: the tie rule decides
        np.zeros(shape, np.float32),
    ):
        rows, cols = dtw(x)
        want_rows, want_cols = recurrence_dtw(x)
        assert np.array_equal(rows, want_rows) and np.array_equal(cols, want_cols)
        assert rows.dtype == np.int64 and cols.dtype == np.int64


def test_dtw_refuses_an_empty_matrix() -> None:
    with pytest.raises(ValueError, match="non-empty 2-D"):
        dtw(np.zeros((0, 3), np.float32))


def direct_median_filter(x: np.ndarray, width: int) -> np.ndarray:
    half = width // 2
    n = x.shape[-1]
    out = np.empty_like(x, dtype=np.float32)
    for p in range(n):
        # reflect without repeating the edge: index -k is k, index n-1+k is n-1-k
        idx = [abs(q) if q < 0 else (2 * (n - 1) - q if q >= n else q) for q in range(p - half, p + half + 1)]
        out[..., p] = np.median(x[..., idx].astype(np.float32), axis=-1)
    return out


@pytest.mark.parametrize("width", [1, 3, 7])
def test_median_filter_equals_the_per_position_median(width: int) -> None:
    x = np.random.default_rng(width).standard_normal((3, 4, 40)).astype(np.float32)
    got = median_filter(x, width)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(got.view(np.uint32), direct_median_filter(x, width).view(np.uint32))


def test_median_filter_leaves_rows_shorter_than_half_the_width_and_refuses_even_widths() -> None:
    x = np.arange(3, dtype=np.float32)[None, None]
    assert median_filter(x, 7) is x
    with pytest.raises(ValueError, match="positive odd"):
        median_filter(x, 4)


# ---------------------------------------------------------------- against mlx-whisper's functions

ORACLE_TIMING = """
import json, sys
import numpy as np
from mlx_whisper import timing
job = json.load(open(sys.argv[1]))
out = {}
for name, x in job["dtw"].items():
    r, c = timing.dtw(np.array(x, dtype=np.float32))
    out["dtw/" + name] = [r.tolist(), c.tolist()]
for name, (x, w) in job["medfilt"].items():
    out["medfilt/" + name] = timing.median_filter(np.array(x, dtype=np.float32), w).view(np.uint32).tolist()
for name, words in job["merge"].items():
    alignment = [timing.WordTiming(w, t, 0.0, 0.0, 0.0) for w, t in words]
    timing.merge_punctuations(alignment, "\\"'“¿([{-", "\\"'.。,，!！?？:：”)]}、")
    out["merge/" + name] = [[a.word, a.tokens] for a in alignment]
json.dump(out, open(sys.argv[2], "w"))
"""

MERGE_CASES = {
    "quotes": [[" He", [1]], [" said", [2]], [' "', [3]], ["hi", [4]], ['"', [5]], [".", [6]]],
    "brackets": [[" (", [1]], [" [", [2]], ["a", [3]], [")", [4]], [" b", [5]], ["!", [6]], ["?", [7]]],
    "spaced-closer": [[" x ", [1]], [",", [2]], [" y", [3]], [" -", [4]], [" z", [5]]],
    "only-punctuation": [[" ¿", [1]], ["?", [2]]],
}


def test_timing_functions_match_mlx_whisper_bit_for_bit(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    job = {
        "dtw": {
            "normal": rng.standard_normal((9, 40)).astype(np.float32).tolist(),
            "ties": rng.integers(0, 3, (6, 25)).astype(np.float32).tolist(),
            "tall": rng.standard_normal((25, 8)).astype(np.float32).tolist(),
        },
        "medfilt": {
            "w7": [rng.standard_normal((2, 5, 33)).astype(np.float32).tolist(), 7],
            "w3-short": [rng.standard_normal((1, 2, 2)).astype(np.float32).tolist(), 3],
        },
        "merge": MERGE_CASES,
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "oracle.py").write_text(ORACLE_TIMING)
    cmd, env = ensure_oracle_env("mlx-whisper").command(
        str(tmp_path / "oracle.py"), str(tmp_path / "job.json"), str(tmp_path / "out.json")
    )
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tmp_path)
    want = json.loads((tmp_path / "out.json").read_text())

    for name, x in job["dtw"].items():
        rows, cols = dtw(np.array(x, np.float32))
        assert [rows.tolist(), cols.tolist()] == want[f"dtw/{name}"], name
    for name, (x, width) in job["medfilt"].items():
        got = median_filter(np.array(x, np.float32), width).view(np.uint32).tolist()
        assert got == want[f"medfilt/{name}"], name
    for name, words in MERGE_CASES.items():
        alignment = [WordTiming(w, list(t), 0.0, 0.0, 0.0) for w, t in words]
        merge_punctuations(alignment, timing.PREPEND_PUNCTUATIONS, timing.APPEND_PUNCTUATIONS)
        assert [[a.word, a.tokens] for a in alignment] == want[f"merge/{name}"], name


# ---------------------------------------------------------------- end to end on fox.wav


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_artifact(load_profile(profiles_dir() / "whisper-tiny-en.yaml")).model_dir


@pytest.fixture(scope="module")
def oracle_fox_words() -> dict:
    return fox_words_golden()


@pytest.fixture(scope="module")
def fox_model(model_dir: Path):
    from models.whisper.load import load_model

    return load_model(model_dir, mx.float32)


@pytest.mark.slow
def test_fox_words_equal_mlx_whisper(oracle_fox_words: dict, fox_model, model_dir: Path) -> None:
    """The word gate: the whole transcript, every word's start, end and probability."""
    from harness.runners.whisper_record import transcribe_record

    golden = oracle_fox_words["transcript"]
    assert all(segment.get("words") for segment in golden["segments"]), "the golden has no words"
    record = transcribe_record(fox_model, model_dir, FOX, dict(WORD_OPTIONS, seed=0))
    result = compare_json("transcript", "transcript", golden, record["transcript"])
    assert result.passed, result.summary


def window_words(model, model_dir: Path, golden: dict, **alignment_options) -> list[dict]:
    """The words of fox.wav's one window, timed in-tree from the golden's decode tokens."""
    from models.whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
    from models.whisper.decoding_types import DecodingResult
    from models.whisper.segments import split_segments
    from models.whisper.tokenizer import get_tokenizer, load_encoding

    (call,) = [c for c in golden["decode_calls"] if c["kept"]]
    encoding = load_encoding(model_dir, model.num_languages, model.dims.n_vocab)
    tokenizer = get_tokenizer(encoding, multilingual=False, num_languages=model.num_languages, language="en")
    mel = log_mel_spectrogram(str(FOX), n_mels=model.dims.n_mels, padding=N_SAMPLES)  # as transcribe does
    size = min(N_FRAMES, mel.shape[0] - N_FRAMES)
    segment = pad_or_trim(mel[:size], N_FRAMES, axis=-2)
    result = DecodingResult(
        audio_features=None,
        language="en",
        tokens=call["tokens"],
        avg_logprob=call["avg_logprob"],
        no_speech_prob=call["no_speech_prob"],
        temperature=call["temperature"],
        compression_ratio=call["compression_ratio"],
    )
    segments = split_segments(call["tokens"], tokenizer, result, seek=0, segment_size=size, input_stride=2).segments
    timing.add_word_timestamps(
        segments=segments,
        model=model,
        tokenizer=tokenizer,
        mel=segment,
        num_frames=size,
        last_speech_timestamp=0.0,
        **alignment_options,
    )
    return [
        {k: (v.item() if isinstance(v, np.generic) else v) for k, v in w.items()} for s in segments for w in s["words"]
    ]


def golden_words(golden: dict) -> list[dict]:
    return [w for s in golden["transcript"]["segments"] for w in s["words"]]


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
def test_perturbed_timing_changes_the_words(oracle_fox_words: dict, fox_model, model_dir: Path, monkeypatch) -> None:
    """Unperturbed, the window's words equal the golden's; a median filter of width 5 or a
    DTW path shifted one frame later does not."""
    want = golden_words(oracle_fox_words)
    assert window_words(fox_model, model_dir, oracle_fox_words) == want

    assert window_words(fox_model, model_dir, oracle_fox_words, medfilt_width=5) != want

    original_dtw = timing.dtw

    def late_by_one_frame(x):
        rows, cols = original_dtw(x)
        return rows, cols + 1

    monkeypatch.setattr(timing, "dtw", late_by_one_frame)
    shifted = window_words(fox_model, model_dir, oracle_fox_words)
    assert shifted != want
    assert [w["word"] for w in shifted] == [w["word"] for w in want]  # same words, other times
