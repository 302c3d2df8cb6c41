"""`python -m harness matrix REPORT_OR_DB...`: which check holds on which device, from many machines.

Each input is a parity report (`.json`, or `.json.gz`) or a results store (`.sqlite`, its
newest run per device key); CI artifacts of the Linux job, the macOS nightly and a GPU run are
merged into one page (`index.html`, self-contained) and one Markdown table (`matrix.md`, for a
job summary): a row per model/scenario/check, a column per device key with the newest result
there, the golden key's parts per column, and each failure linked to its entry below. Results
of different harness versions are refused, naming them, unless `--mixed-versions` (then the
page and the table say so). No server: merging files is how several machines scale out.
A report is read by harness/report.py `read_report` (the sign-off's reader too): a malformed one
is refused naming the file and the field, before anything is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.markdown import md_code, md_text
from harness.report import read_report

MARK = {"passed": "✓", "failed": "FAIL", "error": "ERROR"}


@dataclass
class Cell:
    outcome: str
    summary: str
    step: int | None
    module: str | None
    source: str
    finished: str
    anchor: str = ""


@dataclass
class Matrix:
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> the golden key's parts
    cells: dict[tuple[str, str, str], dict[str, Cell]] = field(default_factory=dict)
    versions: dict[str, list[str]] = field(default_factory=dict)  # harness version -> sources
    sources: list[str] = field(default_factory=list)

    def add(self, device: dict[str, Any], rows: list[dict[str, Any]], source: str, finished: str, version: str) -> None:
        key = str(device.get("key") or "unknown device")
        self.devices.setdefault(key, {k: v for k, v in device.items() if k not in ("os_version",)})
        self.versions.setdefault(version, []).append(source)
        self.sources.append(source)
        for r in rows:
            details = r.get("details") or {}
            where = details.get("localization") if isinstance(details.get("localization"), dict) else {}
            step, module = r.get("first_bad_step"), where.get("module")
            summary = r.get("summary") if isinstance(r.get("summary"), str) else ""  # a store's row may hold NULL
            cell = Cell(r["outcome"], summary, step, module, source, finished)
            place = self.cells.setdefault((r["model"], r["scenario"], r["check"]), {})
            if key not in place or place[key].finished <= finished:  # the newest result on that device
                place[key] = cell

    def failures(self) -> list[tuple[tuple[str, str, str], str, Cell]]:
        out = []
        for row, by_device in sorted(self.cells.items()):
            for device, cell in by_device.items():
                if cell.outcome != "passed":
                    cell.anchor = f"f{len(out) + 1}"
                    out.append((row, device, cell))
        return out


def load(paths: list[Path]) -> Matrix:
    from harness.history.store import connect

    matrix = Matrix()
    for path in paths:
        if not path.exists():
            raise HarnessError(f"{path}: no such report or results store")
        if path.suffix in (".sqlite", ".db"):
            with connect(path, write=False) as conn:
                runs = conn.execute(
                    "SELECT id, finished, device_key, versions, harness_version FROM runs "
                    "WHERE kind = 'parity' ORDER BY id"
                ).fetchall()
                for run_id, finished, key, versions, version in runs:
                    rows = conn.execute(
                        "SELECT model, scenario, check_name, outcome, summary, first_bad_step, module "
                        "FROM results WHERE run_id = ?",
                        (run_id,),
                    ).fetchall()
                    results = [
                        {"model": m, "scenario": s, "check": c, "outcome": o, "summary": t, "first_bad_step": b}
                        | ({"details": {"localization": {"module": mod}}} if mod else {})
                        for m, s, c, o, t, b, mod in rows
                    ]
                    device = {"key": key} | json.loads(versions or "{}")
                    matrix.add(device, results, f"{path.name} run {run_id}", finished or "", version or "?")
            continue
        report = read_report(path)
        device = report["context"].get("device")
        if not isinstance(device, dict):  # what a matrix is made of: which device a result holds on
            raise HarnessError(f"{path}: context.device: expected an object (the device the run was on), missing")
        finished = report.get("finished") or ""
        matrix.add(device, report["results"], path.name, finished, str(report.get("harness_version")))
    return matrix


def markdown(m: Matrix, failures: list) -> str:
    devices = list(m.devices)
    lines = ["# Device matrix", ""]
    if len(m.versions) > 1:
        lines += [f"**Mixed harness versions**: {', '.join(sorted(m.versions))} (merged with --mixed-versions).", ""]
    lines += ["| device key | backend | BLAS | mlx | processor | os |", "|---|---|---|---|---|---|"]
    for key, parts in m.devices.items():
        cols = [parts.get(k, "") for k in ("backend", "blas", "mlx", "processor", "os")]
        lines.append(f"| {md_code(key)} | " + " | ".join(md_text(c) for c in cols) + " |")
    lines += ["", "| model / scenario / check | " + " | ".join(md_code(d) for d in devices) + " |"]
    lines.append("|---|" + "---|" * len(devices))
    for (model, scenario, check), by_device in sorted(m.cells.items()):
        cells = []
        for d in devices:
            cell = by_device.get(d)
            if cell is None:
                cells.append("—")
            elif cell.outcome == "passed":
                cells.append("✓")
            else:
                cells.append(f"[{MARK.get(cell.outcome) or md_text(cell.outcome)}](#{cell.anchor})")
        lines.append(f"| {md_text(model)} / {md_text(scenario)} / {md_text(check)} | " + " | ".join(cells) + " |")
    if failures:
        lines += ["", "## Failures", ""]
        for (model, scenario, check), device, cell in failures:
            where = f" step {cell.step}" if cell.step is not None else ""
            where += f", first diverging module {md_code(cell.module)}" if cell.module else ""
            head = f"**{md_text(f'{model}/{scenario}/{check}')}** on {md_code(device)}{where} ({md_text(cell.source)})"
            lines.append(f'<a id="{cell.anchor}"></a>{head}')
            lines.append(f"> {md_text(cell.summary[:400])}")
            lines.append("")
    lines += ["", f"Sources: {md_text(', '.join(m.sources))}"]
    return "\n".join(lines) + "\n"


def page(m: Matrix, failures: list) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness.history", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    rows = [(row, [by_device.get(d) for d in m.devices]) for row, by_device in sorted(m.cells.items())]
    return env.get_template("matrix.html.j2").render(m=m, rows=rows, failures=failures, mark=MARK)


def run(args: argparse.Namespace) -> int:
    from harness.fileio import atomic_write_bytes
    from harness.paths import reports_dir

    matrix = load([Path(p) for p in args.inputs])
    if len(matrix.versions) > 1 and not args.mixed_versions:
        named = "; ".join(f"{v}: {', '.join(s)}" for v, s in sorted(matrix.versions.items()))
        raise HarnessError(f"the inputs come from different harness versions ({named}): pass --mixed-versions to merge")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else reports_dir() / f"matrix-{stamp}"
    if out.exists() and not out.is_dir():
        raise HarnessError(f"--out {out}: a file, not a folder: name a new folder for the matrix's two files")
    if out.exists() and any(out.iterdir()):
        raise HarnessError(f"{out} exists and is not empty: a matrix is never written over another")
    failures = matrix.failures()
    files = {"matrix.md": markdown(matrix, failures).encode(), "index.html": page(matrix, failures).encode()}
    try:
        for name, data in files.items():
            atomic_write_bytes(out / name, data)
    except OSError as e:
        raise HarnessError(f"--out {out}: cannot write the matrix there: {e.strerror or e}") from e
    print(f"device matrix: {len(matrix.cells)} checks x {len(matrix.devices)} devices, {len(failures)} not passing")
    print(f"  {out / 'index.html'}\n  {out / 'matrix.md'}")
    return 0
