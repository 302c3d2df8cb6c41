"""The sign-off's "Quality (not part of the verdict)" section.

It reads what `python -m harness quality` wrote, never measures: for each signed-off model, the
newest quality report of this device under the reports folder (reports/quality-<model>-<device
key>[-N]/quality.json), with its date and commit. Nothing here touches the verdict; a pair with
thresholds gets its own "quality" line (PASS / FAIL), and an in-tree cross-check that differed
is shown as the parity failure it is (that report's own exit code said so when it ran).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def latest_quality_reports(out: Path, device_key: str, models: list[str]) -> list[dict[str, Any]]:
    """The newest quality.json per model for this device (by its `generated` time)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in out.glob("quality-*/quality.json"):
        try:
            doc = json.loads(path.read_text())
            model, generated = doc["model"], str(doc["generated"])
            key = doc["device"]["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written or foreign folder is not a quality report
        if model in models and key == device_key and (model not in found or generated > found[model][0]):
            found[model] = (generated, doc | {"path": str(path)})
    return [found[m][1] for m in models if m in found]


def table_rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    """One row per pair of a quality report: the page's section (templates/quality.html.j2) and summary.md."""
    rows = []
    for p in doc.get("pairs", []):
        s, kl = p["summary"], p["summary"]["kl"]
        agree = s["top1_agreement"]
        figures = f"mean KL {kl['mean']['value']:.3e} ± {kl['mean']['se']:.1e}; top-1 {agree['value']:.4f}"
        if s.get("ppl_ratio"):
            figures += f"; PPL ratio {s['ppl_ratio']['value']:.4f}"
        if s.get("wer") is not None:
            figures += f"; WER {s['wer']:.4f}"
        rows.append(
            {
                "model": doc["model"],
                "pair": p["id"],
                "candidate": p["candidate"]["label"],
                "ran": p["ran"],
                "figures": figures,
                "cross_check": p["cross_check"]["status"],
                "quality": "—" if p["quality"] is None else p["quality"]["status"],
                "generated": doc["generated"],
            }
        )
    return rows


def render_markdown(docs: list[dict[str, Any]]) -> list[str]:
    lines = ["## Quality (not part of the verdict)", ""]
    if not docs:
        return lines + ["no quality report of a signed-off model on this device", ""]
    lines += [
        "Read from the newest `python -m harness quality` report per model on this device; not measured here.",
        "",
        "| model | pair | candidate | ran | figures | cross-check | quality | measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for doc in docs:
        for r in table_rows(doc):
            lines.append(
                f"| {r['model']} | {r['pair']} | {r['candidate']} | {r['ran']} | {r['figures']} | "
                f"{r['cross_check']} | {r['quality']} | {r['generated']} |"
            )
    return lines + [""]
