"""The calibration record of an L2 fast-path scenario: its token budget and its logit-error bound.

One record per scenario and golden key, beside the golden it was measured against:
`goldens/<profile>/<golden key>/calibration/<scenario>.json`. Only `make calibrate MODEL=...
ARGS=--write` writes one (harness/calibrate.py); the `token_budget` gate reads it and refuses
to judge without it. It holds:

- `budget`: differing tokens per clip, derived from the oracle against itself under benign
  changes (the profile's `budget.max_differing_tokens` must equal it);
- `steps`: per teacher-forced step (decode call, step, batch member), the fast path's largest
  |logit error| against that golden when it was calibrated. The fast path is deterministic on
  a golden key, so an unchanged fast path reproduces every number exactly; a step whose error
  exceeds its number means the fast path's arithmetic changed (a scale, a fused op, a dtype);
- `golden`: the identity of that golden (its tokens and the sha256 of every logits row): a
  golden with other bits makes the record stale;
- `origin`: command, date, machine, commit and the fast path's source hashes (for review);
- `sha256`: over the canonical JSON of all of the above, so a hand edit is detected.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.fileio import atomic_write_json
from harness.records import ScenarioRecord

FORMAT = 1
KIND = "fast-path-calibration"


class CalibrationError(HarnessError):
    """A calibration record that is missing, edited, stale or malformed."""


@dataclass(frozen=True)
class StepBound:
    call: int
    step: int
    member: int
    max_abs_logit_error: float

    @property
    def where(self) -> str:
        return f"decode call {self.call} step {self.step}" + (f" member {self.member}" if self.member else "")


@dataclass(frozen=True)
class CalibrationRecord:
    profile: str
    scenario: str
    device_key: str
    golden: str
    budget: int
    steps: tuple[StepBound, ...]
    origin: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": KIND,
            "profile": self.profile,
            "scenario": self.scenario,
            "device_key": self.device_key,
            "golden": self.golden,
            "budget": self.budget,
            "steps": [[s.call, s.step, s.member, s.max_abs_logit_error] for s in self.steps],
            "origin": self.origin,
        }

    def as_json(self) -> dict[str, Any]:
        body = self.body()
        return body | {"sha256": canonical_sha256(body)}


def canonical_sha256(body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def golden_identity(golden: ScenarioRecord) -> str:
    """sha256 over the golden's tokens and every logits row's raw-bit sha256. A compact golden
    carries those row hashes in its manifest, so its identity needs no blob."""
    rows = golden.compact.row_sha256 if golden.compact is not None else golden.row_hashes()
    return identity_of(golden.tokens, rows)


def identity_of(tokens: list[int], row_sha256: list[str]) -> str:
    return hashlib.sha256(
        json.dumps({"tokens": [int(t) for t in tokens], "rows": list(row_sha256)}).encode()
    ).hexdigest()


def mend_hint(profile: str) -> str:
    return f"`make calibrate MODEL={profile} ARGS=--write` on this machine (then review and commit the record)"


def read_record(path: Path, profile: str, scenario: str, device_key: str, golden: str) -> CalibrationRecord:
    """The record at `path`, verified: present, well-formed, unedited, and measured against
    this very golden (`golden`: its `golden_identity`) on this key. Anything else is a
    CalibrationError naming the file and the command that writes a new one."""
    hint = mend_hint(profile)
    if not path.is_file():
        raise CalibrationError(
            f"{profile}/{scenario}: no calibration record for golden key {device_key} ({path}): the fast "
            f"path's budget and logit-error bound are measured per key, so nothing can be judged here; "
            f"write one with {hint}"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CalibrationError(f"{path}: unreadable calibration record ({e}); write it again with {hint}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("kind") != KIND:
        raise CalibrationError(f"{path}: not a format-{FORMAT} {KIND} record; write it again with {hint}")
    body = {k: v for k, v in data.items() if k != "sha256"}
    if data.get("sha256") != canonical_sha256(body):
        raise CalibrationError(
            f"{path}: the record does not hash to its sha256: it was edited by hand; budgets and bounds "
            f"come from measurement only: write it again with {hint}"
        )
    try:
        steps = tuple(StepBound(int(c), int(s), int(m), float(e)) for c, s, m, e in data["steps"])
        record = CalibrationRecord(
            profile=str(data["profile"]),
            scenario=str(data["scenario"]),
            device_key=str(data["device_key"]),
            golden=str(data["golden"]),
            budget=int(data["budget"]),
            steps=steps,
            origin=dict(data["origin"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CalibrationError(f"{path}: malformed calibration record ({e!r}); write it again with {hint}") from e
    if (record.profile, record.scenario, record.device_key) != (profile, scenario, device_key):
        raise CalibrationError(
            f"{path}: a record of {record.profile}/{record.scenario} on {record.device_key}, expected "
            f"{profile}/{scenario} on {device_key}"
        )
    if record.golden != golden:
        raise CalibrationError(
            f"{path}: stale: it was measured against another golden of {profile}/{scenario} (the golden's "
            f"tokens or logits changed since); recalibrate with {hint}"
        )
    return record


def write_record(path: Path, record: CalibrationRecord) -> None:
    atomic_write_json(path, record.as_json())
