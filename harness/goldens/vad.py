"""VAD goldens: per fixture, a tracked manifest (provenance, segments, the probabilities blob's
sha256) under the silero-vad oracle's golden key, and the probabilities as a content-addressed
blob. Stale is an error as for every golden; a missing blob is regenerated and must reproduce
its recorded sha256 (docs/vad.md).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.artifacts.files import sha256_file
from harness.errors import (
    GoldenError,
    HarnessError,
    OracleError,
    StaleGoldenError,
)
from harness.fileio import atomic_write_json
from harness.goldens.store import GoldenStore, provenance_differences
from harness.oracle.sources import common_sources
from harness.oracle.venvs import OracleEnv, ensure_oracle_env, oracle_pins_hash
from harness.paths import FIXTURES_DIR, cache_root, goldens_dir, shown
from harness.profile.vad import VAD_TIER, VadProfile, available_vad_profiles, load_vad_profile
from harness.provenance import device_facts, golden_key
from harness.runners.vad import run_oracle


@dataclass
class OracleResult:
    fixture: str
    probs: np.ndarray  # float32, one per chunk
    segments: dict[str, list[dict[str, int]]]
    samples_sha256: str
    seconds: dict[str, list[float]]
    manifest_path: Path
    regenerated: bool = False


def _store(profile: VadProfile) -> GoldenStore:
    """The golden store under the oracle's golden key (harness/provenance.py, golden_key)."""
    return GoldenStore(goldens_dir(), cache_root() / "blobs", golden_key(profile.oracle).name)


def manifest_path(profile: VadProfile, fixture: str) -> Path:
    return _store(profile).manifest_path(profile.name, Path(fixture).stem)


def oracle_provenance(profile: VadProfile, env: OracleEnv, versions: dict[str, Any], fixture: str) -> dict[str, Any]:
    return {
        "package": f"{profile.artifact.package}=={profile.artifact.version}",
        "installed": versions,
        "wheel_sha256": profile.artifact.wheel_sha256,
        "model_sha256": profile.artifact.sha256,
        "generator_sha256": sha256_file(env.generator),
        "common_sha256": {name: sha256_file(path) for name, path in common_sources(env.name).items()},
        "pins_hash": env.pins_hash,
        "device": golden_key(profile.oracle).as_dict(),
        "fixture": fixture,
        "fixture_sha256": sha256_file(FIXTURES_DIR / fixture),
        "timestamp_options": profile.timestamp_options,
    }


def _read_probabilities(profile: VadProfile, ref: dict[str, Any], path: Path) -> np.ndarray:
    array = _store(profile).read_blob(ref, path)
    if array.dtype != np.float32 or array.ndim != 1:
        raise GoldenError(f"golden {path}: {array.dtype} {array.shape}, expected 1-D float32 probabilities")
    return array


def ensure_goldens(profile: VadProfile, fixtures: list[str], update: bool = False) -> dict[str, OracleResult]:
    """Each fixture's oracle output: from its fresh golden, or generated now by the package."""
    from harness.oracle.torch_key import check_prediction

    env = ensure_oracle_env(profile.oracle)
    check_prediction(profile.oracle, env)  # the key was named before the venv existed
    versions = env.versions("silero-vad", "torch", "numpy")
    if versions.get("silero-vad") != profile.artifact.version:
        raise OracleError(
            f"oracle venv {env.root} has silero-vad {versions.get('silero-vad')}, the profile "
            f"{profile.source_file} pins {profile.artifact.version}"
        )
    results: dict[str, OracleResult] = {}
    todo: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for fixture in fixtures:
        path = manifest_path(profile, fixture)
        provenance = oracle_provenance(profile, env, versions, fixture)
        if update:  # an unreadable manifest is about to be rewritten: it is not read
            todo[fixture] = (provenance, None)
            continue
        try:
            manifest = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError) as e:
            raise GoldenError(f"corrupted golden manifest {path}: {e}; mend it with `make vad ARGS=--update`") from None
        if manifest is None:
            todo[fixture] = (provenance, None)
            continue
        diffs = provenance_differences(manifest.get("provenance", {}), provenance)
        if diffs:  # as every other golden: stale is an error, regenerated only when asked
            raise StaleGoldenError(
                f"stale golden {path}: its provenance no longer matches ({'; '.join(diffs[:6])}); "
                "regenerate explicitly with `make goldens MODEL=silero-vad` (or `make vad ARGS=--update`)"
            )
        elif not _store(profile).blob_path(manifest["blobs"]["probs"]["sha256"]).exists():
            todo[fixture] = (provenance, manifest["blobs"]["probs"])  # must reproduce the tracked blob
        else:
            results[fixture] = _result_from_manifest(profile, fixture, manifest, path)
    if todo:
        results |= _generate(profile, env, todo)
    return {f: results[f] for f in fixtures}


def _recorded_on(path: Path) -> Any:
    try:
        return json.loads(path.read_text()).get("recorded_on", "<not recorded>")
    except (OSError, ValueError):
        return "<unreadable>"


def _result_from_manifest(
    profile: VadProfile, fixture: str, manifest: dict[str, Any], path: Path, regenerated: bool = False
):
    return OracleResult(
        fixture=fixture,
        probs=_read_probabilities(profile, manifest["blobs"]["probs"], path),
        segments=manifest["segments"],
        samples_sha256=manifest["samples_sha256"],
        seconds=manifest["seconds"],
        manifest_path=path,
        regenerated=regenerated,
    )


def _generate(
    profile: VadProfile, env: OracleEnv, todo: dict[str, tuple[dict, dict | None]]
) -> dict[str, OracleResult]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="silero-vad-oracle-") as tmp:
        run_oracle(env.name, Path(tmp), [FIXTURES_DIR / f for f in todo], profile.timestamp_options)
        for fixture, (provenance, expect_blob) in todo.items():
            stem = Path(fixture).stem
            record = json.loads((Path(tmp) / f"{stem}.json").read_text())
            probs = np.load(Path(tmp) / f"{stem}.probs.npy", allow_pickle=False)
            blob = _store(profile).put_blob(probs)
            path = manifest_path(profile, fixture)
            if expect_blob is not None:
                if blob["sha256"] != expect_blob["sha256"]:
                    key = golden_key(profile.oracle)
                    raise GoldenError(
                        f"golden {path} is not reproducible here: probabilities blob {expect_blob['sha256']} "
                        f"when recorded, the oracle now gives {blob['sha256']} with the same provenance and "
                        f"golden key {key.name} ({key.describe()}); recorded on "
                        f"{_recorded_on(path)}, this machine is {device_facts().recorded_on()}. If this "
                        "machine's bits should stand, regenerate with `make vad ARGS=--update`"
                    )
                manifest = json.loads(path.read_text())
            else:
                manifest = {
                    "profile": profile.name,
                    "fixture": fixture,
                    "provenance": provenance,
                    "samples_sha256": record["samples_sha256"],
                    "samples": record["samples"],
                    "chunks": record["chunks"],
                    "segments": record["segments"],
                    "seconds": record["seconds"],
                    "environment": record["environment"],
                    "recorded_on": device_facts().recorded_on(),
                    "blobs": {"probs": blob},
                }
                atomic_write_json(path, manifest)
            results[fixture] = _result_from_manifest(profile, fixture, manifest, path, regenerated=True)
    return results


def vad_model_provenance(name: str) -> dict[str, Any]:
    """What a report says about a VAD model's run (tracked manifests only, no oracle run)."""
    try:
        profile = load_vad_profile(available_vad_profiles()[name])
        store = _store(profile)
    except (HarnessError, KeyError) as e:
        return {"error": str(e)}
    goldens = {}
    for fixture in profile.fixtures:
        path = store.manifest_path(profile.name, Path(fixture).stem)
        try:
            manifest = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError) as e:
            goldens[fixture] = {"manifest": str(path), "error": str(e)}
            continue
        goldens[fixture] = {
            "manifest": shown(path),
            "tier": VAD_TIER,
            "oracle": profile.oracle,
            "blobs": {k: v["sha256"] for k, v in manifest.get("blobs", {}).items()},
        }
    artifact = profile.artifact
    return {
        "kind": "vad",
        "tier": VAD_TIER,
        "oracle": profile.oracle,
        "oracle_pins_hash": oracle_pins_hash(profile.oracle),
        "oracles": {profile.oracle: oracle_pins_hash(profile.oracle)},
        "artifact": {
            "package": f"{artifact.package}=={artifact.version}",
            "wheel_sha256": artifact.wheel_sha256,
            "file": artifact.file,
            "sha256": artifact.sha256,
        },
        "ran_twin": False,  # the package's own weights
        "oracle_defects": [],
        "goldens": goldens,
    }
