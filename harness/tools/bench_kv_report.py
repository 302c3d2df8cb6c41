"""`bench-kv`'s result as markdown tables and one PNG (read from the result JSON alone).

Two tables: speed and memory per (configuration, context, side), and the KV bytes per token,
measured against theoretical. The plot: mx peak memory, the cache's stored bytes, decode and
prefill tok/s against the context, one colour per configuration, in-tree solid (o), oracle dashed (x).
Drawn on a bare matplotlib Figure with the Agg canvas, as harness/signoff/plots.py draws.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from harness.tools.bench_common import machine_line


def _speed(spread: dict[str, Any]) -> str:
    return f"{spread['best']:.1f} / {spread['median']:.1f}"


def _ratio(cell: dict[str, Any], key: str) -> str:
    ratio = cell.get("ratio_in_tree_over_oracle")
    return "" if ratio is None else f"{ratio[key]['median']:.2f}x"


def _not_run(cell: dict[str, Any]) -> str | None:
    if "not_run" in cell:
        return f"not run: {cell['not_run']}"
    if "failed" in cell:
        return f"FAILED: {cell['failed'].splitlines()[0][:160]}"
    return None


def _cell_table(
    result: dict[str, Any], header: list[str], not_run_cells: str, rows: Callable[[dict[str, Any], str], list[str]]
) -> list[str]:
    """`header`, then per cell the rows `rows(cell, head)` make, or for a cell that did not run one row:
    its head, then `not_run_cells` with the reason in it."""
    lines = list(header)
    for cell in result["cells"]:
        head = f"| {cell['config']} | {cell['context']} "
        reason = _not_run(cell)
        if reason:
            lines.append(head + not_run_cells.format(reason=reason))
            continue
        lines += rows(cell, head)
    return lines


_SPEED_HEADER = [
    "| config | context | side | prefill tok/s best / median | decode tok/s best / median | mx peak MB "
    "(over weights) | peak RSS MB | 1-min load | in-tree / oracle decode, prefill (median per round) |",
    "|---|---:|---|---:|---:|---:|---:|---:|---:|",
]


def _speed_rows(cell: dict[str, Any], head: str) -> list[str]:
    lines = []
    load = "{:.1f}..{:.1f}".format(*cell["loadavg_1m_before_after"])
    for name, side in cell["sides"].items():
        ratio = ""
        if name == "in-tree" and "ratio_in_tree_over_oracle" in cell:
            same = "" if cell["same_tokens"] else "; tokens DIFFER"
            same += "" if cell["same_cache_classes"] else "; cache classes DIFFER"
            ratio = f"{_ratio(cell, 'decode_tok_s')}, {_ratio(cell, 'prefill_tok_s')}{same}"
        if name == "in-tree" and "oracle_not_run" in cell:
            ratio = f"oracle not run: {cell['oracle_not_run']}"
        lines.append(
            head + f"| {name} | {_speed(side['prefill_tok_s'])} | {_speed(side['decode_tok_s'])} | "
            f"{side['peak_mb']:.0f} ({side['peak_over_weights_mb']:.0f}) | {side['rss_peak_mb']:.0f} | "
            f"{load} | {ratio} |"
        )
    return lines


def speed_table(result: dict[str, Any]) -> list[str]:
    return _cell_table(result, _SPEED_HEADER, "| — | {reason} | | | | | |", _speed_rows)


_KV_HEADER = [
    "| config | context | tokens fed / held | KV bytes per held token: in-tree / oracle | theoretical | "
    "measured / theoretical | per context token: measured / theoretical | cache classes (in-tree) |",
    "|---|---:|---:|---:|---:|---:|---:|---|",
]


def _kv_rows(cell: dict[str, Any], head: str) -> list[str]:
    sides = cell["sides"]
    kv = sides["in-tree"]["kv"]
    theory = kv["theoretical"]
    others = [s["kv"]["per_held_token"] for n, s in sides.items() if n != "in-tree"]
    oracle = f" / {others[0]:.0f}" if others else " / —"
    classes = ", ".join(f"{n} x{k}" for n, k in kv["cache_types"].items())
    return [
        head + f"| {kv['tokens_fed']} / {kv['tokens_held']} | {kv['per_held_token']:.0f}{oracle} | "
        f"{theory['per_held_token']:.0f} | {kv['measured_over_theoretical']:.3f} | "
        f"{kv['per_context_token']:.0f} / {theory['per_context_token']:.0f} | {classes} |"
    ]


def kv_table(result: dict[str, Any]) -> list[str]:
    return _cell_table(result, _KV_HEADER, "| {reason} | | | | | |", _kv_rows)


def table(result: dict[str, Any]) -> str:
    shape = result["shape"]
    lines = [
        f"{result['model']} ({shape['layers']} layers, {shape['kv_heads']} KV heads x {shape['head_dim']}): "
        f"prompt `{result['prompt']['scenario']}` ({result['prompt']['tokens']} tokens) repeated to each context, "
        f"{result['steps']} greedy decode steps, prefill chunks of {result['prefill_step_size']}; every "
        "(configuration, context, side) its own process; budget "
        f"{result['budget_s']:.0f} s.",
        "",
        "| config | tier, oracle | what |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {c['tier']}, {c['oracle']} | {c['what']} |" for name, c in result["configs"].items()]
    lines += ["", *speed_table(result), "", *kv_table(result), "", machine_line(result["machine"])]
    for earlier in result.get("resumed") or []:
        lines.append(f"Cells measured earlier, kept: `{earlier['path']}` from `{earlier['command']}`;")
        lines.append(machine_line(earlier["machine"]))
    loads = [c["loadavg_1m_before_after"] for c in result["cells"] if "loadavg_1m_before_after" in c]
    if loads:
        flat = [x for pair in loads for x in pair]
        lines.append(f"1-min load average over the cells: {min(flat):.2f}..{max(flat):.2f}")
    lines.append(f"Command: `{result['command']}`")
    return "\n".join(lines)


def _series(result: dict[str, Any], config: str, side: str, value: Any) -> tuple[list[int], list[float], list[bool]]:
    """Contexts, values, and whether the machine ran more than two tasks a core during that cell
    (the mean of the 1-min load before and after it): tok/s measured so are circled."""
    cores = result["machine"].get("nproc") or 1
    xs, ys, busy = [], [], []
    for cell in result["cells"]:
        if cell["config"] == config and side in cell.get("sides", {}):
            xs.append(cell["context"])
            ys.append(value(cell["sides"][side]))
            load = cell.get("loadavg_1m_before_after") or [0.0]
            busy.append(sum(load) / len(load) > 2 * cores)
    return xs, ys, busy


PANELS = (
    ("mx peak memory (MB)", lambda s: s["peak_mb"]),
    ("KV cache stored (MB)", lambda s: s["kv"]["bytes"] / 1e6),
    ("decode tok/s (median)", lambda s: s["decode_tok_s"]["median"]),
    ("prefill tok/s (median)", lambda s: s["prefill_tok_s"]["median"]),
)


def plot_png(result: dict[str, Any]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 7.5), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2).flatten()
    colors = dict(
        zip(
            result["configs"],
            ("#0969da", "#1a7f37", "#8250df", "#bf8700", "#cf222e", "#57606a", "#e16f24"),
            strict=False,
        )
    )
    for ax, (title, value) in zip(axes, PANELS, strict=True):
        for config, meta in result["configs"].items():
            for side, style, marker in (("in-tree", "-", "o"), (meta["oracle"], "--", "x")):
                xs, ys, busy = _series(result, config, side, value)
                if xs:
                    label = f"{config} ({'in-tree' if side == 'in-tree' else side})"
                    ax.plot(xs, ys, style, marker=marker, markersize=4, color=colors.get(config), label=label)
                    loaded = [(x, y) for x, y, b in zip(xs, ys, busy, strict=True) if b]
                    if loaded and marker == "o":  # a busy machine's tok/s: circled, read with care
                        ax.plot(*zip(*loaded, strict=True), "o", markersize=9, mfc="none", color=colors.get(config))
        ax.set_title(title, fontsize=10)
        if title.startswith("KV cache"):
            ax.set_yscale("log")  # float and 4-bit caches differ by 6x, a bounded window by more
        ax.set_xlabel("context (tokens)")
        ax.set_xscale("log", base=2)
        contexts = sorted({c["context"] for c in result["cells"]})
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncols=2)
    fig.suptitle(
        f"{result['model']}: KV configurations, in-tree (solid, o) vs oracle (dashed, x); "
        "circled: 1-min load over twice the cores during that cell",
        fontsize=11,
    )
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
