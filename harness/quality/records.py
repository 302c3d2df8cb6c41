"""What a quality measurement produces, on either side: per-token arrays over the corpus windows
and the facts beside them (windows, logits digests, forward seconds)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

# (windows, positions) arrays, in this order: what the oracle writes and the in-tree side computes.
ARRAY_DTYPES = {
    "kl": np.float32,  # KL(control || candidate) per position
    "control_nll": np.float32,
    "candidate_nll": np.float32,
    "control_top1": np.int32,
    "candidate_top1": np.int32,
    "quantized": np.bool_,  # the candidate's model call read a quantized cache
    "targets": np.int32,
}


class MeasurementError(ValueError):
    """Arrays that are missing, mis-shaped or of another dtype (a corrupt cache entry, a bad oracle run)."""


@dataclass(frozen=True)
class TokenArrays:
    arrays: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        missing = sorted(set(ARRAY_DTYPES) - set(self.arrays))
        if missing:
            raise MeasurementError(f"per-token arrays missing: {missing}")
        shape = self.arrays["kl"].shape
        for name, dtype in ARRAY_DTYPES.items():
            a = self.arrays[name]
            if a.dtype != dtype or a.shape != shape or a.ndim != 2:
                raise MeasurementError(f"{name}: expected {np.dtype(dtype)} {shape}, got {a.dtype} {a.shape}")

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def n_windows(self) -> int:
        return int(self.arrays["kl"].shape[0])

    @property
    def n_positions(self) -> int:
        return int(self.arrays["kl"].size)

    def sha256(self) -> dict[str, str]:
        return {name: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for name, a in self.arrays.items()}

    def save(self, directory: Path) -> dict[str, str]:
        """One .npy per array into `directory`; returns their sha256 (of the raw bits)."""
        for name, a in self.arrays.items():
            np.save(directory / f"{name}.npy", a, allow_pickle=False)
        return self.sha256()

    @classmethod
    def load(cls, directory: Path) -> TokenArrays:
        arrays = {}
        for name in ARRAY_DTYPES:
            path = directory / f"{name}.npy"
            try:
                arrays[name] = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise MeasurementError(f"{path.name}: unreadable: {e}") from None
        return cls(arrays)


@dataclass(frozen=True)
class Measurement:
    """One side's run of a pair (the oracle's, or the in-tree cross-check's)."""

    arrays: TokenArrays
    window_starts: list[int]
    logits_sha256: list[dict[str, str]]  # per window: {"control": sha, "candidate": sha}
    corpus_ids_sha256: str
    n_corpus_tokens: int
    forward_seconds: dict[str, float]
    logits_dtype: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def meta(self) -> dict[str, Any]:
        """Every field but the arrays, in their order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "arrays"}

    @classmethod
    def from_dir(cls, directory: Path) -> Measurement:
        """An oracle's output folder (result.json + the arrays)."""
        try:
            meta = json.loads((directory / "result.json").read_text())
        except (OSError, ValueError) as e:
            raise MeasurementError(f"result.json: unreadable: {e}") from None
        return cls.from_meta(meta, TokenArrays.load(directory))

    @classmethod
    def from_meta(cls, meta: dict[str, Any], arrays: TokenArrays) -> Measurement:
        try:
            m = cls(
                arrays=arrays,
                window_starts=[int(s) for s in meta["window_starts"]],
                logits_sha256=list(meta["logits_sha256"]),
                corpus_ids_sha256=str(meta["corpus_ids_sha256"]),
                n_corpus_tokens=int(meta["n_corpus_tokens"]),
                forward_seconds={k: float(v) for k, v in meta["forward_seconds"].items()},
                logits_dtype=dict(meta.get("logits_dtype", {})),
                environment=dict(meta.get("environment", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MeasurementError(f"result.json: malformed ({type(e).__name__}: {e})") from None
        if len(m.window_starts) != arrays.n_windows or len(m.logits_sha256) != arrays.n_windows:
            raise MeasurementError(
                f"result.json: {len(m.window_starts)} windows listed, the arrays hold {arrays.n_windows}"
            )
        return m
