"""The results store (harness/history/store.py): every parity run appended, concurrent runs
both kept, a bad file named and never touched."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.history.store import MIGRATIONS, HistoryError, connect, record
from harness.paths import REPO_ROOT
from tests.conftest import write_profile
from tests.test_verdicts import _cli


def _runs(db: Path) -> list[tuple]:
    with connect(db, write=False) as conn:
        return conn.execute("SELECT id, kind, verdict, models FROM runs ORDER BY id").fetchall()


def _results(db: Path, run_id: int) -> list[tuple]:
    with connect(db, write=False) as conn:
        return conn.execute(
            "SELECT scenario, check_name, outcome, first_bad_step FROM results WHERE run_id = ? ORDER BY rowid",
            (run_id,),
        ).fetchall()


def test_every_parity_run_is_appended_with_its_results(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = isolated / "history.sqlite"
    monkeypatch.setenv("MLX_PARITY_HISTORY", str(db))
    write_profile(isolated)
    assert _cli("parity", "--model", "tiny", "--", "-p", "tests.fault_plugin").returncode == 0
    failing = _cli("parity", "--model", "tiny", "--", "-p", "tests.fault_plugin", faults={"chat/decode_logits": "fail"})
    assert failing.returncode == 1
    runs = _runs(db)
    assert [(kind, verdict) for _, kind, verdict, _ in runs] == [("parity", "PASS"), ("parity", "FAIL")]
    report = json.loads(sorted((isolated / "reports").glob("*.json"))[-1].read_text())
    rows = _results(db, runs[1][0])
    assert len(rows) == len(report["results"])  # every check, not only the failing one
    assert ("chat", "decode_logits", "failed", 0) in rows


def test_m5_h2_a_parity_run_stores_its_profile_hash_and_an_unknown_identity_when_unresolved(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile probe 2, M5 (H2): each run stores, per model, the hash of the profile file it
    read; where the report cannot say which goldens and implementation it used (here the
    artifact is not in the cache: its provenance is an error), the identity is unknown (None)."""
    import hashlib

    db = isolated / "history.sqlite"
    monkeypatch.setenv("MLX_PARITY_HISTORY", str(db))
    profile = write_profile(isolated)
    assert _cli("parity", "--model", "tiny", "--", "-p", "tests.fault_plugin").returncode == 0
    with connect(db, write=False) as conn:
        identities = json.loads(conn.execute("SELECT identities FROM runs").fetchone()[0])
        keys = {r[0] for r in conn.execute("SELECT identity FROM results")}
    assert identities["tiny"]["profile"] == hashlib.sha256(profile.read_bytes()).hexdigest()
    assert identities["tiny"]["key"] is None and keys == {None}


def test_m5_h2_a_run_stores_one_key_per_model_of_equal_runs(tmp_path: Path) -> None:
    """Hostile probe 2, M5 (H2): the same profile, manifests and implementation give one key;
    another implementation (a plug-in build's pins) gives another."""
    from harness.history.store import _identities

    manifest = tmp_path / "plain.json"
    manifest.write_text("{}")
    implementation = {"name": "plug", "in_tree": False, "pins_hash": "1"}
    facts = {"goldens": {"plain": {"manifest": str(manifest)}}, "implementation": implementation}
    context = {"models": ["smollm2-135m"], "provenance": {"smollm2-135m": facts}}
    first, again = _identities(context)["smollm2-135m"], _identities(context)["smollm2-135m"]
    assert first["key"] and first == again
    implementation["pins_hash"] = "2"
    assert _identities(context)["smollm2-135m"]["key"] != first["key"]
    manifest.write_text("{ }")
    implementation["pins_hash"] = "1"
    assert _identities(context)["smollm2-135m"]["key"] != first["key"]


def test_two_concurrent_parity_runs_are_both_kept_whole(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = isolated / "history.sqlite"
    monkeypatch.setenv("MLX_PARITY_HISTORY", str(db))
    write_profile(isolated)
    with ThreadPoolExecutor(2) as pool:  # two processes, started together, writing one file
        codes = list(pool.map(lambda _: _cli("parity", "--model", "tiny", "--", "-p", "tests.fault_plugin"), [0, 1]))
    assert [c.returncode for c in codes] == [0, 0], [c.stdout[-500:] for c in codes]
    runs = _runs(db)
    assert len(runs) == 2
    counts = [len(_results(db, run_id)) for run_id, *_ in runs]
    assert counts[0] == counts[1] > 0


def test_many_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    report = {"started": "s", "finished": "f", "verdict": "PASS", "context": {"models": ["m"]}}
    report["results"] = [
        {"model": "m", "scenario": f"s{i}", "check": "c", "outcome": "passed", "summary": ""} for i in range(50)
    ]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    code = (
        "import json, sys; from pathlib import Path; from harness.history.store import record\n"
        "r = json.loads(Path(sys.argv[2]).read_text())\n"
        "for _ in range(10): record(Path(sys.argv[1]), 'parity', r, None)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db), str(path)], cwd=REPO_ROOT) for _ in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    with connect(db, write=False) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 40
        assert conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 40 * 50


def _a_store(tmp_path: Path) -> Path:
    db = tmp_path / "history.sqlite"
    record(db, "parity", {"started": "s", "finished": "f", "verdict": "PASS", "results": []}, None)
    return db


def test_a_truncated_store_is_named_and_left_untouched(tmp_path: Path) -> None:
    db = _a_store(tmp_path)
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    before = db.read_bytes()
    with pytest.raises(HistoryError, match=f"results store {db}: .*left untouched"):
        record(db, "parity", {"started": "s", "finished": "f", "verdict": "PASS", "results": []}, None)
    assert db.read_bytes() == before


def test_a_file_that_is_not_a_database_is_named_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    db.write_text("not a database\n")
    with pytest.raises(HistoryError, match="not a SQLite database .* left untouched"):
        record(db, "parity", {"started": "s", "finished": "f", "verdict": "PASS", "results": []}, None)
    assert db.read_text() == "not a database\n"


def test_a_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = _a_store(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO migrations VALUES (?, datetime('now'))", (len(MIGRATIONS) + 1,))
    before = db.read_bytes()
    with pytest.raises(HistoryError, match=f"schema version {len(MIGRATIONS) + 1} is newer"):
        record(db, "parity", {"started": "s", "finished": "f", "verdict": "PASS", "results": []}, None)
    assert db.read_bytes() == before


def test_a_quality_run_is_appended_per_pair(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from harness.quality.cli import store_report

    def pair(pid: str, parity_failed: bool, status: str | None) -> SimpleNamespace:
        quality = None if status is None else SimpleNamespace(status=status, reasons=[f"{pid}: KL over its bound"])
        named = SimpleNamespace(id=pid)
        return SimpleNamespace(pair=named, oracle="mlx-lm", parity_failed=parity_failed, quality=quality)

    results = [pair("q4", False, "PASS"), pair("q3", False, "FAIL"), pair("kv8", True, None)]
    report = store_report("smollm2-135m", results, "2026-12-04T20:00:00+00:00", {"key": "cpu-x"})
    assert report["verdict"] == "PARITY FAILURE"  # a cross-check failure outranks a quality line
    db = tmp_path / "history.sqlite"
    record(db, "quality", report, None)
    with connect(db, write=False) as conn:
        assert conn.execute("SELECT kind, verdict, device_key FROM runs").fetchall() == [
            ("quality", "PARITY FAILURE", "cpu-x")
        ]
        rows = conn.execute("SELECT scenario, check_name, outcome FROM results ORDER BY rowid").fetchall()
    assert rows == [
        ("q4", "cross_check", "passed"),
        ("q4", "quality", "passed"),
        ("q3", "cross_check", "passed"),
        ("q3", "quality", "failed"),
        ("kv8", "cross_check", "failed"),
    ]


@pytest.mark.parametrize(
    ("case", "where", "says"),
    [
        ("S7", "adir.sqlite", "a directory, not a file"),
        ("S8", "afile/h.sqlite", "cannot make its folder .*afile: .*afile is a file"),
        ("S9", "/proc/h.sqlite", r"cannot make its lock /proc/h\.sqlite\.lock"),
        ("S10", "/sys/h.sqlite", r"cannot make its lock /sys/h\.sqlite\.lock"),
    ],
)
def test_m4_s7_s10_a_store_that_cannot_be_there_is_a_named_history_error(
    tmp_path: Path, case: str, where: str, says: str
) -> None:
    """M4 (S7-S10): a directory, a path under a regular file, a read-only file system: each a
    HistoryError naming the path at once (no OSError, no wait for the lock's timeout)."""
    if where.startswith("/") and not Path(where).parent.is_dir():
        pytest.skip(f"{Path(where).parent}: not on this system")
    (tmp_path / "adir.sqlite").mkdir()
    (tmp_path / "afile").write_text("a file\n")
    db = Path(where) if where.startswith("/") else tmp_path / where
    started = time.monotonic()
    with pytest.raises(HistoryError, match=f"results store {re.escape(str(db))}: {says}"):
        record(db, "parity", {"started": "s", "finished": "f", "verdict": "PASS", "results": []}, None)
    assert time.monotonic() - started < 10, case
    assert (tmp_path / "afile").read_text() == "a file\n" and not any((tmp_path / "adir.sqlite").iterdir())


def test_m4_h8_reading_a_directory_as_the_store_is_a_named_history_error(tmp_path: Path) -> None:
    """M4 (H8): `history --db <directory>` names the directory (exit 2), no IsADirectoryError."""
    with pytest.raises(HistoryError, match=f"results store {re.escape(str(tmp_path))}: a directory, not a file"):
        with connect(tmp_path, write=False):
            pass
    out = _cli("history", "--db", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"error: results store {tmp_path}: a directory, not a file" in out.stderr


def test_m4_s11_a_passing_run_with_an_unwritable_store_keeps_its_report_and_exits_3(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M4 (S7, S11): the verdict and the report stand; the report's line is printed, the store's
    error under it, and the run exits 3 (docs/history.md), not 1 with a traceback."""
    db = isolated / "adir.sqlite"
    db.mkdir()
    monkeypatch.setenv("MLX_PARITY_HISTORY", str(db))
    write_profile(isolated)
    out = _cli("parity", "--model", "tiny", "--", "-p", "tests.fault_plugin")
    text = out.stdout + out.stderr
    assert out.returncode == 3 and "Traceback" not in text, text[-3000:]
    assert len(list((isolated / "reports").glob("*.json"))) == 1
    lines = out.stdout.rstrip().splitlines()
    assert lines[-1].startswith("PASS tiny: all "), lines[-4:]
    assert lines[-3].startswith("report: ") and lines[-2] == f"error: results store {db}: a directory, not a file; " + (
        f"point MLX_PARITY_HISTORY (or --db) at a file, e.g. {db / 'history.sqlite'}"
    ), lines[-4:]
