"""Per-step plots as PNG bytes, only where a scenario's logits differ.

Per differing scenario, one figure of up to four panels, one series per logits check:
KL(p_oracle ‖ p_in-tree) per step (what a difference does to the next-token distribution),
top-1 disagreements per step, max |Δ| per step relative to the oracle row's logit range
(max − min; a raw ULP distance is dominated by logits near zero, so it zig-zags over
decades and says little), and the ULP-distance histogram of every compared element. A panel
whose series are all zero is left out, with a line saying so; a scenario whose every compared
row is bit-identical gets no figure at all (the page counts them). Series differ in colour,
marker and line style, with hollow markers of different sizes: the decode and teacher-forced
rows of one step are often the same numbers, and both must stay visible.

Drawn with matplotlib's Agg canvas on a bare Figure (no pyplot): no display, no global
figure state, the same bytes whatever backend a user configured. The page embeds them as
data URIs, so the report stays one self-contained file.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.checks.registry import CHECKS
from harness.report import ItemResult

# Logits-row checks first (registry order), then any other check with per-step data.
_ORDER = [c.name for c in CHECKS.values() if c.rows is not None] + [c.name for c in CHECKS.values() if c.rows is None]
_STYLES = (
    {"color": "#8250df", "marker": "o", "linestyle": "-", "markersize": 9},
    {"color": "#0969da", "marker": "s", "linestyle": "--", "markersize": 6},
    {"color": "#bf8700", "marker": "^", "linestyle": ":", "markersize": 11},
    {"color": "#1a7f37", "marker": "D", "linestyle": "-.", "markersize": 5},
)


@dataclass(frozen=True)
class ScenarioPlot:
    model: str
    scenario: str
    png: bytes | None  # None: the rows differ, but every panel would be all zero
    panels: list[str]  # the titles of the panels drawn
    notes: list[str] = field(default_factory=list)  # the panels left out, and why
    legend: list[str] = field(default_factory=list)  # the checks drawn as series

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png or b"").decode()


@dataclass(frozen=True)
class Plots:
    figures: list[ScenarioPlot]  # the scenarios whose logits differ somewhere, in report order
    identical: list[str]  # model/scenario: every compared logits row bit-identical (no plot)


def bucket_floor(bucket: str) -> int:
    """The smallest ULP distance of a histogram bucket ('0', '1', '2-3', ..., '>=1048576').

    Reports write JSON with sorted keys, so the bucket order is recovered from the labels.
    """
    return int(bucket.lstrip(">=").split("-")[0])


def scenario_plots(results: list[ItemResult]) -> Plots:
    """A figure per (model, scenario) whose per-step logits comparisons differ, in report order."""
    groups: dict[tuple[str, str], list[ItemResult]] = {}
    for r in results:
        if r.details.get("per_step"):
            groups.setdefault((r.model, r.scenario), []).append(r)
    figures, identical = [], []
    for (model, scenario), items in groups.items():
        if all(_num(s.get("n_differing")) == 0 for r in items for s in r.details["per_step"]):
            identical.append(f"{model}/{scenario}")
        else:
            figures.append(_plot(model, scenario, sorted(items, key=_rank)))
    return Plots(figures, identical)


def _rank(r: ItemResult) -> int:
    return _ORDER.index(r.check) if r.check in _ORDER else len(_ORDER)


def _num(value: Any) -> float | None:
    """A finite JSON number, else None (reports write NaN and infinities as strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        return None
    return float(value)


def _series(items: list[ItemResult], value: Callable[[dict[str, Any]], float | None]) -> list[tuple[str, list, list]]:
    """(check, steps, values) per check, steps without a value left out, and checks without any
    (a row decided by its digest has no KL or range: it is bit-identical, with nothing to draw)."""
    out = []
    for r in items:
        points = [(s["step"], value(s)) for s in r.details["per_step"]]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            out.append((r.check, [x for x, _ in points], [y for _, y in points]))
    return out


def _relative(entry: dict[str, Any]) -> float | None:
    diff, scale = _num(entry.get("max_abs_diff")), _num(entry.get("logit_range"))
    return diff / scale if diff is not None and scale else None


def _disagrees(entry: dict[str, Any]) -> float | None:
    top1 = entry.get("top1")
    return None if not isinstance(top1, bool) else float(not top1)


def _plot(model: str, scenario: str, items: list[ItemResult]) -> ScenarioPlot:
    """The panels with something to show; each left-out one named in `notes`."""
    has = {k: any(k in s for r in items for s in r.details["per_step"]) for k in ("kl", "top1", "logit_range")}
    panels: list[tuple[str, Callable[[Any], None]]] = []
    notes: list[str] = []

    def line_panel(title: str, series: list[tuple[str, list, list]], ylabel: str, zero_note: str) -> None:
        if any(v for _, _, values in series for v in values):
            panels.append((title, lambda ax: _lines(ax, series, ylabel)))
        else:
            notes.append(zero_note)

    if has["kl"]:
        kl = _series(items, lambda s: _num(s.get("kl")))
        line_panel("KL(p_oracle ‖ p_in-tree) per step", kl, "KL (nats)", "KL is 0 at every step: no KL plot")
    else:
        notes.append("no KL per step in the report (an older harness): no KL plot")
    if has["top1"]:
        flips = _series(items, _disagrees)
        if any(v for _, _, values in flips for v in values):
            panels.append(("top-1 per step", lambda ax: _top1(ax, flips)))
        else:
            notes.append("top-1 agrees at every step: no top-1 plot")
    else:
        notes.append("no top-1 per step in the report (an older harness): no top-1 plot")
    if has["logit_range"]:
        rel = _series(items, _relative)
        title = "max |Δ| / oracle logit range per step"
        line_panel(title, rel, "max |Δ| ÷ (max − min)", "max |Δ| is 0 at every step: no |Δ| plot")
    else:  # no range to read it against: the raw difference, said to be raw
        raw = _series(items, lambda s: _num(s.get("max_abs_diff")))
        title = "max |Δ| per step (raw: no logit range in the report)"
        line_panel(title, raw, "max |Δ|", "max |Δ| is 0 at every step: no |Δ| plot")
    totals = _histogram_totals(items)
    if any(n for b, n in totals.items() if bucket_floor(b) > 0):
        panels.append(("ULP distance histogram (elements)", lambda ax: _histogram(ax, totals)))
    else:
        notes.append("every element within 0 ULP: no histogram")
    if not panels:
        return ScenarioPlot(model, scenario, None, [], notes)
    fig = Figure(figsize=(3.4 * len(panels) + 0.6, 3.1), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, draw) in zip(axes, panels, strict=True):
        draw(ax)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if labels:
        fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8, frameon=False)
    fig.suptitle(f"{model} / {scenario}", fontsize=11, color="#cf222e")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return ScenarioPlot(model, scenario, buffer.getvalue(), [t for t, _ in panels], notes, labels)


def _style(check: str) -> dict[str, Any]:
    index = _ORDER.index(check) if check in _ORDER else len(_ORDER)
    return _STYLES[index % len(_STYLES)] | {"label": check, "fillstyle": "none", "linewidth": 1.2}


def _lines(ax, series: list[tuple[str, list, list]], ylabel: str) -> None:
    """Log scale where the values span decades; a zero (bit-identical step) sits on the axis floor."""
    positive = [v for _, _, values in series for v in values if v > 0]
    floor = min(positive) / 10
    for check, steps, values in series:
        ax.plot(steps, [max(v, floor) for v in values], **_style(check))
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, max(positive) * 3)
    ax.set_xlabel("step (a point on the bottom edge: 0)", fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(True, alpha=0.3)


def _top1(ax, series: list[tuple[str, list, list]]) -> None:
    """One row per check: a dot where the top-1 token agrees, a large cross where it differs."""
    for row, (check, steps, flips) in enumerate(series):
        style = _style(check)
        agree = [x for x, f in zip(steps, flips, strict=True) if not f]
        differ = [x for x, f in zip(steps, flips, strict=True) if f]
        ax.plot(agree, [row] * len(agree), "|", color="#afb8c1", markersize=6)
        ax.plot(differ, [row] * len(differ), "x", color=style["color"], markersize=9, markeredgewidth=2)
    ax.set_yticks(range(len(series)), [f"{c}\n{int(sum(f))}/{len(f)} differ" for c, _, f in series], fontsize=7)
    ax.set_ylim(-0.6, len(series) - 0.4)
    ax.set_xlabel("step (×: top-1 differs, |: agrees)", fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)


def _histogram_totals(items: list[ItemResult]) -> dict[str, int]:
    """Elements per ULP-distance bucket, summed over the scenario's logits checks."""
    totals: dict[str, int] = {}
    for r in items:
        for bucket, count in r.details.get("ulp_histogram", {}).items():
            totals[bucket] = totals.get(bucket, 0) + int(count)
    return totals


def _histogram(ax, totals: dict[str, int]) -> None:
    ordered = sorted(totals, key=bucket_floor)
    # Up to the last non-empty bucket (at least the first few), so one outlier stays visible.
    last = max([i for i, b in enumerate(ordered) if totals[b]] + [3])
    shown = ordered[: last + 1]
    ax.bar(range(len(shown)), [totals[b] for b in shown], color=["#1a7f37"] + ["#cf222e"] * (len(shown) - 1))
    every = 1 if len(shown) <= 10 else 2  # 22 bucket labels do not fit under one panel
    ax.set_xticks(range(len(shown)), [b if i % every == 0 else "" for i, b in enumerate(shown)])
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.5)  # a bucket holding one element still shows
    ax.set_xlabel("ULP distance (0: identical)", fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
