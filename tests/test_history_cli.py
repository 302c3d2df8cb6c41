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


def _with_outcome(report: dict, check: str, outcome: str) -> dict:
    """`report` with the row `scenario/check` given `outcome` (a stale golden's ERROR, say)."""
    scenario, name = check.split("/")
    for row in report["results"]:
        if (row["scenario"], row["check"]) == (scenario, name):
            row["outcome"] = outcome
    return report


def test_m5_h1_an_error_between_passes_is_shown_but_never_flaky(tmp_path: Path, capsys, monkeypatch) -> None:
    """Hostile probe 2, M5 (H1): a stale-golden ERROR between passes on one clean commit is an
    E in the line, not "FLAKY … a harness or backend bug"; a FAIL there still is."""
    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    store.record(db, "parity", _report("pass"), None)
    store.record(db, "parity", _with_outcome(_report("pass"), "plain/prefill_logits", "error"), None)
    store.record(db, "parity", _with_outcome(_report("pass"), "plain/prefill_logits", "skipped"), None)
    store.record(db, "parity", _report("pass"), None)
    out = _history(db, capsys, "--check", "plain/prefill_logits")
    assert "smollm2-135m/plain/prefill_logits  ✓Es✓" in out
    assert "FLAKY" not in out
    store.record(db, "parity", _report("fail"), None)
    assert "FLAKY: passed and failed on commit abc1234" in _history(db, capsys, "--check", "plain/prefill_logits")


def test_m5_h2_another_profile_file_is_not_the_same_check(tmp_path: Path, capsys, monkeypatch) -> None:
    """Hostile probe 2, M5 (H2): a run under MLX_PARITY_PROFILES whose profile file differs in
    any byte is not paired with one under the tracked profile of the same name."""
    from harness.paths import REPO_ROOT

    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    store.record(db, "parity", _report("pass"), None)
    other = tmp_path / "profiles"
    other.mkdir()
    text = (REPO_ROOT / "profiles" / "smollm2-135m.yaml").read_text()
    (other / "smollm2-135m.yaml").write_text(text + "\n# another profile\n")
    monkeypatch.setenv("MLX_PARITY_PROFILES", str(other))
    store.record(db, "parity", _report("fail"), None)
    assert "FLAKY" not in _history(db, capsys, "--check", "plain/prefill_logits")
    store.record(db, "parity", _report("pass"), None)  # the same overridden profile: paired
    assert "FLAKY: passed and failed on commit abc1234" in _history(db, capsys, "--check", "plain/prefill_logits")


def test_m5_h2_other_goldens_or_another_plugin_build_are_not_the_same_check(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Hostile probe 2, M5 (H2): runs whose golden manifests (MLX_PARITY_GOLDENS: the manifest
    the report names) or implementation (a plug-in's pins) differ are never one flip."""
    from harness.paths import REPO_ROOT

    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    store.record(db, "parity", _report("pass"), None)

    moved = _report("fail")  # its goldens copied elsewhere, one manifest changed
    goldens = moved["context"]["provenance"]["smollm2-135m"]["goldens"]
    for entry in goldens.values():
        copy = tmp_path / "goldens" / entry["manifest"]
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes((REPO_ROOT / entry["manifest"]).read_bytes())
        entry["manifest"] = str(copy)
    copy.write_text(copy.read_text().replace("{", '{"edited": 1, ', 1))
    store.record(db, "parity", moved, None)

    plugin = _report("fail")
    implementation = {"name": "plug", "in_tree": False, "pins_hash": "1"}
    plugin["context"]["provenance"]["smollm2-135m"]["implementation"] = implementation
    store.record(db, "parity", plugin, None)
    assert "FLAKY" not in _history(db, capsys, "--check", "plain/prefill_logits")


def test_m5_h2_runs_appended_before_identities_pair_with_none(tmp_path: Path, capsys, monkeypatch) -> None:
    """Hostile probe 2, M5 (H2): a store of the first schema is migrated; its rows read as of
    unknown identity, which are never paired (with known ones, nor with each other)."""
    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    migrations = store.MIGRATIONS
    monkeypatch.setattr(store, "MIGRATIONS", migrations[:1])
    monkeypatch.setattr(store, "_identities", lambda context: {})
    monkeypatch.setattr(store, "record", _record_v1)
    store.record(db, "parity", _report("pass"), None)
    store.record(db, "parity", _report("fail"), None)
    monkeypatch.undo()
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    store.record(db, "parity", _report("fail"), None)  # migrates the store, then appends
    with store.connect(db, write=False) as conn:
        rows = conn.execute("SELECT identity FROM results WHERE scenario = 'plain' AND check_name = 'prefill_logits'")
        identities = [r[0] for r in rows]
    assert identities[:2] == [None, None] and identities[2]
    assert "FLAKY" not in _history(db, capsys, "--check", "plain/prefill_logits")


def _record_v1(path: Path, kind: str, report: dict, report_path: Path | None) -> int:
    """The store's `record` as the first schema had it: runs and results with no identity."""
    commit, dirty = store.checkout_state()
    with store.connect(path, write=True) as conn:
        cursor = conn.execute(
            "INSERT INTO runs (kind, started, finished, commit_sha, dirty, device_key, verdict, models) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                kind,
                report["started"],
                report["finished"],
                commit,
                int(dirty),
                report["context"]["device"]["key"],
                report["verdict"],
                "[]",
            ),
        )
        run_id = int(cursor.lastrowid or 0)
        conn.executemany(
            "INSERT INTO results (run_id, model, scenario, check_name, tier, outcome) VALUES (?, ?, ?, ?, ?, ?)",
            [(run_id, r["model"], r["scenario"], r["check"], r.get("tier"), r["outcome"]) for r in report["results"]],
        )
    return run_id


@pytest.mark.parametrize("last", ["-1", "0", "10001"])
def test_l14_h3_last_outside_1_to_10000_is_a_usage_error(tmp_path: Path, capsys, monkeypatch, last: str) -> None:
    """Hostile probe 2, L14 (H3): `history --last -1` was an IndexError traceback; a count
    outside 1..10000 is now the verb's usage and a line naming --last, exit 2."""
    db = tmp_path / "history.sqlite"
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    store.record(db, "parity", _report("pass"), None)
    with pytest.raises(SystemExit) as stopped:
        cli(["history", "--db", str(db), "--last", last])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and f"--last must be between 1 and 10000, got {last}" in err
    assert "1 runs" in _history(db, capsys, "--last", "1")
