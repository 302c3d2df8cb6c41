"""The golden store: atomic writes, hash checks on read, staleness, and xdist-safe generation."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from harness.errors import GoldenError, StaleGoldenError
from harness.goldens.store import GoldenStatus
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import FakeOracle, fake_session

# Goldens that keep every full vector (format 1): what the blob tests below exercise.
FULL_PROFILE = VALID_PROFILE.format(name="tiny") + "golden:\n  full_steps: all\n"


def _manifests(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted((root / "goldens").rglob("*.json"))}


def test_absent_goldens_are_generated_once_then_reused(isolated: Path) -> None:
    write_profile(isolated)
    FakeOracle.counter = isolated / "runs.txt"
    session = fake_session(isolated)
    goldens = session.goldens(session.profile("tiny"))
    assert set(goldens) == {"plain", "chat"} and len(goldens["plain"].record.tokens) == 4
    again = fake_session(isolated).goldens(session.profile("tiny"))
    assert again["chat"].record.tokens == goldens["chat"].record.tokens
    assert FakeOracle.counter.read_text().count("\n") == 1  # the second session generated nothing
    FakeOracle.counter = None


def test_corrupted_blob_is_an_error_and_nothing_is_rewritten(isolated: Path) -> None:
    write_profile(isolated, text=FULL_PROFILE)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    blob = session.store("mlx-lm").blob_path(golden.manifest["blobs"]["logits"]["sha256"])
    blob.write_bytes(blob.read_bytes()[:-4] + b"\x00\x00\x80\x3f")
    before = _manifests(isolated)
    with pytest.raises(GoldenError, match=r"corrupted golden blob .* sha256 .* expects"):
        fake_session(isolated).goldens(session.profile("tiny"))
    assert _manifests(isolated) == before


def test_stale_golden_is_reported_not_regenerated(isolated: Path) -> None:
    write_profile(isolated)
    fake_session(isolated, weights_hash="w0").goldens(fake_session(isolated).profile("tiny"))
    before = _manifests(isolated)
    session = fake_session(isolated, weights_hash="w1")  # the artifact's weights changed
    profile = session.profile("tiny")
    assert (
        session.store("mlx-lm").status("tiny", "plain", session.provenance(profile, profile.scenarios[0]))
        is GoldenStatus.STALE
    )
    with pytest.raises(
        StaleGoldenError,
        match=r"artifact\.weights\.model\.safetensors: golden has 'w0', now 'w1'.*make goldens MODEL=tiny",
    ):
        session.goldens(profile)
    assert _manifests(isolated) == before
    regenerated = session.goldens(profile, regenerate=True)  # what `make goldens` does
    assert regenerated["plain"].manifest["provenance"]["artifact"]["weights"]["model.safetensors"] == "w1"


def test_tracked_manifest_without_blobs_is_reproduced_and_checked(isolated: Path) -> None:
    write_profile(isolated, text=FULL_PROFILE)
    session = fake_session(isolated)
    golden = session.goldens(session.profile("tiny"))["plain"]
    blob = session.store("mlx-lm").blob_path(golden.manifest["blobs"]["logits"]["sha256"])
    blob.unlink()  # a fresh clone: manifest tracked in git, blobs not in this cache
    assert fake_session(isolated).goldens(session.profile("tiny"))["plain"].record.tokens == golden.record.tokens
    assert blob.exists()
    # a manifest whose recorded blob the oracle no longer reproduces is an error, kept as is
    manifest_path = golden.manifest_path
    text = manifest_path.read_text().replace(golden.manifest["blobs"]["logits"]["sha256"], "0" * 64)
    manifest_path.write_text(text)
    with pytest.raises(GoldenError, match="not reproducible"):
        fake_session(isolated).goldens(session.profile("tiny"))
    assert manifest_path.read_text() == text


def _generate_in_process(root: str, counter: str) -> list[int]:
    import os

    for name, sub in (("PROFILES", "profiles"), ("GOLDENS", "goldens"), ("CACHE", "cache")):
        os.environ[f"MLX_PARITY_{name}"] = str(Path(root) / sub)
    os.environ["MLX_PARITY_QUIET"] = "1"
    FakeOracle.counter, FakeOracle.delay = Path(counter), 1.0
    session = fake_session(Path(root))
    return session.goldens(session.profile("tiny"))["chat"].record.tokens


def test_parallel_workers_generate_each_golden_once(isolated: Path) -> None:
    """Two processes (as two xdist workers) race for the same absent goldens."""
    write_profile(isolated)
    counter = isolated / "runs.txt"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.starmap(_generate_in_process, [(str(isolated), str(counter))] * 2)
    assert results[0] == results[1]
    assert counter.read_text().count("\n") == 1


def test_a_scenario_whose_store_cannot_be_had_fails_alone(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch oracle's key needs its venv; when that cannot be built only its scenarios fail,
    the profile's other goldens are still had."""
    from harness.errors import OracleError
    from harness.goldens.lifecycle import GoldenLifecycle

    write_profile(isolated)
    session = fake_session(isolated)
    profile = session.profile("tiny")
    real_store, calls = GoldenLifecycle.store, []

    def store(self, oracle):
        calls.append(oracle)
        if len(calls) == 1:  # the first scenario in scope: plain
            raise OracleError("oracle venv openai-whisper: cannot be built here")
        return real_store(self, oracle)

    monkeypatch.setattr(GoldenLifecycle, "store", store)
    goldens = session.goldens(profile)
    assert set(goldens) == {"chat"}
    with pytest.raises(OracleError, match="cannot be built here"):
        session.golden(profile, profile.scenario("plain"))
    assert session.golden(profile, profile.scenario("chat")).record.tokens
