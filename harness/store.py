"""The golden store: it only stores, hashes and checks provenance.

Layout (docs/goldens.md):
- `goldens/<profile>/<device key>/<scenario>.json` — a small tracked manifest: provenance,
  the token-level record, and the sha256 of each blob.
- `<cache>/blobs/<sha[:2]>/<sha>.npy` — content-addressed arrays (full logit vectors), out
  of git. A fresh clone has manifests without blobs: the oracle regenerates them and the
  harness checks that they hash to what the manifest recorded.

Blobs are written before the manifest and every write is an atomic rename, so a reader
(another xdist worker) sees a complete golden or none. Every read checks blob hashes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from harness import GOLDEN_FORMAT
from harness.errors import GoldenError, StaleGoldenError
from harness.fileio import atomic_write_bytes, atomic_write_json
from harness.records import ScenarioRecord


class GoldenStatus(Enum):
    FRESH = "fresh"
    ABSENT = "absent"
    STALE = "stale"
    BLOBS_MISSING = "blobs-missing"  # manifest tracked in git, blobs not yet in this cache


@dataclass
class Golden:
    manifest_path: Path
    manifest: dict[str, Any]
    record: ScenarioRecord


def provenance_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Flattened key paths whose values differ, each with both values."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += provenance_differences(a, b, path + ".")
        elif a != b:
            diffs.append(f"{path}: golden has {a!r}, now {b!r}")
    return diffs


class GoldenStore:
    def __init__(self, goldens_root: Path, blob_root: Path, device_key: str):
        self.goldens_root = goldens_root
        self.blob_root = blob_root
        self.device_key = device_key

    def manifest_path(self, profile: str, scenario_id: str) -> Path:
        return self.goldens_root / profile / self.device_key / f"{scenario_id}.json"

    def blob_path(self, sha256: str) -> Path:
        return self.blob_root / sha256[:2] / f"{sha256}.npy"

    def lock_path(self, profile: str) -> Path:
        return self.blob_root.parent / "locks" / f"goldens-{profile}-{self.device_key}.lock"

    # -- reading -------------------------------------------------------------------------

    def read_manifest(self, profile: str, scenario_id: str) -> dict[str, Any] | None:
        path = self.manifest_path(profile, scenario_id)
        if not path.exists():
            return None
        try:
            manifest = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise GoldenError(f"corrupted golden manifest {path}: {e}") from None
        if manifest.get("format") != GOLDEN_FORMAT:
            raise StaleGoldenError(
                f"stale golden {path}: format {manifest.get('format')!r}, the harness reads format "
                f"{GOLDEN_FORMAT}; regenerate with `make goldens MODEL={profile}`"
            )
        return manifest

    def status(self, profile: str, scenario_id: str, provenance: dict[str, Any]) -> GoldenStatus:
        manifest = self.read_manifest(profile, scenario_id)
        if manifest is None:
            return GoldenStatus.ABSENT
        if provenance_differences(manifest.get("provenance", {}), provenance):
            return GoldenStatus.STALE
        blobs = manifest.get("blobs", {})
        if not blobs or not all(self.blob_path(b["sha256"]).exists() for b in blobs.values()):
            return GoldenStatus.BLOBS_MISSING
        return GoldenStatus.FRESH

    def stale_error(self, profile: str, scenario_id: str, provenance: dict[str, Any]) -> StaleGoldenError:
        manifest = self.read_manifest(profile, scenario_id) or {}
        diffs = provenance_differences(manifest.get("provenance", {}), provenance)
        return StaleGoldenError(
            f"stale golden {self.manifest_path(profile, scenario_id)}: its provenance no longer "
            f"matches ({'; '.join(diffs[:6])}); regenerate explicitly with `make goldens MODEL={profile}`"
        )

    def load(self, profile: str, scenario_id: str) -> Golden:
        """Load a golden, checking every blob's sha256 (a corrupted blob is an error, not a pass)."""
        path = self.manifest_path(profile, scenario_id)
        manifest = self.read_manifest(profile, scenario_id)
        if manifest is None:
            raise GoldenError(f"missing golden {path}")
        blobs = manifest.get("blobs", {})
        if "logits" not in blobs:
            raise GoldenError(f"corrupted golden manifest {path}: no 'logits' blob")
        logits = self._read_blob(blobs["logits"], path)
        names = manifest["record"].get("arrays", [])
        missing = [n for n in names if n not in blobs]
        if missing:
            raise GoldenError(f"corrupted golden manifest {path}: record names arrays {missing} without blobs")
        arrays = {name: self._read_blob(blobs[name], path) for name in names}
        record = ScenarioRecord.from_meta(manifest["record"], logits, str(path), arrays)
        record.validate(str(path))
        return Golden(manifest_path=path, manifest=manifest, record=record)

    def _read_blob(self, ref: dict[str, Any], manifest_path: Path) -> np.ndarray:
        blob = self.blob_path(ref["sha256"])
        try:
            data = blob.read_bytes()
        except OSError:
            raise GoldenError(f"golden {manifest_path}: blob {blob} is missing") from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != ref["sha256"]:
            raise GoldenError(
                f"corrupted golden blob {blob}: sha256 {actual}, manifest {manifest_path} expects {ref['sha256']}"
            )
        array = np.load(io.BytesIO(data), allow_pickle=False)
        if list(array.shape) != list(ref["shape"]) or str(array.dtype) != ref["dtype"]:
            raise GoldenError(
                f"golden blob {blob}: shape {array.shape} {array.dtype}, manifest expects "
                f"{tuple(ref['shape'])} {ref['dtype']}"
            )
        return array

    # -- writing -------------------------------------------------------------------------

    def put_blob(self, array: np.ndarray) -> dict[str, Any]:
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        data = buffer.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha)
        if not path.exists():
            atomic_write_bytes(path, data)
        return {"sha256": sha, "shape": list(array.shape), "dtype": str(array.dtype), "bytes": len(data)}

    def write(
        self,
        profile: str,
        scenario_id: str,
        record: ScenarioRecord,
        provenance: dict[str, Any],
        extra: dict[str, Any],
        expect_blobs: dict[str, Any] | None = None,
    ) -> Golden:
        """Store a generated golden: blobs first, then the manifest, atomically.

        With `expect_blobs` (a tracked manifest whose blobs this cache lacks), the new blobs
        must hash to the recorded ones: the golden is reproduced, or it is an error and the
        tracked manifest stays as it is.
        """
        blobs = {"logits": self.put_blob(record.logits)} | {
            name: self.put_blob(array) for name, array in sorted(record.arrays.items())
        }
        path = self.manifest_path(profile, scenario_id)
        if expect_blobs is not None:
            for name, ref in expect_blobs.items():
                got = blobs.get(name, {}).get("sha256")
                if got != ref["sha256"]:
                    raise GoldenError(
                        f"golden {path} is not reproducible on this machine: blob {name!r} was "
                        f"{ref['sha256']} when recorded, the oracle now gives {got} with the same "
                        "provenance (same device key, pins, artifact and scenario)"
                    )
            return self.load(profile, scenario_id)
        manifest = {
            "format": GOLDEN_FORMAT,
            "profile": profile,
            "scenario": scenario_id,
            "device_key": self.device_key,
            "provenance": provenance,
            "record": record.meta(),
            "blobs": blobs,
            "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        } | extra
        atomic_write_json(path, manifest)
        return self.load(profile, scenario_id)
