"""index.html: the sign-off as one self-contained page.

Self-contained means the file alone is the report: inline CSS, plots as base64 PNG data
URIs, one small inline script (the "only non-passing rows" filter), nothing fetched, so it
can be attached to an issue or opened from a CI artifact offline. The verdict and the
matrix come first: a screenshot of the top of the page is the sign-off at a glance.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any

from harness.signoff.certificate import render_html as render_certificates
from harness.signoff.model import INCOMPLETE, SIGNED_OFF, STATUSES, SignoffReport
from harness.signoff.plots import ScenarioPlot
from harness.signoff.quality import render_html as render_quality

_CSS = """
:root { --pass: #1a7f37; --fail: #cf222e; --error: #9a6700; --waived: #8250df; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Arial, sans-serif;
       margin: 0; padding: 16px 24px 48px; color: #1f2328; background: #fff; }
h1 { font-size: 20px; margin: 0 0 2px; } h2 { font-size: 16px; margin: 26px 0 8px;
  border-bottom: 1px solid #d0d7de; padding-bottom: 4px; } h3 { font-size: 14px; margin: 16px 0 6px; }
.sub { color: var(--muted); font-size: 12px; }
code, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
#verdict { display: flex; align-items: center; gap: 18px; margin: 12px 0; padding: 10px 16px;
  border-radius: 6px; color: #fff; }
#verdict.signed-off { background: var(--pass); } #verdict.blocked { background: var(--fail); }
#verdict.incomplete { background: var(--error); }
#verdict .word { font-size: 24px; font-weight: 700; letter-spacing: .04em; }
.chip { display: inline-block; padding: 1px 8px; border-radius: 10px; background: rgba(255,255,255,.2);
  margin-right: 6px; font-weight: 600; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
#verdict-matrix td.cell { text-align: center; font-weight: 700; font-size: 12px; min-width: 92px; }
#verdict-matrix th.check { font-size: 12px; text-align: center; }
#verdict-matrix td.repeat { color: #afb8c1; }
td.PASS { background: #dafbe1; color: var(--pass); } td.FAIL { background: #ffebe9; color: var(--fail); }
td.ERROR { background: #fff8c5; color: var(--error); } td.WAIVED { background: #fbefff; color: var(--waived); }
td.none { color: #afb8c1; }
td.id { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.tier { display: inline-block; padding: 0 6px; border-radius: 4px; background: #ddf4ff; color: #0969da;
  font-size: 11px; font-weight: 700; }
.blocking li { color: var(--fail); } .blocking li span { color: #1f2328; }
.plot { margin: 6px 0 14px; } .plot img { max-width: 100%; border: 1px solid #d0d7de; }
details { margin: 4px 0; } summary { cursor: pointer; color: #0969da; }
.kv td:first-child { color: var(--muted); white-space: nowrap; }
.empty { color: var(--muted); font-style: italic; }
label.filter { font-size: 12px; color: var(--muted); margin-left: 12px; font-weight: normal; }
"""

# The one script: hide matrix rows whose checks all pass. Plain DOM, no library.
_SCRIPT = """
(function () {
  var box = document.getElementById('only-problems');
  if (!box) { return; }
  box.addEventListener('change', function () {
    var rows = document.querySelectorAll('#verdict-matrix tbody tr');
    for (var i = 0; i < rows.length; i++) {
      rows[i].hidden = box.checked && !rows[i].classList.contains('has-problem');
    }
  });
})();
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_page(doc: SignoffReport, plots: list[ScenarioPlot]) -> str:
    s, p = doc.signoff, doc.parity
    title = f"Parity sign-off {s.verdict}: {s.harness_version} on {s.device_key}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        "<header><h1>mlx-parity sign-off</h1>",
        f'<div class="sub">harness {e(s.harness_version)} · device <code>{e(s.device_key)}</code> · '
        f"commit <code>{e(p.harness_commit)}</code> · run {e(p.started)} → {e(p.finished)} · "
        f"rendered {e(s.generated)}</div></header>",
        _verdict(doc),
        _matrix(doc),
        _blocking(doc),
        _not_run(doc),
        _diff(doc),
        _waivers(doc),
        _problems(doc),
        _plots(plots),
        render_quality(doc.quality),
        render_certificates(doc.certificates, doc.certified_models),
        _timings(doc),
        _provenance(doc),
        '<footer class="sub"><p>One self-contained file: rendered from <code>report.json</code> beside it '
        "(the parity report plus the sign-off's judgement).</p></footer>",
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _verdict(doc: SignoffReport) -> str:
    s = doc.signoff
    cls = {SIGNED_OFF: "signed-off", INCOMPLETE: "incomplete"}.get(s.verdict, "blocked")
    chips = "".join(f'<span class="chip">{e(k)} {n}</span>' for k, n in s.counts.items())
    models = ", ".join(s.requested_models) or "none"
    blocking = f" · {len(s.blockers)} blocking (listed below the matrix)" if s.blockers else ""
    if s.not_run:
        blocking += f" · not run: {e(s.not_run_line())} (listed below the matrix)"
    if s.not_run_here:
        blocking += f" · not run on this backend: {e(', '.join(s.not_run_here))}"
    return (
        f'<div id="verdict" class="{cls}"><span class="word">{e(s.verdict)}</span>'
        f"<span>{chips}</span><span>{len(s.checks)} checks · models: {e(models)}{blocking}</span></div>"
    )


def _blocking(doc: SignoffReport) -> str:
    blockers = doc.signoff.blockers
    if not blockers:
        return ""
    items = "".join(
        f'<li title="{e(b.reason)}"><b>{e(b.kind)} {e(b.subject)}</b>: <span>{e(_clip(b.reason, 160))}</span></li>'
        for b in blockers[:50]
    )
    more = f"<li>… and {len(blockers) - 50} more (report.json lists all)</li>" if len(blockers) > 50 else ""
    return (
        f'<section id="blocking" class="blocking"><h2>Blocking ({len(blockers)})</h2><ul>{items}{more}</ul></section>'
    )


def _not_run(doc: SignoffReport) -> str:
    s = doc.signoff
    if not s.not_run:
        return ""
    items = "".join(f"<li><code>{e(cid)}</code></li>" for cid in s.not_run)
    return (
        f'<section id="not-run"><h2>Not run ({len(s.not_run)} of {s.expected_checks} checks '
        "of the requested profiles)</h2><p>Deselected (pytest <code>-k</code> / <code>-m</code>) or absent from "
        f"the report: this is no sign-off of the profiles until every check below has run.</p><ul>{items}</ul>"
        "</section>"
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _matrix(doc: SignoffReport) -> str:
    s = doc.signoff
    checks = s.check_names()
    timing = {(t.model, t.scenario): t for t in s.timings()}
    head = "".join(f'<th class="check">{e(c.replace("_", " "))}</th>' for c in checks)
    rows = []
    for model in s.models:
        for i, scenario in enumerate(s.scenarios(model)):
            cells, problem, tier = [], False, ""
            for check in checks:
                c = s.cell(model, scenario, check)
                if c is None:
                    cells.append('<td class="cell none">—</td>')
                    continue
                tier = c.tier
                problem |= c.status != "PASS"
                tip = c.summary + (f" [waived by {c.waiver}]" if c.waiver else "")
                cells.append(f'<td class="cell {e(c.status)}" title="{e(tip)}">{e(c.status)}</td>')
            t = timing[(model, scenario)]
            rows.append(
                f'<tr class="{"has-problem" if problem else "all-pass"}">'
                f'<td class="{"repeat" if i else ""}">{e(model)}</td><td><span class="tier">{e(tier)}</span></td>'
                f"<td>{e(scenario)}</td>{''.join(cells)}"
                f'<td class="num">{t.seconds:.1f}</td><td class="num">{t.peak_rss_mb:.0f}</td></tr>'
            )
    body = "".join(rows) or f'<tr><td colspan="{len(checks) + 5}" class="empty">no checks ran</td></tr>'
    return (
        '<section id="matrix"><h2>Verdict matrix <label class="filter">'
        '<input type="checkbox" id="only-problems"> only rows with a non-passing check</label></h2>'
        '<table id="verdict-matrix"><thead><tr><th>model</th><th>tier</th><th>scenario</th>'
        f"{head}<th>seconds</th><th>peak MB</th></tr></thead><tbody>{body}</tbody></table>"
        f'<div class="sub">Statuses: {", ".join(STATUSES)}. Hover a cell for its summary. '
        "Seconds: the scenario's checks together (its first check pays for the in-tree runs).</div></section>"
    )


def _diff(doc: SignoffReport) -> str:
    d = doc.signoff.diff
    if d is None:
        return (
            '<section id="diff"><h2>Since the previous sign-off</h2>'
            '<p class="empty">no previous sign-off for this device</p></section>'
        )
    lists = []
    for label, ids in (
        ("Newly passing", d.newly_passing),
        ("Newly failing", d.newly_failing),
        ("New checks", d.added),
        ("Checks no longer run", d.removed),
    ):
        if ids:
            body = "".join(f"<li><code>{e(i)}</code></li>" for i in ids)
            lists.append(f"<h3>{label} ({len(ids)})</h3><ul>{body}</ul>")
        else:
            lists.append(f'<h3>{label} (0): <span class="empty">none</span></h3>')
    changes = "".join(
        f"<tr><td><code>{e(c.key)}</code></td><td class='mono'>{e(c.old)}</td><td class='mono'>{e(c.new)}</td></tr>"
        for c in d.provenance_changes
    )
    table = (
        f"<table><thead><tr><th>key</th><th>previous</th><th>now</th></tr></thead><tbody>{changes}</tbody></table>"
        if changes
        else '<p class="empty">unchanged</p>'
    )
    return (
        '<section id="diff"><h2>Since the previous sign-off</h2>'
        f'<div class="sub">previous: <code>{e(d.previous)}</code> '
        f"({e(d.previous_verdict)}, {e(d.previous_generated)})</div>"
        f"{''.join(lists)}<h3>Changed provenance ({len(d.provenance_changes)})</h3>{table}</section>"
    )


def _waivers(doc: SignoffReport) -> str:
    waivers = doc.signoff.waivers
    if not waivers:
        return '<section id="waivers"><h2>Waivers</h2><p class="empty">no waivers</p></section>'
    rows = "".join(
        f'<tr class="{e(w.state)}"><td><code>{e(w.check)}</code></td><td>{e(w.reason)}</td><td>{e(w.owner)}</td>'
        f"<td>{e(w.expires)}</td><td class='{'FAIL' if w.state == 'expired' else ''}'>{e(w.state)}</td>"
        f"<td>{e(w.note)}{_id_list(w.waived)}</td></tr>"
        for w in waivers
    )
    return _table_section("waivers", "Waivers", ("check", "reason", "owner", "expires", "state", "use"), rows)


def _table_section(section: str, title: str, headers: tuple[str, ...], rows: str) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    return f'<section id="{section}"><h2>{title}</h2>{table}</section>'


def _id_list(ids: list[str]) -> str:
    if not ids:
        return ""
    return (
        f"<details><summary>{len(ids)} check(s)</summary>{'<br>'.join(f'<code>{e(i)}</code>' for i in ids)}</details>"
    )


def _problems(doc: SignoffReport) -> str:
    bad = [c for c in doc.signoff.checks if c.status != "PASS"]
    if not bad:
        return ""
    rows = "".join(
        f"<tr><td class='id'><code>{e(c.id)}</code></td><td class='cell {e(c.status)}'>{e(c.status)}</td>"
        f"<td class='num'>{'' if c.first_bad_step is None else c.first_bad_step}</td>"
        f"<td class='mono'>{e(c.summary)}</td></tr>"
        for c in bad
    )
    return _table_section("problems", "Non-passing checks", ("check", "status", "first bad step", "explanation"), rows)


def _plots(plots: list[ScenarioPlot]) -> str:
    if not plots:
        return '<section id="plots"><h2>Per-step plots</h2><p class="empty">no per-step comparisons</p></section>'
    figures = "".join(
        f'<div class="plot"><img alt="{e(p.model)}/{e(p.scenario)} per-step max |Δ|, max ULP and ULP histogram" '
        f'src="data:image/png;base64,{base64.b64encode(p.png).decode()}"></div>'
        for p in plots
    )
    return (
        '<section id="plots"><h2>Per-step plots</h2><div class="sub">Per scenario: max |Δ| and max ULP distance '
        "of each logits check per step (symlog; 0 is bit-identical), and the ULP-distance histogram of every "
        f"compared element.</div>{figures}</section>"
    )


def _timings(doc: SignoffReport) -> str:
    s = doc.signoff
    per_model: dict[str, list[float]] = {}
    for t in s.timings():
        agg = per_model.setdefault(t.model, [0, 0.0, 0.0])
        agg[0] += t.checks
        agg[1] += t.seconds
        agg[2] = max(agg[2], t.peak_rss_mb)
    rows = "".join(
        f"<tr><td>{e(m)}</td><td class='num'>{int(n)}</td><td class='num'>{sec:.1f}</td>"
        f"<td class='num'>{rss:.0f}</td></tr>"
        for m, (n, sec, rss) in per_model.items()
    )
    return (
        '<section id="timings"><h2>Timings and peak memory</h2>'
        f'<div class="sub">run {e(doc.parity.started)} → {e(doc.parity.finished)}; peak RSS is of the process that '
        "ran the checks, at each check's end (MB)</div>"
        "<table><thead><tr><th>model</th><th>checks</th><th>seconds</th><th>peak RSS MB</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _provenance(doc: SignoffReport) -> str:
    s, p = doc.signoff, doc.parity
    machine = {f"machine.{k}": v for k, v in s.machine.items()}
    device = {f"device.{k}": v for k, v in p.device.items()}
    top = _kv(machine | device | {"harness version": p.harness_version, "harness commit": p.harness_commit})
    models = "".join(_model_provenance(doc, m) for m in s.models)
    return f'<section id="provenance"><h2>Provenance</h2><h3>Machine and device</h3>{top}{models}</section>'


def _model_provenance(doc: SignoffReport, model: str) -> str:
    prov: dict[str, Any] = doc.parity.context.get("provenance", {}).get(model, {})
    if "error" in prov or not prov:
        return f"<h3>{e(model)}</h3><p class='empty'>{e(prov.get('error', 'no provenance in the report'))}</p>"
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
    golden_rows = "".join(
        f"<tr><td>{e(sid)}</td><td><code>{e(g.get('manifest', ''))}</code></td>"
        f"<td class='mono'>{'<br>'.join(e(f'{k}: {v}') for k, v in g.get('blobs', {}).items())}</td></tr>"
        for sid, g in goldens.items()
    )
    extra = f"<details><summary>twin config</summary><pre class='mono'>{e(json.dumps(twin, indent=1))}</pre></details>"
    return (
        f"<h3>{e(model)}</h3>{_kv(facts)}{extra if isinstance(twin, dict) else ''}"
        f"<details><summary>golden hashes ({len(goldens)} scenarios)</summary><table><thead><tr><th>scenario</th>"
        f"<th>manifest</th><th>blob sha256</th></tr></thead><tbody>{golden_rows}</tbody></table></details>"
    )


def _kv(facts: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{e(k)}</td><td class='mono'>{e(v if isinstance(v, str) else json.dumps(v))}</td></tr>"
        for k, v in facts.items()
        if v is not None
    )
    return f'<table class="kv"><tbody>{rows}</tbody></table>'
