"""The end of a parity run on the terminal: one screen a model engineer can act on.

Rendered from the JSON report alone (its results, context and timing), so a report kept as a
fixture renders exactly what the run printed (tests/test_screen.py; docs/screens/). In order:

1. every non-passing check: the first of each cause (its first diverging module, else its check
   or error) as a few labelled lines (what differs, where, by how much against the logit range,
   the first diverging module, both top-5s, KL and top-1 agreement at that step, the command
   that reruns exactly that check), the others one line per cause, counted by check;
2. a scenario x check matrix per model (at most MATRIX_ROWS rows, the failing scenarios first in
   line; the rest fold into a line);
3. notes: which scenario walked each declared path, what this backend does not run, what -x
   left unrun, the time to verdict, the report's path;
4. the verdict, last.
"""

from __future__ import annotations

import math
import shlex
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.history.regress import lines as regression_lines

FULL_BLOCKS = 2  # non-passing checks shown in full: the first of each cause (harness/screen.py cause)
SHORT_LINES = 10  # then one line per cause for the rest
MATRIX_ROWS = 16  # scenario rows per model; beyond them, the passing ones (then any) fold into a line
MARK = {"passed": "✓", "failed": "F", "error": "E"}
NON_FINITE = ("NaN", "Infinity", "-Infinity")  # a non-finite float as a report writes it (harness/report.py)


@dataclass(frozen=True)
class Line:
    text: str
    style: str | None = None  # "red", "green", "yellow", "bold" (pytest's terminal writer markup)


def rerun_command(model: str, scenario: str, check: str) -> str:
    """The make command that reruns exactly this check (`--scenario`/`--check` become its node id)."""
    words = [f"MODEL={model}", f"SCENARIO={scenario}", f"CHECK={check}"]
    return "make parity " + " ".join(shlex.quote(w) for w in words)


def _number(value: Any) -> float | None:
    """A report's number as a float: a JSON number, or the string a report writes a non-finite
    float as ("NaN", "Infinity", "-Infinity"); None for anything else (a missing KL is null)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return float(value) if isinstance(value, str) and value in NON_FINITE else None


def _finite(value: Any) -> bool:
    number = _number(value)
    return number is not None and math.isfinite(number)


def _g(value: Any, spec: str = ".3g") -> str:
    """A report's number for the screen: a non-finite one spelled as the report spells it."""
    number = _number(value)
    if number is not None and not math.isfinite(number):
        return "NaN" if math.isnan(number) else "Infinity" if number > 0 else "-Infinity"
    return f"{value:{spec}}" if isinstance(value, float) else str(value)


def _value(value: Any) -> str:
    """A logit as the report holds it: a float in full (repr), a non-finite one by its name."""
    return _g(value) if _number(value) is not None and not _finite(value) else repr(value)


def _top(top: Iterable[Any]) -> str:
    return " ".join(f"{int(i)}:{_g(float(v) if _finite(v) else v, '.4g')}" for i, v in top)


def _vector_diff(row: dict[str, Any]) -> dict[str, Any] | None:
    details = row.get("details") or {}
    diff = details.get("first_step_diff") or details.get("first_diff")
    return diff if isinstance(diff, dict) and "n_differing" in diff else None


def _step_stats(row: dict[str, Any]) -> dict[str, Any] | None:
    step = row.get("first_bad_step")
    for entry in (row.get("details") or {}).get("per_step", []):
        if entry.get("step") == step and "kl" in entry:
            return entry
    return None


def _module(row: dict[str, Any]) -> str | None:
    where = (row.get("details") or {}).get("localization")
    if not isinstance(where, dict):
        return None
    if where.get("module") is None:
        return f"none: all {where.get('modules_compared')} module outputs agree (outside the model graph)"
    stats = [f"{where['n_differing']}/{where['n_elements']} differ"] if "n_differing" in where else []
    stats += [f"max ULP {where['max_ulp']}"] if "max_ulp" in where else []
    if where.get("row") is not None and where["row"] != row.get("first_bad_step"):
        stats.append(f"at step {where['row']}, the scenario's earliest")
    return f"{where['module']}" + (f" ({', '.join(stats)})" if stats else "")


def _labelled(label: str, text: str, width: int, max_lines: int = 4) -> list[str]:
    head = f"  {label:<8} "
    wrapped = textwrap.wrap(text, width - len(head), break_on_hyphens=False) or [""]
    if len(wrapped) > max_lines:
        wrapped = wrapped[: max_lines - 1] + [wrapped[max_lines - 1][: width - len(head) - 24] + " … (in the report)"]
    return [head + wrapped[0]] + [" " * len(head) + w for w in wrapped[1:]]


def _summary_text(row: dict[str, Any]) -> str:
    """The summary without what the block shows on its own lines (the module)."""
    return str(row.get("summary", "")).split("; first diverging module:")[0]


def failure_block(row: dict[str, Any], width: int) -> list[Line]:
    outcome = "FAIL" if row["outcome"] == "failed" else "ERROR"
    head = f"{outcome} {row['model']}/{row['scenario']} {row['check']} · {row['tier']} vs {row['oracle']}"
    lines = [Line(head, "red" if outcome == "FAIL" else "yellow")]
    text: list[str] = []
    diff = _vector_diff(row)
    logits = "first_step_diff" in (row.get("details") or {})  # per-step logits rows, not one tensor
    if diff is not None and not diff.get("shape_mismatch"):
        details = row.get("details") or {}
        step = row.get("first_bad_step")
        where = f"step {step}{details.get('row_label', '')}" if step is not None else "the tensor"
        counted = details.get("steps_differing"), details.get("steps_compared")
        steps = f" ({counted[0]}/{counted[1]} steps differ)" if all(c is not None for c in counted) else ""
        text += _labelled("differs", f"{where}{steps}: {diff['n_differing']}/{diff['n_elements']} elements", width)
        biggest, scale = diff.get("max_abs_diff"), _number(diff.get("expected_range"))
        values = "logit" if logits else "value"  # a log-mel or encoder output has values, not logits
        if not _finite(biggest):  # NaN or ±Infinity on a side: no distance to set against the range
            of_range = f" (non-finite {values}s)"
        elif scale and math.isfinite(scale):
            of_range = f" ({_g(_number(biggest) / scale)} of the {values} range {_g(scale)})"
        else:
            of_range = ""
        text += _labelled("by", f"max |Δ| {_g(biggest)}{of_range}, max ULP {diff['max_ulp']}", width)
        first = (diff["expected_value"], diff["actual_value"])
        odd = " (non-finite)" if not all(_finite(v) for v in first) else ""
        text += _labelled(
            "first",
            f"index {diff['first_index']}: oracle {_value(first[0])} vs in-tree {_value(first[1])}{odd}",
            width,
        )
    else:  # a message of its own: one line (the terminal wraps it; a search finds it whole)
        text.append(f"  {'detail':<8} {_summary_text(row)}")
    module = _module(row)
    if module is not None:
        text += _labelled("module", module, width)
    if diff is not None and logits and diff.get("expected_top5"):
        text += _labelled("oracle", "top-5 " + _top(diff["expected_top5"]), width, max_lines=2)
        text += _labelled("in-tree", "top-5 " + _top(diff["actual_top5"]), width, max_lines=2)
    stats = _step_stats(row)
    if stats is not None:
        agree = "agrees" if stats.get("top1") else "differs"
        kl = _g(stats["kl"]) if _number(stats["kl"]) is not None else "none (no logit finite on both sides)"
        text += _labelled("at step", f"KL(oracle‖in-tree) {kl}, top-1 {agree}", width)
    note = (row.get("details") or {}).get("machine_note")
    if note:
        text.append(f"  {'note':<8} {note}")
    if outcome == "ERROR":
        text += _labelled("trace", "a crash's traceback: add ARGS=--tb=short to the rerun", width)
    command = rerun_command(row["model"], row["scenario"], row["check"])  # never wrapped: it is pasted
    fits = len(command) + 11 <= width
    text += [f"  {'rerun':<8} {command}"] if fits else ["  rerun exactly this check:", f"    {command}"]
    return lines + [Line(t) for t in text]


def failure_line(row: dict[str, Any], width: int, one_model: bool = False) -> Line:
    """One line: where it failed and its first diverging module (else its max ULP, else its summary)."""
    outcome = "FAIL" if row["outcome"] == "failed" else "ERROR"
    model = "" if one_model else f"{row['model']}/"
    head = f"{outcome} {model}{row['scenario']}/{row['check']}: "
    diff, module = _vector_diff(row), (row.get("details") or {}).get("localization")
    if diff is not None and row.get("first_bad_step") is not None and not diff.get("shape_mismatch"):
        found = module.get("module") or "no module differs" if isinstance(module, dict) else None
        text = f"step {row['first_bad_step']}, {found or 'max ULP ' + str(diff['max_ulp'])}"
    else:
        text = _summary_text(row)
    text = head + text
    return Line(_cut(text, width), "red" if outcome == "FAIL" else "yellow")


def cause(row: dict[str, Any]) -> str:
    """What a non-passing check's failure comes down to, for grouping: its first diverging
    module, else (not localized) its check, or an error's message."""
    where = (row.get("details") or {}).get("localization")
    if isinstance(where, dict):
        return f"first diverging module {where['module']}" if where.get("module") else "no module differs"
    if row["outcome"] == "error":
        return f"error: {_summary_text(row)[:60]}"
    return f"{row['check']} fails"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def failures(results: list[dict[str, Any]], width: int) -> list[Line]:
    """The first non-passing check of each cause in full (up to FULL_BLOCKS), then one line per
    cause for the rest, counted by check."""
    bad = [r for r in results if r["outcome"] != "passed"]
    if not bad:
        return []
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in bad:  # in run order
        groups.setdefault(cause(r), []).append(r)
    full = [rows[0] for rows in list(groups.values())[:FULL_BLOCKS]]
    out: list[Line] = []
    for r in full:
        out += failure_block(r, width) + [Line("")]
    one_model = len({r["model"] for r in results}) == 1
    lines: list[Line] = []
    for why, rows in groups.items():
        rest = [r for r in rows if not any(r is f for f in full)]
        if len(rest) == 1:
            lines.append(failure_line(rest[0], width, one_model))
        elif rest:
            word = "FAIL" if all(r["outcome"] == "failed" for r in rest) else "ERROR"
            scenarios = f"{len({(r['model'], r['scenario']) for r in rest})} scenarios"
            counts: dict[str, int] = {}
            for r in rest:
                counts[r["check"]] = counts.get(r["check"], 0) + 1
            checks = ", ".join(f"{c} x{n}" for c, n in counts.items())
            if why.startswith("first diverging module"):
                text = f"{word} {len(rest)} more, {why}, in {scenarios}: {checks}"
            elif why.startswith("error: "):
                text = f"{word} {len(rest)} more, in {scenarios}: {why[7:]} ({checks})"
            else:
                text = f"{word} {len(rest)} more {rest[0]['check']} ({scenarios}; not localized)"
            style = "red" if word == "FAIL" else "yellow"
            lines += [Line(t, style) for t in textwrap.wrap(text, width, subsequent_indent="  ")]
    out += lines[:SHORT_LINES]
    if len(lines) > SHORT_LINES:
        out.append(Line(f"… and {len(lines) - SHORT_LINES} more causes: the report lists every check"))
    if lines:
        out.append(Line(""))
    return out


def matrix(results: list[dict[str, Any]], width: int) -> list[Line]:
    """Per model: one row per scenario, one column per check (numbered; the legend follows)."""
    out: list[Line] = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == model]
        checks = list(dict.fromkeys(r["check"] for r in rows))
        scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
        cells = {(r["scenario"], r["check"]): r for r in rows}
        name_width = min(max(len(s) for s in scenarios), max(12, width - 6 - 3 * len(checks)))
        title = f"{model}: {len(scenarios)} scenarios x {len(checks)} checks"
        out.append(Line(f"{title}   ✓ pass  F fail  E error  · not planned", "bold"))
        out.append(Line(" " * (name_width + 4) + "".join(f"{n:>3}" for n in range(1, len(checks) + 1))))
        not_passing = {r["scenario"] for r in rows if r["outcome"] != "passed"}
        failing = [s for s in scenarios if s in not_passing]
        shown = set(failing[:MATRIX_ROWS])
        shown |= set([s for s in scenarios if s not in shown][: MATRIX_ROWS - len(shown)])
        for scenario in (s for s in scenarios if s in shown):
            marks, tier, bad = [], "", False
            for check in checks:
                cell = cells.get((scenario, check))
                marks.append(MARK.get(cell["outcome"], "?") if cell else "·")
                tier = cell["tier"] if cell else tier
                bad |= bool(cell) and cell["outcome"] != "passed"
            name = scenario if len(scenario) <= name_width else scenario[: name_width - 1] + "…"
            text = f"{name:<{name_width}} {tier:<3}" + "".join(f"{m:>3}" for m in marks)
            out.append(Line(text, "red" if bad else None))
        out += _folded([s for s in scenarios if s not in shown], not_passing, width)
        out += [Line(t) for t in _legend([f"{n} {c}" for n, c in enumerate(checks, 1)], width)]
        out.append(Line(""))
    return out


def _folded(hidden: list[str], failing: set[str], width: int) -> list[Line]:
    """The scenario rows past MATRIX_ROWS, one line each for the passing and the failing ones."""
    out = []
    for bad, what in ((False, "every planned check passed"), (True, "a check did not pass")):
        names = [s for s in hidden if (s in failing) == bad]
        if names:
            text = _cut(f"+ {len(names)} more scenarios where {what}: {', '.join(names)}", 2 * width - 1)
            out.append(Line(text, "red" if bad else None))
    return out


def _legend(entries: list[str], width: int) -> list[str]:
    """Entries two spaces apart, lines broken between entries only."""
    lines = [""]
    for entry in entries:
        if lines[-1] and len(lines[-1]) + 2 + len(entry) > width:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + entry
    return lines


def timing_line(timing: dict[str, Any]) -> str:
    total = timing.get("total_seconds")
    total = total if _finite(total) and total else 1.0
    phases = [p for p in timing.get("phases", []) if _finite(p.get("seconds"))]
    phases = sorted(phases, key=lambda p: -p["seconds"])[:3]
    parts = ", ".join(f"{p['phase']} {100 * p['seconds'] / total:.0f} %" for p in phases)
    wall = timing.get("wall_seconds", 0.0)
    wall = f"{wall:.1f}" if _finite(wall) else _g(wall)
    return f"time to verdict: {wall} s wall ({parts}; -v for every phase)"


def device_notes(device: dict[str, Any]) -> list[str]:
    """The device a run was asked for (MLX_PARITY_DEVICE), and the GPU it passed over."""
    if not device.get("requested"):
        return []
    text = f"device: {device.get('backend')} (MLX_PARITY_DEVICE={device['requested']}), golden key {device.get('key')}"
    if device.get("passed_over"):
        text += f"; not on this machine's GPU, {device['passed_over']}"
    return [text]


def notes(report: dict[str, Any], width: int, where: str | None) -> list[Line]:
    context = report.get("context", {})
    texts = list(context.get("coverage", []))
    if context.get("scoped_out"):
        backend = context.get("device", {}).get("backend", "this")
        texts.append(f"not run on the {backend} backend (scenario backends): {', '.join(context['scoped_out'])}")
    backend = context.get("device", {}).get("backend", "?")
    texts += [
        f"{m}: not run on this backend ({backend}): no scenario of it runs here"
        for m in context.get("not_run_here", [])
    ]
    if context.get("not_run"):
        names = ["/".join(n.split("@")[0].split("::")[1:]) for n in context["not_run"]]
        more = f", … (+{len(names) - 4}; the report lists every one)" if len(names) > 4 else ""
        texts.append(
            f"not run, the run stopped early (-x / --maxfail): {len(names)} checks: {', '.join(names[:4])}{more}"
        )
    texts += device_notes(context.get("device", {})) + list(context.get("notes", []))
    out = [Line(t) for t in texts]  # whole lines: the terminal wraps them, a search finds them
    out += [Line(text, style) for text, style in regression_lines(report.get("regressions", []))]
    if "timing" in report:
        out.append(Line(timing_line(report["timing"])))
    for line in (where or "").splitlines():
        out.append(Line(line, "red" if line.startswith("error") else None))
    return out


def verdict_line(report: dict[str, Any]) -> Line:
    counts, verdict = report.get("counts", {}), report.get("verdict", "?")
    total = sum(counts.values())
    models = ", ".join(report.get("context", {}).get("models", [])) or "no model"
    seconds = report.get("timing", {}).get("wall_seconds")
    took = f" in {seconds:.0f} s" if _finite(seconds) else ""
    if verdict == "PASS":
        return Line(f"PASS {models}: all {total} checks passed{took}", "green")
    if verdict == "FAIL":
        parts = [f"{counts['failed']} failed"] if counts.get("failed") else []
        parts += [f"{counts['error']} error{'s' if counts['error'] > 1 else ''}"] if counts.get("error") else []
        return Line(f"FAIL {models}: {', '.join(parts)}, {counts.get('passed', 0)} passed of {total}{took}", "red")
    return Line(f"{verdict} {models}", "yellow")


def render(report: dict[str, Any], width: int = 80, where: str | None = None) -> list[Line]:
    """The whole end-of-run screen for a report; `where` is the line naming the report's file(s)."""
    results = report.get("results", [])
    return failures(results, width) + matrix(results, width) + notes(report, width, where) + [verdict_line(report)]


def shown_path(path: Path) -> str:
    """A path as the user can paste it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
