"""The golden store's guards, walked on a store in tmp_path: manifests it refuses (stale format,
missing sections, arrays without blobs or digests), optional blobs and cache indexes that do not
hash as the golden says (never trusted), and compacting that keeps a golden's generation time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import GoldenError, StaleGoldenError
from harness.goldens import store as store_module
from harness.goldens.store import GoldenStore
from harness.records import CompactLogits, ScenarioRecord

PROVENANCE = {"oracle": {"name": "fake"}}


def _store(tmp_path: Path) -> GoldenStore:
    return GoldenStore(tmp_path / "goldens", tmp_path / "blobs", "key")


def _record(arrays: bool = False) -> ScenarioRecord:
    logits = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    return ScenarioRecord(
        scenario_id="plain",
        rendered_prompt=None,
        prompt_ids=[1],
        tokens=[3, 3, 3],
        logits=logits,
        eos_ids=[0],
        arrays={"enc": np.ones((2, 2), np.float32)} if arrays else {},
    )


def _rewrite(path: Path, edit) -> None:
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the store says on progress (quiet in tests, so captured here)."""
    messages: list[str] = []
    monkeypatch.setattr(store_module.progress, "say", messages.append)
    return messages


def test_a_manifest_of_an_unknown_format_is_stale(tmp_path: Path) -> None:
    """A format the harness does not read is a StaleGoldenError naming it and how to regenerate."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(), PROVENANCE, {})
    _rewrite(golden.manifest_path, lambda m: m.update(format=7))
    with pytest.raises(StaleGoldenError, match=r"stale golden .*format 7.*make goldens MODEL=tiny"):
        store.read_manifest("tiny", "plain")


def test_a_compact_manifest_without_its_compact_section_is_corrupt(tmp_path: Path) -> None:
    """Format 2 without a 'compact' object is a GoldenError, not a golden with no hashes."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(), PROVENANCE, {}, compact=(2, 1))
    _rewrite(golden.manifest_path, lambda m: m.update(compact=[]))
    with pytest.raises(GoldenError, match="compact format without a 'compact' section"):
        store.read_manifest("tiny", "plain")


def test_loading_an_absent_golden_is_an_error(tmp_path: Path) -> None:
    """`load` of a golden never written names the missing manifest."""
    store = _store(tmp_path)
    with pytest.raises(GoldenError, match=r"missing golden .*plain\.json"):
        store.load("tiny", "plain")


def test_a_full_manifest_without_a_logits_blob_is_corrupt(tmp_path: Path) -> None:
    """A format-1 manifest must name its logits blob."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(), PROVENANCE, {})
    _rewrite(golden.manifest_path, lambda m: m["blobs"].pop("logits"))
    with pytest.raises(GoldenError, match="no 'logits' blob"):
        store.load("tiny", "plain")


def test_a_full_manifest_naming_arrays_without_blobs_is_corrupt(tmp_path: Path) -> None:
    """Every tensor the record names needs its blob in a full golden."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(arrays=True), PROVENANCE, {})
    _rewrite(golden.manifest_path, lambda m: m["blobs"].pop("enc"))
    with pytest.raises(GoldenError, match=r"record names arrays \['enc'\] without blobs"):
        store.load("tiny", "plain")


def test_a_compact_manifest_whose_digests_differ_from_the_named_arrays_is_corrupt(tmp_path: Path) -> None:
    """A compact golden's tensor digests must be exactly the tensors its record names."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(arrays=True), PROVENANCE, {}, compact=(2, 1))
    _rewrite(golden.manifest_path, lambda m: m["compact"]["arrays"].pop("enc"))
    with pytest.raises(GoldenError, match=r"record names arrays \['enc'\], digests \[\]"):
        store.load("tiny", "plain")


def test_an_optional_head_blob_whose_rows_do_not_hash_is_removed(tmp_path: Path, said: list[str]) -> None:
    """A readable head blob whose rows differ from the manifest's hashes is said, removed and
    ignored: the golden is judged by its hashes alone."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(), PROVENANCE, {}, compact=(2, 1))
    other = store.put_blob(np.full((1, 4), 9.0, np.float32))  # a well-formed blob of other rows
    _rewrite(golden.manifest_path, lambda m: m["blobs"].update(logits_head=other))
    loaded = store.load("tiny", "plain")
    assert loaded.record.logits.shape == (0, 4) and loaded.record.is_compact
    assert not store.blob_path(other["sha256"]).exists()
    assert any("logits_head" in m and "its rows do not hash to plain.json's" in m for m in said)


def test_full_logits_that_do_not_hash_to_the_rows_are_not_remembered(tmp_path: Path) -> None:
    """remember_full refuses vectors other than the compact golden's."""
    store = _store(tmp_path)
    compact = CompactLogits.of(_record().logits, 2, 1)
    with pytest.raises(GoldenError, match="do not hash to the compact golden's rows: not remembered"):
        store.remember_full(compact, _record().logits + 1)
    assert not (tmp_path / "blobs" / "full-index").exists()


def test_a_full_vector_index_pointing_at_other_vectors_is_not_trusted(tmp_path: Path, said: list[str]) -> None:
    """An index whose (intact) blob holds other rows gives None and says the index is corrupt."""
    store = _store(tmp_path)
    logits = _record().logits
    compact = CompactLogits.of(logits, 2, 1)
    store.remember_full(compact, logits)
    assert np.array_equal(store.full_logits(compact), logits)
    index = store._full_index_path(compact)
    index.write_text(json.dumps(store.put_blob(logits + 1)))
    assert store.full_logits(compact) is None
    assert any("is corrupt (full vectors" in m and "do not hash to the golden's rows" in m for m in said)


def test_a_tensor_index_pointing_at_another_tensor_is_not_trusted(tmp_path: Path, said: list[str]) -> None:
    """A tensor index whose blob hashes to another digest gives None and says so."""
    store = _store(tmp_path)
    enc = np.ones((2, 2), np.float32)
    store.remember_arrays({"enc": enc})
    digest = store_module.array_sha256(enc)
    assert np.array_equal(store.full_arrays({"enc": digest})["enc"], enc)
    store._array_index_path(digest).write_text(json.dumps(store.put_blob(enc * 2)))
    assert store.full_arrays({"enc": digest}) is None
    assert any("tensor 'enc' does not hash to the golden's digest" in m for m in said)


def test_a_blob_of_another_shape_than_recorded_is_an_error(tmp_path: Path) -> None:
    """read_blob checks shape and dtype against the manifest's ref, beside the sha256."""
    store = _store(tmp_path)
    ref = store.put_blob(np.zeros((2, 3), np.float32))
    with pytest.raises(GoldenError, match=r"shape \(2, 3\) float32, manifest expects \(3, 2\) float32"):
        store.read_blob(ref | {"shape": [3, 2]}, tmp_path / "m.json")
    with pytest.raises(GoldenError, match=r"manifest expects \(2, 3\) float16"):
        store.read_blob(ref | {"dtype": "float16"}, tmp_path / "m.json")


def test_compacting_a_compact_golden_does_nothing(tmp_path: Path) -> None:
    """compact_existing on a format-2 golden returns None and leaves its manifest as it is."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(), PROVENANCE, {}, compact=(2, 1))
    before = golden.manifest_path.read_bytes()
    assert store.compact_existing("tiny", "plain", 2, 1) is None
    assert golden.manifest_path.read_bytes() == before


def test_compacting_keeps_the_generation_time_only_when_recorded(tmp_path: Path) -> None:
    """A full golden's generated_at survives compaction; without one, the compact golden has the
    write's own time."""
    store = _store(tmp_path)
    golden = store.write("tiny", "plain", _record(), PROVENANCE, {})
    _rewrite(golden.manifest_path, lambda m: m.update(generated_at="2001-01-01T00:00:00+00:00"))
    assert store.compact_existing("tiny", "plain", 2, 1)["rows"] == 3
    assert json.loads(golden.manifest_path.read_text())["generated_at"] == "2001-01-01T00:00:00+00:00"
    store.write("tiny", "other", _record(), PROVENANCE, {})
    path = store.manifest_path("tiny", "other")
    _rewrite(path, lambda m: m.pop("generated_at"))
    store.compact_existing("tiny", "other", 2, 1)
    manifest = json.loads(path.read_text())
    assert manifest["format"] == 2 and manifest["generated_at"].startswith("20")
    assert manifest["generated_at"] != "2001-01-01T00:00:00+00:00"
