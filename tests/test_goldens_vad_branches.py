"""VAD goldens (harness/goldens/vad.py) with a stand-in oracle in tmp_path: a venv of another
silero-vad is refused, an absent golden is generated and written, a tracked manifest whose blob
this cache lacks is reproduced and kept as it is, and probabilities that are not 1-D float32 are
a GoldenError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import GoldenError, OracleError
from harness.goldens import vad
from harness.profile.vad import load_vad_profile

FIXTURE = "fox.wav"
PROBS = np.array([0.125, 0.5, 0.875], np.float32)


class _Key:
    name = "fake-key"

    def describe(self) -> str:
        return "a fake golden key"

    def as_dict(self) -> dict:
        return {"key": self.name}


class _Facts:
    def recorded_on(self) -> dict:
        return {"processor": "fake"}


class _Env:
    """An oracle venv as ensure_goldens reads it, holding `silero` as its silero-vad."""

    def __init__(self, root: Path, silero: str):
        self.root, self.name, self.silero = root, "silero-vad", silero

    def versions(self, *names: str) -> dict:
        return {"silero-vad": self.silero, "torch": "0", "numpy": "0"}


@pytest.fixture
def profile():
    return load_vad_profile()


@pytest.fixture
def oracle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile) -> list[list[str]]:
    """The goldens and blobs in tmp_path, and a stand-in for the oracle venv and its run; the
    returned list collects the fixtures of each oracle run."""
    runs: list[list[str]] = []

    def run_oracle(name, out: Path, paths, options) -> None:
        runs.append([p.name for p in paths])
        for p in paths:
            np.save(out / f"{p.stem}.probs.npy", PROBS)
            record = {"samples_sha256": "s" * 64, "samples": 96, "chunks": 3, "segments": {"default": []}}
            (out / f"{p.stem}.json").write_text(json.dumps(record | {"seconds": {}, "environment": {}}))

    monkeypatch.setattr(vad, "goldens_dir", lambda: tmp_path / "goldens")
    monkeypatch.setattr(vad, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(vad, "golden_key", lambda oracle: _Key())
    monkeypatch.setattr(vad, "device_facts", lambda: _Facts())
    monkeypatch.setattr(vad, "ensure_oracle_env", lambda oracle: _Env(tmp_path, profile.artifact.version))
    monkeypatch.setattr("harness.oracle.torch_key.check_prediction", lambda oracle, env: None)
    monkeypatch.setattr(vad, "oracle_provenance", lambda profile, env, versions, fixture: {"fixture": fixture})
    monkeypatch.setattr(vad, "run_oracle", run_oracle)
    return runs


def test_an_oracle_venv_of_another_silero_vad_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile, oracle
) -> None:
    """The venv's silero-vad must be the profile's pin: another version is an OracleError naming both."""
    monkeypatch.setattr(vad, "ensure_oracle_env", lambda name: _Env(tmp_path, "0.0.1"))
    with pytest.raises(OracleError, match=rf"has silero-vad 0\.0\.1, the profile .* pins {profile.artifact.version}"):
        vad.ensure_goldens(profile, [FIXTURE])
    assert oracle == []


def test_an_absent_golden_is_generated_and_written(profile, oracle) -> None:
    """No manifest: the oracle runs once, its probabilities become a blob and a manifest is written."""
    result = vad.ensure_goldens(profile, [FIXTURE])[FIXTURE]
    assert oracle == [[FIXTURE]] and result.regenerated
    assert np.array_equal(result.probs, PROBS)
    manifest = json.loads(vad.manifest_path(profile, FIXTURE).read_text())
    assert manifest["provenance"] == {"fixture": FIXTURE} and manifest["recorded_on"] == {"processor": "fake"}
    assert vad._store(profile).blob_path(manifest["blobs"]["probs"]["sha256"]).exists()
    again = vad.ensure_goldens(profile, [FIXTURE])[FIXTURE]  # fresh now: read, not regenerated
    assert oracle == [[FIXTURE]] and not again.regenerated


def test_a_tracked_manifest_without_its_blob_is_reproduced_and_kept(profile, oracle) -> None:
    """A manifest whose blob this cache lacks: the oracle reproduces the recorded sha256, and the
    tracked manifest is read, never rewritten."""
    vad.ensure_goldens(profile, [FIXTURE])
    path = vad.manifest_path(profile, FIXTURE)
    manifest = json.loads(path.read_text())
    manifest["recorded_on"] = {"processor": "elsewhere"}  # a clone's manifest, from another machine
    path.write_text(json.dumps(manifest))
    before = path.read_bytes()
    vad._store(profile).blob_path(manifest["blobs"]["probs"]["sha256"]).unlink()
    result = vad.ensure_goldens(profile, [FIXTURE])[FIXTURE]
    assert oracle == [[FIXTURE], [FIXTURE]] and result.regenerated
    assert np.array_equal(result.probs, PROBS) and path.read_bytes() == before


def test_probabilities_that_are_not_1d_float32_are_an_error(profile, oracle) -> None:
    """A fresh golden whose (intact) blob holds float64 probabilities is refused by dtype and shape."""
    vad.ensure_goldens(profile, [FIXTURE])
    path = vad.manifest_path(profile, FIXTURE)
    manifest = json.loads(path.read_text())
    manifest["blobs"]["probs"] = vad._store(profile).put_blob(PROBS.astype(np.float64))
    path.write_text(json.dumps(manifest))
    with pytest.raises(GoldenError, match=r"float64 \(3,\), expected 1-D float32 probabilities"):
        vad.ensure_goldens(profile, [FIXTURE])
