"""The quality cache: `.cache/quality/results/<profile>-<pair>-<key hash>/`, keyed like the goldens
(both sides' artifact hashes, the corpus sha256 and window settings, the oracle's pins hash with
its quality script and the oracles/common modules it loads, the device's golden key).

An entry holds key.json, result.json (the oracle's facts and the sha256 of every array) and the
per-token arrays (.npy), made in a folder beside it and renamed into place whole; the in-tree
cross-check's outcome sits beside them as crosscheck-<in-tree source hash>.json (the in-tree code
is not part of what the oracle computed, so a changed runtime re-runs only the cross-check). A
corrupt entry (unreadable JSON, a missing array, an array whose sha256 is not the recorded one)
is reported and computed again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.artifacts.files import building_dir, sha256_file
from harness.fileio import atomic_write_json
from harness.implementations import LLM, sources_of
from harness.paths import REPO_ROOT, cache_root
from harness.quality.intree import CrossCheck
from harness.quality.records import Measurement, MeasurementError, TokenArrays

QUALITY_FORMAT = 1


def results_dir() -> Path:
    return cache_root() / "quality" / "results"


def key_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def entry_dir(profile: str, pair: str, key: dict[str, Any]) -> Path:
    return results_dir() / f"{profile}-{pair}-{key_hash(key)[:16]}"


def intree_source_hash() -> str:
    """The in-tree code a cross-check ran: the LLM implementation's package and the cross-check itself."""
    digest = hashlib.sha256()
    paths = sources_of(LLM) + [REPO_ROOT / "harness/quality/intree.py"]
    for path in paths:
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + sha256_file(path).encode())
    return digest.hexdigest()


def load(entry: Path, key: dict[str, Any]) -> tuple[Measurement | None, str]:
    """(the cached measurement, "cached") or (None, why it is not usable: absent or what is corrupt)."""
    if not (entry / ".complete").exists():
        return None, "not cached"
    try:
        stored_key = json.loads((entry / "key.json").read_text())
        meta = json.loads((entry / "result.json").read_text())
        if stored_key != key:
            raise MeasurementError("key.json is not this measurement's key")
        recorded = meta["arrays_sha256"]
        arrays = TokenArrays.load(entry)
        actual = arrays.sha256()
        bad = [n for n in sorted(actual) if recorded.get(n) != actual[n]]
        if bad:
            raise MeasurementError(f"{', '.join(bad)}: sha256 is not the recorded one")
        return Measurement.from_meta(meta, arrays), "cached"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, MeasurementError) as e:
        return None, f"corrupt cache entry {entry.name} ({type(e).__name__}: {e})"


def save(entry: Path, key: dict[str, Any], measurement: Measurement) -> None:
    """The entry as one new folder renamed into place (a corrupt one it replaces is gone only then)."""
    with building_dir(entry, key_hash(key)) as tmp:
        sha = measurement.arrays.save(tmp)
        (tmp / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
        (tmp / "result.json").write_text(json.dumps(measurement.meta() | {"arrays_sha256": sha}, indent=1) + "\n")


def load_cross_check(entry: Path, source_hash: str) -> CrossCheck | None:
    path = entry / f"crosscheck-{source_hash[:16]}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("intree_source_sha256") != source_hash:
            return None
        return CrossCheck(str(data["status"]), str(data["detail"]), dict(data["forward_seconds"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent or unreadable: the cross-check runs again


def save_cross_check(entry: Path, source_hash: str, check: CrossCheck) -> None:
    atomic_write_json(
        entry / f"crosscheck-{source_hash[:16]}.json", check.as_dict() | {"intree_source_sha256": source_hash}
    )


def discard(entry: Path) -> None:
    shutil.rmtree(entry, ignore_errors=True)


# -- speech pairs: the Whisper layer's per-fixture results, cached whole ------------------------


@dataclass(frozen=True)
class CachedFixtureQuality:
    """A WhisperFixtureQuality read back from the cache (the same fields)."""

    fixture: str
    kl: np.ndarray
    top1_agree: np.ndarray
    control_text: str
    candidate_text: str
    word_errors: int
    reference_words: int
    cross_check: str


_FIXTURE_TEXT = ("fixture", "control_text", "candidate_text", "word_errors", "reference_words", "cross_check")


def save_fixtures(entry: Path, key: dict[str, Any], fixtures: list[Any]) -> None:
    with building_dir(entry, key_hash(key)) as tmp:
        arrays = {}
        for i, f in enumerate(fixtures):
            arrays[f"kl_{i}"] = np.asarray(f.kl, dtype=np.float64)
            arrays[f"top1_agree_{i}"] = np.asarray(f.top1_agree, dtype=bool)
        for name, a in arrays.items():
            np.save(tmp / f"{name}.npy", a, allow_pickle=False)
        sha = {name: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for name, a in arrays.items()}
        meta = {"fixtures": [{k: getattr(f, k) for k in _FIXTURE_TEXT} for f in fixtures], "arrays_sha256": sha}
        (tmp / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
        (tmp / "result.json").write_text(json.dumps(meta, indent=1) + "\n")


def load_fixtures(entry: Path, key: dict[str, Any]) -> tuple[list[CachedFixtureQuality] | None, str]:
    if not (entry / ".complete").exists():
        return None, "not cached"
    try:
        if json.loads((entry / "key.json").read_text()) != key:
            raise MeasurementError("key.json is not this measurement's key")
        meta = json.loads((entry / "result.json").read_text())
        out = []
        for i, f in enumerate(meta["fixtures"]):
            arrays = {}
            for name in (f"kl_{i}", f"top1_agree_{i}"):
                a = np.load(entry / f"{name}.npy", allow_pickle=False)
                if hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() != meta["arrays_sha256"][name]:
                    raise MeasurementError(f"{name}: sha256 is not the recorded one")
                arrays[name] = a
            out.append(CachedFixtureQuality(kl=arrays[f"kl_{i}"], top1_agree=arrays[f"top1_agree_{i}"], **f))
        return out, "cached"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, MeasurementError) as e:
        return None, f"corrupt cache entry {entry.name} ({type(e).__name__}: {e})"
