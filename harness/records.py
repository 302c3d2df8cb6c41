"""The one record both sides produce for a scenario, and the file format the oracle writes.

Row i of `logits` is the full logit vector that predicts token i: row 0 comes from the
prefill (the prompt's last position), row i > 0 from the decode step fed token i-1.

A scenario may run several segments of steps: the turns of a conversation kept in one
cache, the rows of a batch, the decode calls of a speech transcription (each window and
temperature attempt, batch members interleaved step-major). Their rows are stacked into
`logits` in order; `extra` says where each segment starts (`row_offset`), how many steps
it has and how many members its batch holds. Named `arrays` carry the other tensors a
scenario is judged on (a log-mel spectrogram, encoder outputs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import RecordError

# Keys of a record's `extra` whose list describes its segments, and how a row names one.
SEGMENT_KEYS = {"turns": "turn", "rows": "batch row", "decode_calls": "decode call"}
# Everything besides tokens and tensors that a generator reports and the gates judge.
EXTRA_KEYS = (*SEGMENT_KEYS, "transcript", "step_info")


@dataclass(frozen=True)
class Segment:
    label: str
    row_offset: int
    n_steps: int
    batch: int = 1


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
        if self.logits.shape[0] != len(self.tokens):
            raise RecordError(
                f"{where}: logits has {self.logits.shape[0]} rows but {len(self.tokens)} tokens were recorded"
            )
        if n_tokens is not None and len(self.tokens) != n_tokens:
            raise RecordError(f"{where}: expected {n_tokens} steps, got {len(self.tokens)}")
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


def read_generator_output(out_dir: Path) -> tuple[dict[str, Any], dict[str, ScenarioRecord], dict[str, str]]:
    """Read what an oracle generator wrote: `result.json` plus one `<id>.logits.npy` a scenario.

    Returns (result, records by scenario id, the oracle's own error by scenario id).
    """
    result_path = out_dir / "result.json"
    try:
        result = json.loads(result_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecordError(f"{result_path}: unreadable generator result: {e}") from None
    records, errors = {}, {}
    for sid, meta in result.get("scenarios", {}).items():
        if "error" in meta:
            errors[sid] = str(meta["error"])
            continue
        logits = _load_array(out_dir / f"{sid}.logits.npy")
        arrays = {name: _load_array(out_dir / f"{sid}.{name}.npy") for name in meta.get("arrays", [])}
        record = ScenarioRecord.from_meta(meta | {"scenario_id": sid}, logits, f"oracle output {sid}", arrays)
        record.validate(f"oracle output {sid}")
        records[sid] = record
    return result, records, errors


def _load_array(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise RecordError(f"{path}: unreadable array: {e}") from None
