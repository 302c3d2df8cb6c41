"""The conversion certificate's calibration record: what the original runtime's own numerics
spread over, and the bound a certificate is judged by.

One record per profile, runtime and golden key, tracked beside the goldens:
`goldens/<profile>/<golden key>/certificate/<runtime>.json`. Only `python -m harness certify
--model M --calibrate --write` writes one. It is tied to what it certifies against, never to the
converted weights (a converter bug changes those, and must fail the certificate, not stale it):
the original file (package, version, file, sha256), the runtime's pins, the certificate's
scenarios. It holds

- `calibration`: per runtime setting (CTranslate2's forced CPU ISA: GENERIC, AVX, AVX2, AVX512
  where the CPU has it; llama.cpp's threads and batch size) and scenario, the encoder's largest
  |difference| (Whisper) and every teacher-forced step's [KL, top-1 agreed, max |logit
  difference|, entries masked] against the oracle;
- `bound`: KL and |difference| bounds at HEADROOM times the largest calibrated figure, the
  smallest calibrated top-1 agreement, and the runtime's free greedy tokens equal to the
  oracle's (every calibrated ISA agreed, or calibration fails);
- `measured_against`: the identity of each golden it was calibrated on (for review);
- `origin`: command, date, machine, commit, the runtime's environment;
- `sha256` over the canonical JSON of all of the above, so a hand edit is detected.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.fileio import atomic_write_json
from harness.goldens.calibration import canonical_sha256

FORMAT = 1
KIND = "conversion-certificate-calibration"
HEADROOM = 2.0  # the bound over the runtime's own largest spread across its CPU kernels


class CertificateError(HarnessError):
    """A certificate record that is missing, edited, stale or malformed, or a runtime that failed."""


@dataclass(frozen=True)
class CertificateRecord:
    profile: str
    runtime: str
    device_key: str
    certifies: dict[str, Any]  # the original file, the runtime's pins hash, the scenarios
    calibration: dict[str, Any]
    bound: dict[str, Any]
    measured_against: dict[str, str]
    origin: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {"format": FORMAT, "kind": KIND} | dataclasses.asdict(self)

    def as_json(self) -> dict[str, Any]:
        body = self.body()
        return body | {"sha256": canonical_sha256(body)}


def bound_of(calibration: dict[str, Any]) -> dict[str, Any]:
    """The bound from every ISA's figures (see the module's docstring)."""
    scenarios = [s for isa in calibration.values() for s in isa.values()]
    steps = [step for s in scenarios for step in s["steps"]]
    encoders = [s["encoder_max_abs"] for s in scenarios if s["encoder_max_abs"] is not None]
    return {
        "max_kl": HEADROOM * max(step[0] for step in steps),
        "max_abs": HEADROOM * max(step[2] for step in steps),
        "min_top1_agreement": min(sum(step[1] for step in s["steps"]) / len(s["steps"]) for s in scenarios),
        "encoder_max_abs": HEADROOM * max(encoders) if encoders else None,
        "tokens": "equal, or first leaving the oracle's at a near-tie (its margin within max_abs)",
        "headroom": HEADROOM,
    }


def mend_hint(profile: str) -> str:
    return f"`python -m harness certify --model {profile} --calibrate --write` on this machine (review, commit)"


def read_record(
    path: Path, profile: str, runtime: str, device_key: str, certifies: dict[str, Any]
) -> CertificateRecord:
    """The record at `path`, checked: present, unedited, of this profile/runtime/key, and
    calibrated for what is certified now (else an error naming how to recalibrate)."""
    hint = mend_hint(profile)
    if not path.is_file():
        raise CertificateError(f"{path}: no certificate calibration for {profile} on {device_key}; run {hint}")
    try:
        data = json.loads(path.read_text())
        body = {k: v for k, v in data.items() if k != "sha256"}
        record = CertificateRecord(**{k: v for k, v in body.items() if k not in ("format", "kind")})
    except (ValueError, TypeError) as e:
        raise CertificateError(f"{path}: not a certificate record ({e}); run {hint}") from None
    if (body.get("format"), body.get("kind")) != (FORMAT, KIND):
        raise CertificateError(
            f"{path}: format {body.get('format')!r} kind {body.get('kind')!r}, expected {FORMAT} {KIND}"
        )
    if data.get("sha256") != canonical_sha256(body):
        raise CertificateError(f"{path}: its sha256 does not match its content (edited by hand?); run {hint}")
    if (record.profile, record.runtime, record.device_key) != (profile, runtime, device_key):
        raise CertificateError(
            f"{path}: a record of {record.profile}/{record.runtime} on {record.device_key}, expected "
            f"{profile}/{runtime} on {device_key}"
        )
    if record.certifies != certifies:
        changed = sorted(
            k for k in set(certifies) | set(record.certifies) if certifies.get(k) != record.certifies.get(k)
        )
        raise CertificateError(f"{path}: stale: {', '.join(changed)} changed since it was calibrated; run {hint}")
    return record


def write_record(path: Path, record: CertificateRecord) -> None:
    atomic_write_json(path, record.as_json())
