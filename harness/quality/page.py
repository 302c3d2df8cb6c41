"""index.html of a quality report: the table, and per pair a KL histogram and KL by token
position, drawn as harness/signoff/plots.py draws (matplotlib's Agg canvas on a bare Figure, PNGs
embedded as data URIs: one self-contained file)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np

from harness.quality.run import PairResult


def pair_plot(r: PairResult) -> bytes:
    """KL histogram (log-spaced bins, positions per bin) and mean KL by position in the window."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 2.9), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    ax_hist, ax_pos = fig.subplots(1, 2)
    if r.measurement is not None:
        kl = r.measurement.arrays["kl"].astype(np.float64)
        by_position = kl.mean(axis=0)
        quantized = r.measurement.arrays["quantized"].any(axis=0)
    else:  # speech: steps of every fixture, in decode order
        kl = np.concatenate([np.asarray(f.kl, dtype=np.float64) for f in r.fixtures]).reshape(1, -1)
        width = max(len(f.kl) for f in r.fixtures)
        padded = np.full((len(r.fixtures), width), np.nan)
        for i, f in enumerate(r.fixtures):
            padded[i, : len(f.kl)] = f.kl
        by_position = np.nanmean(padded, axis=0)
        quantized = np.zeros(width, dtype=bool)
    flat = kl.reshape(-1)
    positive = flat[flat > 0]
    zeros = int((flat <= 0).sum())
    if positive.size:
        bins = np.logspace(np.log10(positive.min()), np.log10(positive.max()) + 1e-9, 40)
        ax_hist.hist(positive, bins=bins, color="#0969da")
        ax_hist.set_xscale("log")
        ax_hist.set_yscale("log")
    ax_hist.set_title(f"KL(control ‖ candidate) per position ({zeros} exactly 0, not shown)", fontsize=10)
    ax_hist.set_xlabel("KL (nats)", fontsize=8)
    ax_pos.plot(np.arange(by_position.size), by_position, linewidth=1, color="#8250df", label="mean KL")
    if quantized.any():
        first = int(np.argmax(quantized))
        ax_pos.axvline(first, color="#cf222e", linewidth=0.8, linestyle="--", label="first position on quantized KV")
        ax_pos.legend(fontsize=7, frameon=False)
    ax_pos.set_yscale("symlog", linthresh=1e-6)
    ax_pos.set_title("mean KL by token position in the window", fontsize=10)
    ax_pos.set_xlabel("position", fontsize=8)
    for ax in (ax_hist, ax_pos):
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{r.pair.id}: {r.candidate.label} against {r.control.label} ({r.ran})", fontsize=11)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _figure(r: PairResult) -> str:
    try:
        png = base64.b64encode(pair_plot(r)).decode()
    except ImportError as e:  # an interpreter without matplotlib (the GPU machine's): the table still stands
        return f"<p>{_e(r.pair.id)}: no plot ({_e(e)})</p>"
    return f'<figure><img alt="{_e(r.pair.id)}" src="data:image/png;base64,{png}"></figure>'


def _e(text: Any) -> str:
    return html.escape(str(text))


def render_page(doc: dict[str, Any], results: list[PairResult]) -> str:
    rows = []
    for p in doc["pairs"]:
        s, kl = p["summary"], p["summary"]["kl"]
        quality = "—" if p["quality"] is None else p["quality"]["status"]
        cross = p["cross_check"]["status"]
        ratio = s.get("ppl_ratio") or {}
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{_e(c)}</td>"
                for c in (
                    p["id"],
                    p["candidate"]["label"],
                    p["control"]["label"],
                    p["ran"],
                    f"{kl['mean']['value']:.3e} ± {kl['mean']['se']:.1e}",
                    f"{kl['median']['value']:.2e} / {kl['p95']['value']:.2e} / {kl['p99']['value']:.2e}",
                    f"{kl['max']:.3e}",
                    f"{s['top1_agreement']['value']:.4f} ± {s['top1_agreement']['se']:.4f}",
                    f"{ratio['value']:.4f} [{ratio['low']:.4f}, {ratio['high']:.4f}]"
                    if ratio
                    else f"WER {s.get('wer')}",
                    cross if cross == "equal" else f"{cross}: {p['cross_check']['detail']}",
                    p["source"],
                    quality,
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "pair",
            "candidate",
            "control",
            "ran",
            "mean KL ± SE",
            "median / p95 / p99",
            "max KL",
            "top-1 agreement",
            "PPL ratio [95% CI]",
            "in-tree cross-check",
            "source",
            "quality",
        )
    )
    figures = "".join(_figure(r) for r in results)
    comparisons = "".join(
        f"<li>{_e(c['a'])} − {_e(c['b'])}: {c['diff']:.3e} ± {c['se']:.1e} "
        f"({'larger than 2 SE' if c['distinguishable'] else 'within noise'})</li>"
        for c in doc["comparisons"]
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>quality: {_e(doc["model"])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #d0d7de;padding:3px 6px;text-align:left}}th{{background:#f6f8fa}}img{{max-width:100%}}</style>
</head><body>
<h1>Quantization quality: {_e(doc["model"])}</h1>
<p><strong>Not part of the parity verdict.</strong> {_e(doc["note"])}. Device {_e(doc["device"].get("key"))},
commit {_e(doc["harness_commit"])}, generated {_e(doc["generated"])}.</p>
<table><tr>{head}</tr>{"".join(rows)}</table>
<h2>Candidates of one control</h2><ul>{comparisons or "<li>none</li>"}</ul>
<h2>Per pair</h2>{figures}
</body></html>
"""
