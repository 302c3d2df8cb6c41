"""index.html: the sign-off as one self-contained page, rendered from Jinja2 templates.

The templates are in harness/signoff/templates/ (page.html.j2 includes one per section),
rendered with autoescaping on, so every value from a report (a summary, a waiver's reason, a
provenance string) is escaped once, by the template engine, and with StrictUndefined, so a
misspelt name is an error rather than an empty cell. This module only shapes the data the
sections show; the markup is the templates'.

Self-contained means the file alone is the report: inline CSS (templates/page.css), plots as
base64 PNG data URIs, one small inline script (templates/filter.js, the "only non-passing
rows" filter), nothing fetched, so it can be attached to an issue or opened from a CI
artifact offline. The verdict and the matrix come first: a screenshot of the top of the page
is the sign-off at a glance.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2

from harness.branch_coverage import figures_line
from harness.signoff.certificate import table_rows as certificate_rows
from harness.signoff.evidence import fuzz_line, mutate_line
from harness.signoff.model import INCOMPLETE, SIGNED_OFF, STATUSES, SignoffReport
from harness.signoff.plots import Plots
from harness.signoff.quality import table_rows as quality_rows

MAX_BLOCKERS = 50  # listed on the page; report.json and summary.md list every one


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("harness.signoff", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_page(doc: SignoffReport, plots: Plots) -> str:
    s, p = doc.signoff, doc.parity
    return (
        environment()
        .get_template("page.html.j2")
        .render(
            s=s,
            p=p,
            verdict_class={SIGNED_OFF: "signed-off", INCOMPLETE: "incomplete"}.get(s.verdict, "blocked"),
            checks=s.check_names(),
            matrix=_matrix(doc),
            statuses=STATUSES,
            max_blockers=MAX_BLOCKERS,
            plots=plots,
            quality=[r for q in doc.quality for r in quality_rows(q)],
            certificates=certificate_rows(doc.certificates, doc.certified_models),
            timings=_timings(doc),
            machine=_machine(doc),
            provenance=[_model_provenance(doc, m) for m in s.models],
            coverage_line=figures_line(doc.coverage),
            fuzz_line=fuzz_line(doc.evidence.get("fuzz")),
            mutate_line=mutate_line(doc.evidence.get("mutate")),
        )
    )


def _matrix(doc: SignoffReport) -> list[dict[str, Any]]:
    """One row per model x scenario: a cell per check (None where the check did not run there)."""
    s = doc.signoff
    checks = s.check_names()
    timing = {(t.model, t.scenario): t for t in s.timings()}
    rows = []
    for model in s.models:
        for i, scenario in enumerate(s.scenarios(model)):
            cells = [s.cell(model, scenario, check) for check in checks]
            ran = [c for c in cells if c is not None]
            t = timing[(model, scenario)]
            rows.append(
                {
                    "model": model,
                    "repeat": i > 0,
                    "scenario": scenario,
                    "tier": ran[-1].tier if ran else "",
                    "cells": cells,
                    "problem": any(c.status != "PASS" for c in ran),
                    "seconds": t.seconds,
                    "peak_rss_mb": t.peak_rss_mb,
                }
            )
    return rows


def _timings(doc: SignoffReport) -> list[dict[str, Any]]:
    per_model: dict[str, dict[str, Any]] = {}
    for t in doc.signoff.timings():
        agg = per_model.setdefault(t.model, {"model": t.model, "checks": 0, "seconds": 0.0, "peak_rss_mb": 0.0})
        agg["checks"] += t.checks
        agg["seconds"] += t.seconds
        agg["peak_rss_mb"] = max(agg["peak_rss_mb"], t.peak_rss_mb)
    return list(per_model.values())


def _machine(doc: SignoffReport) -> dict[str, Any]:
    s, p = doc.signoff, doc.parity
    machine = {f"machine.{k}": v for k, v in s.machine.items()}
    device = {f"device.{k}": v for k, v in p.device.items()}
    return machine | device | {"harness version": p.harness_version, "harness commit": p.harness_commit}


def _model_provenance(doc: SignoffReport, model: str) -> dict[str, Any]:
    prov: dict[str, Any] = doc.parity.context.get("provenance", {}).get(model, {})
    if "error" in prov or not prov:
        return {"model": model, "error": str(prov.get("error", "no provenance in the report"))}
    artifact = prov.get("artifact", {})
    ran = set(doc.signoff.scenarios(model))
    goldens = {sid: g for sid, g in prov.get("goldens", {}).items() if sid in ran}
    environment = next((g.get("oracle_environment") for g in goldens.values() if g.get("oracle_environment")), {})
    identity = dict(artifact.get("identity", {}))
    twin = identity.pop("twin", None)
    implementation = prov.get("implementation", {})
    facts: dict[str, Any] = {
        "implementation": implementation.get("name"),
        "implementation in tree": implementation.get("in_tree"),
        "implementation pins hash": implementation.get("pins_hash"),
        "tier": prov.get("tier"),
        "oracle": prov.get("oracle"),
        "oracle pins hash": prov.get("oracle_pins_hash"),
    }
    facts |= {f"oracle env {k}": v for k, v in environment.items() if k not in ("blas_libraries",)}
    facts |= {f"artifact {k}": v for k, v in identity.items()}
    facts["ran twin"] = prov.get("ran_twin")
    if isinstance(twin, dict):
        facts |= {"twin id": twin.get("id"), "twin version": twin.get("twin_version"), "twin seed": twin.get("seed")}
    facts["tokenizer sha256"] = artifact.get("tokenizer")
    facts |= {f"weights {name}": sha for name, sha in artifact.get("weights", {}).items()}
    return {
        "model": model,
        "error": None,
        "facts": facts,
        "twin": twin if isinstance(twin, dict) else None,
        "goldens": goldens,
    }
