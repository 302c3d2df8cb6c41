"""`python -m harness history`: three runs (pass, a real failure, pass) show the failing run
with its step and first diverging module; flips on one clean commit and device are flaky.

The runs are the reports two real `make parity` runs wrote (tests/fixtures/screens/: passing,
and every in-tree RMSNorm nudged by 2^-20), appended the way every parity run appends itself.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.__main__ import main as cli
from harness.history import store

FIXTURES = Path(__file__).parent / "fixtures" / "screens"


def _report(name: str) -> dict:
    with gzip.open(FIXTURES / f"parity-{name}.json.gz", "rt") as f:
        return json.load(f)


def _history(db: Path, capsys, *args: str) -> str:
    assert cli(["history", "--db", str(db), *args]) == 0
    return capsys.readouterr().out


def test_pass_fail_pass_shows_the_failing_run_its_step_and_module(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "history.sqlite"
    commits = iter([("aaa1111", False), ("bbb2222", True), ("ccc3333", False), ("ddd4444", False)])
    monkeypatch.setattr(store, "checkout_state", lambda: next(commits))
    for name in ("pass", "fail", "pass"):
        store.record(db, "parity", _report(name), None)
    out = _history(db, capsys, "--check", "plain/prefill_logits")
    assert "3 runs" in out and "smollm2-135m/plain/prefill_logits  ✓F✓" in out
    assert "failing since" not in out  # it passed again
    assert "FLAKY" not in out  # three different commits: nothing flipped on one
    store.record(db, "parity", _report("fail"), None)  # a fourth run fails again
    out = _history(db, capsys, "--model", "smollm2-135m", "--check", "prefill_logits")
    assert "✓F✓F" in out
    assert "failing since run 4" in out and "step 0, first diverging module model.layers.0.input_layernorm" in out


def test_a_flip_on_one_clean_commit_and_device_is_flaky(tmp_path: Path, capsys, monkeypatch) -> None:
    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    for name in ("pass", "fail"):
        store.record(db, "parity", _report(name), None)
    out = _history(db, capsys, "--check", "plain/prefill_logits")
    assert "FLAKY: passed and failed on commit abc1234 on this device (an L1 check: a harness or backend bug)" in out


def test_uncommitted_changes_are_not_called_flaky(tmp_path: Path, capsys, monkeypatch) -> None:
    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", True))
    for name in ("pass", "fail"):
        store.record(db, "parity", _report(name), None)
    assert "FLAKY" not in _history(db, capsys, "--check", "plain/prefill_logits")


def test_a_store_with_no_runs_is_named(tmp_path: Path, capsys) -> None:
    assert cli(["history", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert "no runs recorded yet" in capsys.readouterr().err
