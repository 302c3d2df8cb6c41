"""The one record both sides produce for a scenario, and the file format the oracle writes.

Row i of `logits` is the full logit vector that predicts token i: row 0 comes from the
prefill (the prompt's last position), row i > 0 from the decode step fed token i-1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import RecordError


@dataclass
class ScenarioRecord:
    scenario_id: str
    rendered_prompt: str | None  # None for plain prompts (no template)
    prompt_ids: list[int]
    tokens: list[int]  # the token chosen after each logits row (greedy)
    logits: np.ndarray  # (len(tokens), vocab) float32
    eos_ids: list[int]
    mode: str = "free"  # "free" | "teacher_forced"

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

    def meta(self) -> dict[str, Any]:
        return {
            "scenario_id": self.scenario_id,
            "rendered_prompt": self.rendered_prompt,
            "prompt_ids": self.prompt_ids,
            "tokens": self.tokens,
            "eos_ids": self.eos_ids,
            "mode": self.mode,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any], logits: np.ndarray, where: str) -> ScenarioRecord:
        try:
            return cls(
                scenario_id=str(meta["scenario_id"]),
                rendered_prompt=meta["rendered_prompt"],
                prompt_ids=[int(t) for t in meta["prompt_ids"]],
                tokens=[int(t) for t in meta["tokens"]],
                logits=logits,
                eos_ids=sorted(int(t) for t in meta["eos_ids"]),
                mode=str(meta.get("mode", "free")),
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
        path = out_dir / f"{sid}.logits.npy"
        try:
            logits = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise RecordError(f"{path}: unreadable logits: {e}") from None
        record = ScenarioRecord.from_meta(meta | {"scenario_id": sid}, logits, f"oracle output {sid}")
        record.validate(f"oracle output {sid}")
        records[sid] = record
    return result, records, errors
