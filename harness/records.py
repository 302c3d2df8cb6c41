"""The one record both sides produce for a scenario, and the file format the oracle writes.

Row i of `logits` is the full logit vector that predicts token i: row 0 comes from the
prefill (the prompt's last position), row i > 0 from the decode step fed token i-1.

A scenario may run several segments of steps: the turns of a conversation kept in one
cache, the rows of a batch, the decode calls of a speech transcription (each window and
temperature attempt, batch members interleaved step-major). Their rows are stacked into
`logits` in order; `extra` says where each segment starts (`row_offset`), how many steps
it has and how many members its batch holds. Named `arrays` carry the other tensors a
scenario is judged on (a log-mel spectrogram, encoder outputs).

The files and fields are a versioned interface, docs/records.md; harness/records_schema.py
checks a record's meta against it before a record is built from it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import RecordError
from harness.records_fields import check_listed
from harness.records_schema import EXTRA_KEYS, SEGMENT_KEYS, check_meta, check_result


@dataclass(frozen=True)
class Segment:
    label: str
    row_offset: int
    n_steps: int
    batch: int = 1


def row_sha256(row: np.ndarray) -> str:
    """sha256 of one logits vector's raw bits (float32, C order): what an L1 gate compares."""
    return hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).hexdigest()


def array_sha256(array: np.ndarray) -> str:
    """sha256 of a tensor's raw bits (C order), shape and dtype included in the digest."""
    a = np.ascontiguousarray(array)
    header = f"{a.dtype.str}{list(a.shape)}".encode()
    return hashlib.sha256(header + a.tobytes()).hexdigest()


@dataclass
class CompactLogits:
    """A golden's logits without the full vectors: per row the sha256 of its raw bits, its
    top-k (ids, values) and logsumexp; the first `head` rows are kept in full when available.

    L1 gates decide by the hashes; the full vectors (for diagnostics: ULP distance, flip
    margins) are regenerated on demand and checked against the hashes.
    """

    vocab: int
    row_sha256: list[str]
    topk_ids: list[list[int]]
    topk_values: list[list[float]]
    logsumexp: list[float]
    full_steps: int  # how many leading rows the golden keeps in full (a blob in the cache)

    @classmethod
    def of(cls, logits: np.ndarray, top_k: int, full_steps: int) -> CompactLogits:
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        k = min(top_k, logits.shape[1])
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :k] if len(logits) else np.zeros((0, k), np.int64)
        values = np.take_along_axis(logits, ids, axis=1)
        wide = logits.astype(np.float64)
        peak = wide.max(axis=1, keepdims=True) if len(logits) else np.zeros((0, 1))
        with np.errstate(invalid="ignore", over="ignore"):
            lse = (peak[:, 0] + np.log(np.exp(wide - peak).sum(axis=1))) if len(logits) else np.zeros(0)
        return cls(
            vocab=int(logits.shape[1]),
            row_sha256=[row_sha256(r) for r in logits],
            topk_ids=ids.astype(int).tolist(),
            topk_values=[[float(v) for v in row] for row in values],  # f32 values, exact as Python floats
            logsumexp=[float(v) for v in lse],
            full_steps=min(full_steps, len(logits)),
        )

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> CompactLogits:
        try:
            out = cls(
                vocab=int(data["vocab"]),
                row_sha256=[str(h) for h in data["row_sha256"]],
                topk_ids=[[int(i) for i in row] for row in data["topk_ids"]],
                topk_values=[[float(v) for v in row] for row in data["topk_values"]],
                logsumexp=[float(v) for v in data["logsumexp"]],
                full_steps=int(data["full_steps"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise RecordError(f"{where}: malformed compact logits ({type(e).__name__}: {e})") from None
        n = len(out.row_sha256)
        if not (len(out.topk_ids) == len(out.topk_values) == len(out.logsumexp) == n):
            raise RecordError(f"{where}: compact logits: row_sha256, topk and logsumexp lengths differ")
        if any(len(h) != 64 for h in out.row_sha256):
            raise RecordError(f"{where}: compact logits: row_sha256 entries must be 64 hex digits")
        return out

    def mismatches(self, actual: np.ndarray, rows: Sequence[int], hashes: Sequence[str] | None = None) -> list[int]:
        """The rows among `rows` whose raw bits do not hash to the golden's (`hashes`: the
        actual rows' digests when already computed)."""
        if hashes is None:
            return [r for r in rows if r >= len(actual) or row_sha256(actual[r]) != self.row_sha256[r]]
        return [r for r in rows if r >= len(hashes) or hashes[r] != self.row_sha256[r]]


@dataclass
class ScenarioRecord:
    scenario_id: str
    rendered_prompt: str | None  # None for plain prompts (no template)
    prompt_ids: list[int]
    tokens: list[int]  # the token chosen after each logits row (greedy)
    logits: np.ndarray  # (len(tokens), vocab) float32
    eos_ids: list[int]
    mode: str = "free"  # "free" | "teacher_forced"
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # other judged tensors, by name
    extra: dict[str, Any] = field(default_factory=dict)  # segments, transcript, drafting stats (JSON)
    # A compact golden: `logits` holds only its leading full rows (or none), these the rest;
    # `array_digests` the sha256 (array_sha256) of named tensors whose blobs are not at hand.
    compact: CompactLogits | None = None
    array_digests: dict[str, str] = field(default_factory=dict)
    _row_hashes: tuple[int, list[str]] | None = field(default=None, repr=False, compare=False)

    @property
    def vocab(self) -> int:
        """The width of a logits row (a compact golden's from its manifest)."""
        return self.compact.vocab if self.compact is not None else int(self.logits.shape[-1])

    def row_hashes(self) -> list[str]:
        """sha256 of every logits row's raw bits, computed once per logits array (every
        logits gate against a compact golden reads them)."""
        if self._row_hashes is None or self._row_hashes[0] != id(self.logits):
            self._row_hashes = (id(self.logits), [row_sha256(r) for r in self.logits])
        return self._row_hashes[1]

    @property
    def is_compact(self) -> bool:
        return self.compact is not None

    def segment_eos_steps(self) -> list[int | None]:
        """Per segment (turn, batch row), the first step whose token is an EOS id."""
        eos = set(self.eos_ids)
        out = []
        for seg in self.segments():
            toks = self.tokens[seg.row_offset : seg.row_offset + seg.n_steps * seg.batch]
            out.append(next((i for i, t in enumerate(toks) if t in eos), None))
        return out

    def segments(self) -> list[Segment]:
        """The runs of steps stacked in `logits`: one for a plain scenario."""
        for key, label in SEGMENT_KEYS.items():
            if key in self.extra:
                return [
                    Segment(
                        label=f"{label} {i}",
                        row_offset=int(seg["row_offset"]),
                        n_steps=int(seg["n_steps"]),
                        batch=int(seg.get("batch", 1)),
                    )
                    for i, seg in enumerate(self.extra[key])
                ]
        return [Segment(label="", row_offset=0, n_steps=len(self.tokens), batch=1)]

    def prefill_rows(self) -> list[int]:
        """Rows predicted from a prompt (step 0 of each segment, every batch member)."""
        return [s.row_offset + m for s in self.segments() for m in range(s.batch)]

    def decode_rows(self) -> list[int]:
        prefill = set(self.prefill_rows())
        return [r for r in range(len(self.tokens)) if r not in prefill]

    def describe_row(self, row: int) -> str:
        """Where a logits row sits: `step 5`, or `turn 1 step 2`, `decode call 3 step 4 member 1`."""
        for seg in self.segments():
            if seg.row_offset <= row < seg.row_offset + seg.n_steps * seg.batch:
                step, member = divmod(row - seg.row_offset, seg.batch)
                where = f"{seg.label} step {step}".strip()
                return where + (f" member {member}" if seg.batch > 1 else "")
        return f"row {row}"

    @property
    def eos_step(self) -> int | None:
        """First step whose chosen token is an EOS id: where generation stops."""
        eos = set(self.eos_ids)
        return next((i for i, t in enumerate(self.tokens) if t in eos), None)

    def validate(self, where: str, n_tokens: int | None = None) -> None:
        """Wrong tensors are an error naming what was expected, never a silent mis-compare."""
        if self.logits.ndim != 2:
            raise RecordError(f"{where}: logits: expected 2-D (steps, vocab), got shape {self.logits.shape}")
        if self.logits.dtype != np.float32:
            raise RecordError(f"{where}: logits: expected float32, got {self.logits.dtype}")
        if self.compact is not None:
            if len(self.compact.row_sha256) != len(self.tokens) or self.logits.shape[0] > len(self.tokens):
                raise RecordError(
                    f"{where}: compact logits describe {len(self.compact.row_sha256)} rows, "
                    f"{len(self.tokens)} tokens were recorded"
                )
        elif self.logits.shape[0] != len(self.tokens):
            raise RecordError(
                f"{where}: logits has {self.logits.shape[0]} rows but {len(self.tokens)} tokens were recorded"
            )
        if n_tokens is not None and len(self.tokens) != n_tokens:
            raise RecordError(f"{where}: expected {n_tokens} steps, got {len(self.tokens)}")
        if self.compact is None and self.logits.size:  # full rows: their width is the vocabulary
            vocab = self.logits.shape[1]
            past = next((i for i, t in enumerate(self.tokens) if t >= vocab), None)
            if past is not None:
                raise RecordError(
                    f"{where}: tokens[{past}]: expected a token id below the vocabulary's {vocab} (the logits' "
                    f"width), got {self.tokens[past]}"
                )
        for name, array in self.arrays.items():
            if array.dtype != np.float32:
                raise RecordError(f"{where}: {name}: expected float32, got {array.dtype}")
        rows = sum(s.n_steps * s.batch for s in self.segments())
        if rows != len(self.tokens):
            raise RecordError(f"{where}: segments cover {rows} rows, the record has {len(self.tokens)}")

    def meta(self) -> dict[str, Any]:
        meta = {
            "scenario_id": self.scenario_id,
            "rendered_prompt": self.rendered_prompt,
            "prompt_ids": self.prompt_ids,
            "tokens": self.tokens,
            "eos_ids": self.eos_ids,
            "mode": self.mode,
        }
        if self.arrays:
            meta["arrays"] = sorted(self.arrays)
        return meta | self.extra

    @classmethod
    def from_meta(
        cls, meta: dict[str, Any], logits: np.ndarray, where: str, arrays: dict[str, np.ndarray] | None = None
    ) -> ScenarioRecord:
        """A record from its meta (docs/records.md), checked first: a wrong field is an error
        naming it, never a silent coercion."""
        check_meta(meta, where)
        try:
            return cls(
                scenario_id=str(meta["scenario_id"]),
                rendered_prompt=meta["rendered_prompt"],
                prompt_ids=[int(t) for t in meta["prompt_ids"]],
                tokens=[int(t) for t in meta["tokens"]],
                logits=logits,
                eos_ids=sorted(int(t) for t in meta["eos_ids"]),
                mode=str(meta.get("mode", "free")),
                arrays=dict(arrays or {}),
                extra={k: meta[k] for k in EXTRA_KEYS if k in meta},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise RecordError(f"{where}: malformed record ({type(e).__name__}: {e})") from None


def read_generator_output(
    out_dir: Path, oracle: bool = True
) -> tuple[dict[str, Any], dict[str, ScenarioRecord], dict[str, str]]:
    """Read what an oracle generator wrote: `result.json` plus one `<id>.logits.npy` a scenario.
    An oracle's record may carry only the record's fields and those listed as deliberately
    ignored (harness/records_fields.py); `oracle=False` (an implementation's process speaking
    the same files) lets it carry notes of its own.

    Returns (result, records by scenario id, the oracle's own error by scenario id).
    """
    result_path = out_dir / "result.json"
    try:
        result = json.loads(result_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecordError(f"{result_path}: unreadable generator result: {e}") from None
    check_result(result, str(result_path))
    records, errors = {}, {}
    for sid, meta in result["scenarios"].items():
        if "error" in meta:
            errors[sid] = str(meta["error"])
            continue
        where = f"{'oracle' if oracle else 'implementation'} output {sid}"  # whose record is wrong
        if oracle:
            check_listed(meta, where)
        logits = _load_array(out_dir / f"{sid}.logits.npy")
        arrays = {name: _load_array(out_dir / f"{sid}.{name}.npy") for name in meta.get("arrays", [])}
        record = ScenarioRecord.from_meta(meta | {"scenario_id": sid}, logits, where, arrays)
        record.validate(where)
        records[sid] = record
    return result, records, errors


def _load_array(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise RecordError(f"{path}: unreadable array: {e}") from None
