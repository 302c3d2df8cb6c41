"""summary.md: the sign-off as Markdown, for a PR comment, a GitHub job summary or a terminal."""

from __future__ import annotations

from harness.branch_coverage import figures_line
from harness.markdown import md_code, md_text
from harness.signoff.evidence import fuzz_line, mutate_line
from harness.signoff.model import SignoffReport
from harness.signoff.quality import render_markdown as render_quality


def _cell(text: str) -> str:
    return md_text(text)


def _artifacts(doc: SignoffReport) -> str:
    """Per model, whether the real artifact or its synthetic twin ran (a twin proves the code
    path, never the real weights)."""
    provenance = doc.parity.context.get("provenance", {})
    out = []
    for model in doc.signoff.models:
        prov = provenance.get(model, {})
        ran = "unknown" if "ran_twin" not in prov else ("**twin**" if prov["ran_twin"] else "real")
        out.append(f"{model} {ran}")
    return ", ".join(out) or "none"


def _requested(device: dict[str, str]) -> str:
    """The device MLX_PARITY_DEVICE asked for, and the GPU passed over (a hosted Mac's paravirtual one)."""
    if not device.get("requested"):
        return ""
    text = f": the {device.get('backend')} device (MLX_PARITY_DEVICE={device['requested']})"
    return text + (f", not this machine's GPU, {device['passed_over']}" if device.get("passed_over") else "")


def render_summary(doc: SignoffReport) -> str:
    s, p = doc.signoff, doc.parity
    counts = ", ".join(f"{k} {n}" for k, n in s.counts.items())
    lines = [
        f"# Parity sign-off: {s.verdict}",
        "",
        f"- harness {s.harness_version}, commit {md_code(p.harness_commit)}",
        f"- device {md_code(s.device_key)}{_requested(p.device)}",
        f"- run {p.started} → {p.finished}; rendered {s.generated}",
        f"- models: {', '.join(s.requested_models) or 'none'}; {len(s.checks)} checks: {counts}",
        f"- artifacts: {_artifacts(doc)}",
        f"- branch coverage: {figures_line(doc.coverage)}",
        f"- differential fuzzing: {fuzz_line(doc.evidence.get('fuzz'))}",
        f"- mutation testing: {mutate_line(doc.evidence.get('mutate'))}",
    ]
    if s.not_run:
        lines.append(f"- **not run: {s.not_run_line()}** (listed below)")
    if s.not_run_here:
        lines.append(f"- not run on this backend (no scenario of it runs here): {', '.join(s.not_run_here)}")
    scoped = p.context.get("scoped_out") or []
    if scoped:
        lines.append(f"- scenarios not run on this backend ({len(scoped)}): {', '.join(scoped)}")
    lines.append("")
    if s.blockers:
        lines += [f"## Blocking ({len(s.blockers)})", ""]
        lines += [f"- **{b.kind} {md_code(b.subject)}**: {_cell(b.headline)}" for b in s.blockers]
        lines.append("")
    if s.not_run:
        lines += [
            f"## Not run ({len(s.not_run)} of {s.expected_checks} checks of the requested profiles)",
            "",
            "Deselected (pytest `-k` / `-m`) or absent from the report: this is no sign-off of the "
            "profiles until every check below has run.",
            "",
        ]
        lines += [f"- {md_code(cid)}" for cid in s.not_run]
        lines.append("")
    checks = s.check_names()
    timing = {(t.model, t.scenario): t for t in s.timings()}
    lines += [
        "## Verdict matrix",
        "",
        "| model | tier | scenario | " + " | ".join(checks) + " | seconds | peak MB |",
        "|---|---|---|" + "---|" * len(checks) + "---:|---:|",
    ]
    for model in s.models:
        for scenario in s.scenarios(model):
            cells = [s.cell(model, scenario, c) for c in checks]
            tier = next((c.tier for c in cells if c), "")
            t = timing[(model, scenario)]
            status = " | ".join(c.status if c else "—" for c in cells)
            lines.append(f"| {model} | {tier} | {scenario} | {status} | {t.seconds:.1f} | {t.peak_rss_mb:.0f} |")
    lines.append("")
    bad = [c for c in s.checks if c.status != "PASS"]
    if bad:
        lines += ["## Non-passing checks", ""]
        lines += [f"- {md_code(c.id)} **{c.status}**: {_cell(c.summary)}" for c in bad]
        lines.append("")
    lines += render_quality(doc.quality)
    lines += ["## Waivers", ""]
    if s.waivers:
        lines += ["| check | reason | owner | expires | state | use |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {md_code(w.check)} | {_cell(w.reason)} | {_cell(w.owner)} | {w.expires} | {_cell(w.state)} "
            f"| {_cell(w.note)} |"
            for w in s.waivers
        ]
    else:
        lines.append("none")
    lines += ["", "## Since the previous sign-off", ""]
    d = s.diff
    if d is None:
        lines.append("no previous sign-off for this device")
    else:
        lines.append(f"previous: {md_code(d.previous)} ({d.previous_verdict}, {d.previous_generated})")
        lines.append("")
        for label, ids in (
            ("newly passing", d.newly_passing),
            ("newly failing", d.newly_failing),
            ("new checks", d.added),
            ("checks no longer run", d.removed),
        ):
            lines.append(f"- {label} ({len(ids)}): " + (", ".join(md_code(i) for i in ids) or "none"))
        lines.append(f"- changed provenance ({len(d.provenance_changes)}):")
        lines += [f"  - {md_code(c.key)}: {_cell(c.old)} → {_cell(c.new)}" for c in d.provenance_changes]
    lines.append("")
    return "\n".join(lines)
