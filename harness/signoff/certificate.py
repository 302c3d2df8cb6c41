"""The sign-off's "Conversion certificates" section: for each signed-off model whose profile
names one, the newest `python -m harness certify` report of this device
(reports/certificate-<model>-<key>[-N]/certificate.json). Read, never measured here. A FAIL says
the artifact's conversion differs from what its own runtime computes beyond the calibrated bound:
every L1 gate can pass on such weights (both sides load them), so it is shown apart, in red; a
model with a certificate and no report on this device says so, never a pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def latest_certificates(out: Path, device_key: str, models: list[str]) -> list[dict[str, Any]]:
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in out.glob("certificate-*/certificate.json"):
        try:
            doc = json.loads(path.read_text())
            model, generated, key = doc["profile"], str(doc["generated"]), doc["device_key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written or foreign folder is not a certificate
        if model in models and key == device_key and (model not in found or generated > found[model][0]):
            found[model] = (generated, doc | {"path": str(path)})
    return [found[m][1] for m in models if m in found]


def _figures(doc: dict[str, Any]) -> str:
    parts = []
    for scenario, f in sorted(doc.get("figures", {}).items()):
        parts.append(
            f"{scenario}: max KL {f['max_kl']:.2e}, max |logit diff| {f['max_abs']:.2e}, top-1 "
            f"{f['top1_agreement']:.3f}, encoder {f['encoder_max_abs']:.2e}"
        )
    bound = doc.get("bound")
    if bound:
        parts.append(
            f"bound: KL {bound['max_kl']:.2e}, |diff| {bound['max_abs']:.2e}, top-1 ≥ {bound['min_top1_agreement']}"
        )
    return "; ".join(parts + doc.get("problems", []))


def table_rows(docs: list[dict[str, Any]], expected: list[str]) -> list[dict[str, str]]:
    """The section's rows (templates/certificates.html.j2): one per certificate read, then one
    per model in `expected` (the signed-off models whose profile names a certificate) without
    one on this device, which the page shows in red, never as a pass."""
    rows = [
        {
            "model": doc["profile"],
            "runtime": doc["runtime"],
            "verdict": doc["verdict"],
            "figures": _figures(doc),
            "measured": doc["generated"],
        }
        for doc in docs
    ]
    for model in sorted(set(expected) - {d["profile"] for d in docs}):
        rows.append(
            {"model": model, "runtime": "", "verdict": "not certified on this device", "figures": "", "measured": ""}
        )
    return rows
