"""Compact goldens: hashes decide, full vectors come back on demand, and nothing passes by accident."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.__main__ import main as cli
from harness.errors import OracleError
from harness.records import CompactLogits, ScenarioRecord, row_sha256
from harness.session import ParitySession
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import FakeOracle, fake_session


class _Runner:
    """An in-tree 'implementation' replaying the fake oracle, optionally with one logit nudged."""

    def __init__(self, nudge_row: int | None = None):
        self.nudge_row = nudge_row

    def run(self, spec, forced=None) -> ScenarioRecord:
        counter, FakeOracle.counter = FakeOracle.counter, None  # not an oracle run
        try:
            _, records, _ = FakeOracle("mlx-lm").run(Path("."), [spec])
        finally:
            FakeOracle.counter = counter
        record = records[spec["id"]]
        if self.nudge_row is not None:
            record.logits = record.logits.copy()
            record.logits[self.nudge_row, 3] = np.nextafter(record.logits[self.nudge_row, 3], np.float32(np.inf))
        record.mode = "teacher_forced" if forced is not None else "free"
        return record


@pytest.fixture(autouse=True)
def _no_localization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")  # fake models have no module taps


def _session(root: Path, runner: _Runner) -> ParitySession:
    session = fake_session(root)
    session._runners["tiny"] = runner
    return session


def _drop_cache_vectors(root: Path) -> None:
    """A fresh clone: the tracked manifests only, no blob and no full-vector index."""
    shutil.rmtree(root / "cache" / "blobs", ignore_errors=True)


def test_goldens_are_compact_by_default(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    manifest = json.loads(golden.manifest_path.read_text())
    assert manifest["format"] == 2 and "logits" not in manifest["blobs"]
    compact = manifest["compact"]["logits"]
    assert len(compact["row_sha256"]) == len(golden.record.tokens) == 4
    assert compact["full_steps"] == 2 and golden.record.logits.shape[0] == 2
    # The digests are those of the oracle's vectors (recomputed here from the fake oracle).
    _, records, _ = FakeOracle("mlx-lm").run(Path("."), [{"id": "plain", "n_tokens": 4}])
    assert compact["row_sha256"] == [row_sha256(r) for r in records["plain"].logits]
    assert compact["topk_ids"][0][0] == int(np.argmax(records["plain"].logits[0]))


def test_a_fresh_clone_passes_by_hash_without_running_the_oracle(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    session.goldens(session.profile("tiny"))
    _drop_cache_vectors(isolated)
    FakeOracle.counter = isolated / "runs.txt"
    try:
        fresh = _session(isolated, _Runner())
        profile = fresh.profile("tiny")
        for check in ("prefill_logits", "decode_logits", "teacher_forced_logits", "greedy_tokens"):
            result = fresh.run_check(profile, profile.scenario("plain"), check)
            assert result.passed, result.summary
        assert "sha256" in fresh.run_check(profile, profile.scenario("plain"), "decode_logits").summary
        assert not FakeOracle.counter.exists()  # decided by the hashes alone
    finally:
        FakeOracle.counter = None


def test_one_ulp_fails_and_the_full_vectors_are_regenerated_for_the_diagnosis(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    session.goldens(session.profile("tiny"))
    _drop_cache_vectors(isolated)
    FakeOracle.counter = isolated / "runs.txt"
    try:
        broken = _session(isolated, _Runner(nudge_row=3))
        profile = broken.profile("tiny")
        result = broken.run_check(profile, profile.scenario("plain"), "decode_logits")
        assert not result.passed and result.first_bad_step == 3, result.summary
        assert "max ULP 1;" in result.summary, result.summary  # one ULP, said as such
        assert result.details["first_step_diff"]["max_ulp"] == 1
        assert result.details["first_step_diff"]["n_differing"] == 1
        assert FakeOracle.counter.read_text().count("\n") == 1  # regenerated once, on demand
        # The regenerated vectors were checked and kept: a second session needs no oracle run.
        again = _session(isolated, _Runner(nudge_row=3))
        assert not again.run_check(profile, profile.scenario("plain"), "teacher_forced_logits").passed
        assert FakeOracle.counter.read_text().count("\n") == 1
    finally:
        FakeOracle.counter = None


def test_a_failure_against_a_golden_from_another_processor_says_so_only_if_the_oracle_differs(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_profile(isolated)
    golden = fake_session(isolated).goldens(fake_session(isolated).profile("tiny"))["plain"]
    fresh = _session(isolated, _Runner())
    profile = fresh.profile("tiny")
    assert fresh.recorded_elsewhere(profile, profile.scenario("plain")) is None  # recorded here
    manifest = json.loads(golden.manifest_path.read_text())
    manifest["recorded_on"]["processor"] = "Intel(R) Xeon(R) Platinum 8481C f6m143"
    golden.manifest_path.write_text(json.dumps(manifest))
    # The oracle reproduces the golden's hashes here: this machine is not the cause, no hint.
    broken = _session(isolated, _Runner(nudge_row=3))
    result = broken.run_check(profile, profile.scenario("plain"), "decode_logits")
    assert not result.passed and "recorded on" not in result.summary and "machine_note" not in result.details
    # The oracle does not reproduce it here: then the machine is named, with the way forward.
    real = FakeOracle.records

    def elsewhere(specs):
        records = real(specs)
        for record in records.values():
            record.logits[0, 0] += 1.0
        return records

    monkeypatch.setattr(FakeOracle, "records", staticmethod(elsewhere))
    for index in (isolated / "cache").rglob("full-index"):  # no full vectors kept from before
        shutil.rmtree(index)
    again = _session(isolated, _Runner(nudge_row=3))
    with pytest.raises(OracleError) as failed:
        again.run_check(profile, profile.scenario("plain"), "decode_logits")
    assert "is not reproducible on this machine" in str(failed.value)
    assert "recorded on 'Intel(R) Xeon(R) Platinum 8481C f6m143'" in str(failed.value)
    assert "make goldens MODEL=tiny" in str(failed.value)
    monkeypatch.setattr(FakeOracle, "records", staticmethod(real))


def test_a_tampered_row_hash_never_passes(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    _drop_cache_vectors(isolated)
    manifest = json.loads(golden.manifest_path.read_text())
    manifest["compact"]["logits"]["row_sha256"][2] = "0" * 64
    golden.manifest_path.write_text(json.dumps(manifest))
    fresh = _session(isolated, _Runner())
    profile = fresh.profile("tiny")
    with pytest.raises(OracleError, match=r"not reproducible.*rows \[2\]"):
        fresh.run_check(profile, profile.scenario("plain"), "decode_logits")
    assert json.loads(golden.manifest_path.read_text()) == manifest  # nothing rewritten


def test_compact_goldens_command_rewrites_full_goldens_from_their_blobs(isolated: Path, capsys) -> None:
    write_profile(isolated, text=VALID_PROFILE.format(name="tiny") + "golden:\n  full_steps: all\n")
    session = fake_session(isolated)
    full = session.goldens(session.profile("tiny"))["chat"]
    assert full.manifest["format"] == 1
    write_profile(isolated)  # the profile's default again: compact
    # The command's own session resolves the profile's artifact: give it the fake one.
    import harness.session as session_module

    real = session_module.ParitySession
    session_module.ParitySession = lambda *a, **k: fake_session(isolated)
    try:
        assert cli(["compact-goldens", "--model", "tiny"]) == 0
    finally:
        session_module.ParitySession = real
    out = capsys.readouterr().out
    assert "bytes per golden step" in out
    manifest = json.loads(full.manifest_path.read_text())
    assert manifest["format"] == 2 and manifest["provenance"] == full.manifest["provenance"]
    assert manifest["compact"]["logits"] == CompactLogits.of(full.record.logits, 8, 2).as_json()
    assert manifest["compacted_from"]["logits_blob"] == full.manifest["blobs"]["logits"]["sha256"]


def test_release_drops_a_profiles_model_and_records_only(isolated: Path) -> None:
    write_profile(isolated)
    session = _session(isolated, _Runner())
    profile = session.profile("tiny")
    assert session.run_check(profile, profile.scenario("plain"), "decode_logits").passed
    session._records[("other", "plain", "free")] = "kept"  # another profile's record
    assert "tiny" in session._runners and any(k[0] == "tiny" for k in session._records)
    session.release("tiny")
    assert "tiny" not in session._runners and not any(k[0] == "tiny" for k in session._records)
    assert session._records == {("other", "plain", "free"): "kept"}
    session._runners["tiny"] = _Runner()  # a later run of the profile builds its model again
    assert session.run_check(profile, profile.scenario("plain"), "decode_logits").passed


def test_full_vectors_and_tensors_regenerated_once_are_kept_for_the_next_run(isolated: Path) -> None:
    """A fresh clone has a compact manifest's hashes only: a gate that needs the full vectors (and
    the named tensors, such as Whisper's encoder output) runs the oracle once; they are checked
    against the manifest and kept, so the next run reads them from the cache."""
    FakeOracle.with_arrays = True
    try:
        write_profile(isolated)
        session = fake_session(isolated)
        profile = session.profile("tiny")
        scenario = profile.scenario("plain")
        made = session.goldens(profile)["plain"]
        assert made.record.arrays and json.loads(made.manifest_path.read_text())["compact"]["arrays"]
        _drop_cache_vectors(isolated)
        FakeOracle.counter = isolated / "runs.txt"
        first = fake_session(isolated).full_golden(profile, scenario)
        assert FakeOracle.counter.read_text().count("\n") == 1
        again = fake_session(isolated).full_golden(profile, scenario)
        assert FakeOracle.counter.read_text().count("\n") == 1  # from the cache, not the oracle
        assert again.logits.tobytes() == first.logits.tobytes()
        assert again.arrays["encoder"].tobytes() == first.arrays["encoder"].tobytes()
        # A tensor index that cannot be read is never trusted: said, regenerated and rewritten.
        store = fake_session(isolated).store("mlx-lm")
        index = store._array_index_path(made.record.array_digests["encoder"])
        store.blob_path(json.loads(index.read_text())["sha256"]).unlink()  # not in the manifest's blobs either
        index.write_text("{not json")
        assert store.full_arrays({"encoder": made.record.array_digests["encoder"]}) is None
        mended = fake_session(isolated).full_golden(profile, scenario)
        assert FakeOracle.counter.read_text().count("\n") == 2
        assert mended.arrays["encoder"].tobytes() == first.arrays["encoder"].tobytes()
        assert store.full_arrays({"encoder": made.record.array_digests["encoder"]}) is not None
    finally:
        FakeOracle.counter = None
        FakeOracle.with_arrays = False


def test_a_corrupt_optional_blob_is_removed_and_the_golden_judged_by_its_hashes(isolated: Path) -> None:
    """Hostile probe 2, L10 (A3): a flipped bit in a compact golden's logits_head blob made every
    check ERROR with advice to regenerate all goldens; deleting the blob alone was enough."""
    write_profile(isolated)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    manifest = json.loads(golden.manifest_path.read_text())
    blob = session.store("mlx-lm").blob_path(manifest["blobs"]["logits_head"]["sha256"])
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01
    blob.write_bytes(bytes(data))
    before = golden.manifest_path.read_bytes()
    again = fake_session(isolated).goldens(session.profile("tiny"))["plain"]
    assert not blob.exists()  # removed, not trusted
    assert again.record.logits.shape[0] == 0 and again.record.compact.row_sha256 == golden.record.compact.row_sha256
    assert golden.manifest_path.read_bytes() == before  # the tracked manifest is not rewritten
