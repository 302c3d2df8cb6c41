"""Per-step plots as PNG bytes: max |Δ| and max ULP per step, and the ULP histogram.

Drawn with matplotlib's Agg canvas on a bare Figure (no pyplot): no display, no global
figure state, the same bytes whatever backend a user configured. The page embeds them as
data URIs, so the report stays one self-contained file.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.checks.registry import CHECKS
from harness.report import ItemResult

# One colour per logits gate (the checks localized to a module), in registry order.
_COLORS = dict(zip((c.name for c in CHECKS.values() if c.localized), ("#8250df", "#0969da", "#bf8700"), strict=True))


@dataclass(frozen=True)
class ScenarioPlot:
    model: str
    scenario: str
    png: bytes
    bit_identical: bool  # every plotted step of every check had zero differing elements


def bucket_floor(bucket: str) -> int:
    """The smallest ULP distance of a histogram bucket ('0', '1', '2-3', ..., '>=1048576').

    Reports write JSON with sorted keys, so the bucket order is recovered from the labels.
    """
    return int(bucket.lstrip(">=").split("-")[0])


def scenario_plots(results: list[ItemResult]) -> list[ScenarioPlot]:
    """One figure per (model, scenario) that has per-step logits comparisons, in report order."""
    groups: dict[tuple[str, str], list[ItemResult]] = {}
    for r in results:
        if r.details.get("per_step"):
            groups.setdefault((r.model, r.scenario), []).append(r)
    return [_plot(model, scenario, items) for (model, scenario), items in groups.items()]


def _plot(model: str, scenario: str, items: list[ItemResult]) -> ScenarioPlot:
    fig = Figure(figsize=(13, 2.9), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    ax_abs, ax_ulp, ax_hist = fig.subplots(1, 3, width_ratios=[1, 1, 1.15])
    identical, top_abs, top_ulp = True, 0.0, 0
    for r in items:
        steps = [s["step"] for s in r.details["per_step"]]
        color = _COLORS.get(r.check)
        style = {"marker": "o", "markersize": 3, "linewidth": 1.2, "label": r.check, "color": color}
        ax_abs.plot(steps, [s["max_abs_diff"] for s in r.details["per_step"]], **style)
        ax_ulp.plot(steps, [s["max_ulp"] for s in r.details["per_step"]], **style)
        identical &= all(s["n_differing"] == 0 for s in r.details["per_step"])
        top_abs = max([top_abs] + [s["max_abs_diff"] for s in r.details["per_step"]])
        top_ulp = max([top_ulp] + [s["max_ulp"] for s in r.details["per_step"]])
    # symlog keeps 0 (bit-identical) on the axis; the floors keep an all-zero plot readable.
    for ax, title, linthresh, top in (
        (ax_abs, "max |Δ| per step", 1e-6, max(top_abs * 2, 1e-5)),
        (ax_ulp, "max ULP per step", 1, max(top_ulp * 2, 10)),
    ):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.set_yscale("symlog", linthresh=linthresh)
        ax.set_ylim(0, top)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
    handles, labels = ax_abs.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8, frameon=False)
    _histogram(ax_hist, items)
    fig.suptitle(
        f"{model} / {scenario}" + ("  (every step bit-identical)" if identical else ""),
        fontsize=11,
        color="#1a7f37" if identical else "#cf222e",
    )
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return ScenarioPlot(model, scenario, buffer.getvalue(), identical)


def _histogram(ax, items: list[ItemResult]) -> None:
    """Elements per ULP-distance bucket, summed over the scenario's logits checks."""
    totals: dict[str, int] = {}
    for r in items:
        for bucket, count in r.details.get("ulp_histogram", {}).items():
            totals[bucket] = totals.get(bucket, 0) + int(count)
    ordered = sorted(totals, key=bucket_floor)
    # Up to the last non-empty bucket (at least the first few), so one outlier stays visible.
    last = max([i for i, b in enumerate(ordered) if totals[b]] + [3])
    shown = ordered[: last + 1]
    if not shown:
        ax.text(0.5, 0.5, "no histogram in the report", ha="center", va="center", transform=ax.transAxes)
        return
    ax.bar(range(len(shown)), [totals[b] for b in shown], color=["#1a7f37"] + ["#cf222e"] * (len(shown) - 1))
    ax.set_xticks(range(len(shown)), shown, rotation=45, ha="right", fontsize=7)
    if any(totals[b] for b in shown):
        ax.set_yscale("log")
        ax.set_ylim(bottom=0.5)  # a bucket holding one element still shows
    ax.set_title("ULP distance histogram (elements)", fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="y", alpha=0.3)
