"""A known-failing implementation still catches new faults (issue 46 part 5, harness/history/
regress.py): each failing check's figures against its previous run of the same profile in the
results store. The external trial's case, on an in-tree stand-in: llama-spm-mini with
chuk-lazarus's hand-written RMSNorm fails its logits gates by a few ULPs; a 1 % attention-scale
fault planted on top leaves the verdicts as they were, and is reported as a regression."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import mlx.core as mx
import pytest

from harness.history import regress
from harness.history.store import connect, record
from harness.model_provenance import model_provenance
from harness.pytest_items import _details
from harness.report import ItemResult, build_report
from harness.screen import render

MODEL = "llama-spm-mini"  # chuk-lazarus's twin in the external trial
LOGITS = ("prefill_logits", "decode_logits", "teacher_forced_logits")


def _rows(size: float, differing: int, outcome: str = "failed") -> list[ItemResult]:
    per_step = [
        {"step": i, "max_abs_diff": size if i < differing else 0.0, "max_ulp": 0, "n_differing": 5 * (i < differing)}
        for i in range(4)
    ]
    details = {"per_step": per_step} if outcome == "failed" else {}
    return [ItemResult(MODEL, "plain", "decode_logits", "L1", "mlx-lm", outcome, "s", 0, 0.1, details)]


def _report(items: list[ItemResult], provenance: dict | None = None) -> dict:
    context = {
        "device": {"key": "cpu-regress-test"},
        "models": [MODEL],
        "provenance": {MODEL: provenance or _PROVENANCE},
        "harness_commit": "abc",
    }
    return json.loads(json.dumps(build_report(items, context, dt.datetime.now(dt.UTC))))


_PROVENANCE = {
    "implementation": {"name": "in-tree"},
    "goldens": {"plain": {"manifest": "profiles/llama-spm-mini.yaml"}},
}


def _kinds(found: list[dict]) -> list[tuple[str, str]]:
    return [(r["check"], r["kind"]) for r in found]


def test_figures_are_the_differing_rows_elements_and_largest_difference() -> None:
    (row,) = _report(_rows(0.25, 3))["results"]
    assert regress.figures(row) == {
        "steps": 4,
        "steps_differing": [0, 1, 2],
        "n_differing": 15,
        "max_abs": 0.25,
        "first_bad_step": 0,
    }
    nan = {"details": {"per_step": [{"n_differing": 1, "max_abs_diff": float("nan")}]}}
    assert regress.figures(nan)["max_abs"] == 0.0  # the check's own row says NaN
    assert regress.figures({"details": {}}) is None


def test_a_failing_check_is_regressed_moved_or_unchanged_against_its_previous_run(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    assert regress.compare_with_previous(_report(_rows(4e-6, 4)), db) == []  # no store: nothing to compare
    record(db, "parity", _report(_rows(4e-6, 2)), None)
    assert regress.compare_with_previous(_report(_rows(4e-6, 2)), db) == []  # the same figures
    worse = regress.compare_with_previous(_report(_rows(0.022, 2)), db)
    assert _kinds(worse) == [("decode_logits", regress.REGRESSED)]
    assert worse[0]["why"] == ["max |Δ| 4e-06 → 0.022"] and worse[0]["since"]["run"] == 1
    wider = regress.compare_with_previous(_report(_rows(4e-6, 3)), db)
    assert _kinds(wider) == [("decode_logits", regress.REGRESSED)]
    assert wider[0]["why"][0] == "1 more step(s) differ (first: row 2)"
    better = regress.compare_with_previous(_report(_rows(1e-6, 2)), db)
    assert _kinds(better) == [("decode_logits", regress.MOVED)]
    # Another profile or goldens than the previous run's: not the same comparison, nothing said.
    other = {"implementation": {"name": "in-tree"}, "goldens": {"plain": {"manifest": "profiles/smollm2-135m.yaml"}}}
    assert regress.compare_with_previous(_report(_rows(0.022, 2), other), db) == []
    # A check that passed in the previous run and fails now is a new failure.
    record(db, "parity", _report(_rows(0, 0, "passed")), None)
    assert _kinds(regress.compare_with_previous(_report(_rows(4e-6, 2)), db)) == [("decode_logits", regress.NEW)]


def test_the_noise_is_the_spread_of_the_implementation_s_own_reruns(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    for size in (1.0e-3, 1.2e-3, 1.1e-3):  # a non-deterministic implementation's reruns
        record(db, "parity", _report(_rows(size, 2)), None)
    assert regress.compare_with_previous(_report(_rows(1.25e-3, 2)), db) == []  # within 2e-4 of 1.1e-3
    (found,) = regress.compare_with_previous(_report(_rows(1.5e-3, 2)), db)
    assert found["kind"] == regress.REGRESSED and found["why"] == ["max |Δ| 0.0011 → 0.0015 (noise 0.0002)"]


def test_the_screen_and_the_stored_rows_say_it(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    record(db, "parity", _report(_rows(4e-6, 2)), None)
    with connect(db, write=False) as conn:
        (figures,) = conn.execute("SELECT figures FROM results").fetchone()
    assert json.loads(figures)["steps_differing"] == [0, 1]
    report = _report(_rows(0.022, 2))
    report["regressions"] = regress.compare_with_previous(report, db)
    lines = [line for line in render(report) if line.text.startswith("REGRESSED")]
    assert len(lines) == 1 and lines[0].style == "red"
    assert lines[0].text.startswith(f"REGRESSED {MODEL}/plain/decode_logits since run 1 (")
    assert lines[0].text.endswith("max |Δ| 4e-06 → 0.022: already failing, now worse")


def test_an_unreadable_store_is_a_note_not_a_failure(tmp_path: Path) -> None:
    bad = tmp_path / "history.sqlite"
    bad.write_bytes(b"not a database at all" * 10)
    found, note = regress.safely(_report(_rows(0.1, 2)), bad)
    assert found == [] and note.startswith("regressions: not compared with the previous run: results store")


# -- the external trial's case, for real --------------------------------------------------------


def _hand_written_rms_norm(model) -> None:
    """chuk-lazarus's RMSNorm: weight * x / sqrt(mean(x²) + eps), not mx.fast.rms_norm."""

    def norm(self, x):
        return self.weight * x / mx.sqrt(mx.mean(x * x, axis=-1, keepdims=True) + self.eps)

    for layer in model.model.layers:
        for n in (layer.input_layernorm, layer.post_attention_layernorm):
            n.__class__ = type("HandWrittenRMSNorm", (type(n),), {"__call__": norm})


def _and_attention_scaled(model) -> None:
    _hand_written_rms_norm(model)
    for layer in model.model.layers:
        layer.self_attn.scale *= 1.01


def _run(hook) -> dict:
    from harness.session import ParitySession

    session = ParitySession(model_hook=hook)
    profile = session.profile(MODEL)
    items = []
    for check in LOGITS:
        r = session.run_check(profile, profile.scenario("plain"), check)
        outcome = "passed" if r.passed else "failed"
        items.append(
            ItemResult(MODEL, "plain", check, "L1", "mlx-lm", outcome, r.summary, r.first_bad_step, 0, _details(r))
        )
    session.release(MODEL)
    return _report(items, model_provenance(MODEL))


@pytest.mark.slow
@pytest.mark.xdist_group(MODEL)
def test_a_fault_planted_in_an_already_failing_implementation_is_a_regression(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    baseline = _run(_hand_written_rms_norm)
    assert {r["check"]: r["outcome"] for r in baseline["results"]} == dict.fromkeys(LOGITS, "failed")
    record(db, "parity", baseline, None)
    assert regress.compare_with_previous(_run(_hand_written_rms_norm), db) == []  # rerun: the same bits
    planted = _run(_and_attention_scaled)
    # The verdicts are those of the baseline: only the figures tell the new fault.
    assert [r["outcome"] for r in planted["results"]] == [r["outcome"] for r in baseline["results"]]
    found = regress.compare_with_previous(planted, db)
    assert _kinds(found) == [(c, regress.REGRESSED) for c in LOGITS]
    was = {r["check"]: regress.figures(r)["max_abs"] for r in baseline["results"]}
    for r in found:
        assert r["figures"]["max_abs"] > 100 * was[r["check"]], r["why"]
        assert any(w.startswith("max |Δ| ") for w in r["why"]), r["why"]
