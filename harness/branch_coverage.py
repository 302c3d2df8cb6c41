"""Branch coverage of the code the gates judge, recorded by the gates themselves (issue 53 part 1).

With `MLX_PARITY_COVERAGE=<folder>` set:
- every `python -m harness parity` process, and each of its pytest-xdist workers, records branch
  coverage of models/ (the in-tree implementations) into `<folder>/parity/` (the pytest plugin
  `harness.branch_coverage_plugin`, loaded first so that no model module is imported before);
- `make test`'s processes record branch coverage of the judges (AREAS["tests"]) and of models/
  into `<folder>/tests/` (the repository's conftest.py, before it imports the harness): the
  judges' figure, and which of models/' error paths the unit tests raise (ERROR_PATH).

`python -m harness coverage` merges each area over every process and profile that wrote into it,
takes out the branches `coverage-exempt.yaml` lists with a reason, prints a summary per file and
every branch not walked, and writes coverage.py's HTML report. The figures are docs/coverage.md.

An area is what a measurement means: models/ walked *by the gates* (parity runs of the
profiles' scenarios, never unit tests calling a model directly), and the judges walked by the
harness's own tests.
"""

from __future__ import annotations

import atexit
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.paths import REPO_ROOT

EXEMPT_FILE = REPO_ROOT / "coverage-exempt.yaml"
TARGET = 95.0  # percent of the branches (exempt ones taken out) each area must walk


@dataclass(frozen=True)
class Area:
    name: str
    what: str
    sources: tuple[str, ...]  # repository paths: folders or files
    also: tuple[str, ...] = ()  # recorded beside the sources, outside the area's figure


AREAS = {
    "parity": Area("parity", "models/ walked by the gates (python -m harness parity)", ("models",)),
    "tests": Area(
        "tests",
        "the judges walked by make test",
        (
            "harness/checks",
            "harness/coverage.py",
            "harness/records.py",
            "harness/records_schema.py",
            "harness/goldens",
            "harness/signoff/waivers.py",
            "harness/signoff/verdict.py",
        ),
        # make test's walk of models/: which error paths the unit tests raise (ERROR_PATH below)
        also=("models",),
    ),
}
# A branch of models/ into a `raise` that no gate walks but make test does is an error path
# tested by a unit test: the issue's own example of a branch that needs no scenario. It counts
# apart from the walked ones (`error paths tested`), only where make test's recording shows it.
ERROR_PATH = "raise"

_started: dict[str, Any] = {}


def folder() -> Path | None:
    from harness import settings

    return settings.read().coverage


def start(area: str) -> bool:
    """Record `area`'s branch coverage in this process until it exits (once per process);
    False when MLX_PARITY_COVERAGE is unset."""
    root = folder()
    if root is None or _started:  # one area a process: a parity run's conftest is not make test's
        return root is not None and area in _started
    import coverage

    spec = AREAS[area]
    out = Path(root).expanduser().resolve() / area
    out.mkdir(parents=True, exist_ok=True)
    cov = coverage.Coverage(
        data_file=str(out / ".coverage"),
        data_suffix=True,  # one file per process: .coverage.<host>.<pid>.<random>
        branch=True,
        config_file=False,
        **_selection(spec),
    )
    cov.start()
    _started[area] = cov

    def save() -> None:
        cov.stop()
        cov.save()

    atexit.register(save)
    return True


def _patterns(spec: Area, sources: tuple[str, ...] | None = None) -> list[str]:
    paths = spec.sources if sources is None else sources
    return [str(REPO_ROOT / s / "*") if (REPO_ROOT / s).is_dir() else str(REPO_ROOT / s) for s in paths]


def _selection(spec: Area) -> dict[str, list[str]]:
    """coverage.py's selection of an area: folders as `source` (a file never imported counts, at
    0 %), or, where the area names single files (which `source` cannot), `include` patterns."""
    if not spec.also and all((REPO_ROOT / s).is_dir() for s in spec.sources):
        return {"source": [str(REPO_ROOT / s) for s in spec.sources]}
    return {"include": _patterns(spec, spec.sources + spec.also)}


@dataclass
class FileFigures:
    path: str  # relative to the repository
    branches: int
    walked: int
    exempt: list[tuple[int, int]] = field(default_factory=list)
    missing: list[tuple[int, int]] = field(default_factory=list)  # not walked, not exempt
    error_tested: list[tuple[int, int]] = field(default_factory=list)  # ERROR_PATH branches make test walks
    tested: list[tuple[int, int]] = field(default_factory=list)  # of `missing`, those make test walks

    @property
    def judged(self) -> int:
        return self.branches - len(self.exempt) - len(self.error_tested)


@dataclass
class AreaFigures:
    area: Area
    files: list[FileFigures]
    processes: int
    stale_exemptions: list[str]

    @property
    def branches(self) -> int:
        return sum(f.judged for f in self.files)

    @property
    def walked(self) -> int:
        return sum(f.walked for f in self.files)

    @property
    def exempt(self) -> int:
        return sum(len(f.exempt) for f in self.files)

    @property
    def error_tested(self) -> int:
        return sum(len(f.error_tested) for f in self.files)

    @property
    def percent(self) -> float:
        return 100.0 * self.walked / self.branches if self.branches else 100.0


@dataclass(frozen=True)
class Exemption:
    file: str
    line: int
    reason: str


def load_exemptions(path: Path = EXEMPT_FILE) -> list[Exemption]:
    """coverage-exempt.yaml: a list of {file, line, reason}; every branch leaving `line` of
    `file` is taken out of the figures. Refused, naming the entry, when malformed."""
    import yaml

    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise HarnessError(f"{path.name}: unreadable: {e}") from None
    if not isinstance(data, list):
        raise HarnessError(f"{path.name}: expected a list of {{file, line, reason}} entries, got {type(data).__name__}")
    out = []
    for i, entry in enumerate(data, 1):
        where = f"{path.name} entry {i}"
        if not isinstance(entry, dict) or set(entry) != {"file", "line", "reason"}:
            raise HarnessError(f"{where}: expected exactly the keys file, line, reason, got {entry!r}")
        file, line, reason = entry["file"], entry["line"], entry["reason"]
        if not isinstance(file, str) or not (REPO_ROOT / file).is_file():
            raise HarnessError(f"{where}: file {file!r} is not a file of the repository")
        if not isinstance(line, int) or isinstance(line, bool) or line < 1:
            raise HarnessError(f"{where}: line must be a positive line number, got {line!r}")
        if not isinstance(reason, str) or len(reason.split()) < 3:
            raise HarnessError(f"{where} ({file}:{line}): a reason of a few words is required, got {reason!r}")
        out.append(Exemption(file, line, reason))
    return out


def tested_arcs(root: Path) -> dict[str, set[tuple[int, int]]] | None:
    """The branches of models/ make test's processes walked (the tests area's `also`), by file;
    None when make test recorded nothing into `root`."""
    import coverage

    pieces = sorted((root / "tests").glob(".coverage.*")) if (root / "tests").is_dir() else []
    if not pieces:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cov = coverage.Coverage(data_file=str(Path(tmp) / ".coverage"), branch=True, config_file=False)
        cov.combine([str(p) for p in pieces], keep=True)
        data = cov.get_data()
        out = {}
        for name in data.measured_files():
            path = Path(name).resolve()
            if path.is_relative_to(REPO_ROOT / "models"):
                out[path.relative_to(REPO_ROOT).as_posix()] = {tuple(a) for a in data.arcs(name) or ()}
        return out


def measure(
    area: str,
    root: Path,
    exemptions: list[Exemption],
    html: Path | None = None,
    tested: dict[str, set[tuple[int, int]]] | None = None,
) -> AreaFigures:
    """Merge `root/<area>`'s data files (kept) and judge them against the exemptions; with
    `tested` (make test's walk of models/), an unwalked branch into an error path make test
    walks counts apart, as tested."""
    import coverage

    spec = AREAS[area]
    data_dir = root / area
    pieces = sorted(data_dir.glob(".coverage.*")) if data_dir.is_dir() else []
    if not pieces:
        raise HarnessError(
            f"no coverage recorded for {area} ({spec.what}) in {data_dir}: run with MLX_PARITY_COVERAGE={root} first"
        )
    tested = tested or {}
    with tempfile.TemporaryDirectory() as tmp:
        cov = coverage.Coverage(
            data_file=str(Path(tmp) / ".coverage"),
            branch=True,
            config_file=False,
            **_selection(spec),
        )
        cov.combine([str(p) for p in pieces], keep=True)
        cov.load()
        report = Path(tmp) / "report.json"
        # Only this checkout's files: a process of another tree (a bisect step's worktree) that
        # kept the setting recorded its own copies, gone or not ours (ignore_errors: gone).
        ours = _patterns(spec)
        cov.json_report(outfile=str(report), include=ours, ignore_errors=True)
        if html is not None:
            cov.html_report(
                directory=str(html), title=f"branch coverage: {spec.what}", include=ours, ignore_errors=True
            )
        data = json.loads(report.read_text())
    by_line = {(e.file, e.line) for e in exemptions}
    used = set()
    files = []
    for name, figures in sorted(data["files"].items()):
        rel = Path(name).resolve().relative_to(REPO_ROOT).as_posix() if Path(name).is_absolute() else name
        missing_all = [tuple(b) for b in figures.get("missing_branches", [])]
        exempt = [b for b in missing_all if (rel, b[0]) in by_line]
        used |= {(rel, b[0]) for b in exempt}
        walked_by_tests = tested.get(rel, set())
        rest = [b for b in missing_all if b not in exempt]
        error_tested = [
            b for b in rest if b in walked_by_tests and b[1] > 0 and source_line(rel, b[1]).startswith(ERROR_PATH)
        ]
        missing = [b for b in rest if b not in error_tested]
        summary = figures["summary"]
        files.append(
            FileFigures(
                path=rel,
                branches=summary["num_branches"],
                walked=summary["covered_branches"],
                exempt=exempt,
                missing=missing,
                error_tested=error_tested,
                tested=[b for b in missing if b in walked_by_tests],
            )
        )
    stale = [
        f"{e.file}:{e.line} ({e.reason}): no branch of that line is left unwalked"
        for e in exemptions
        if (e.file, e.line) not in used and any(e.file.startswith(s) for s in spec.sources)
    ]
    return AreaFigures(spec, files, len(pieces), stale)


def source_line(path: str, line: int) -> str:
    try:
        return (REPO_ROOT / path).read_text(encoding="utf-8").splitlines()[line - 1].strip()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def render(figures: AreaFigures, listed: int = 400) -> str:
    """The terminal summary: per file, then every branch not walked (source line, where it goes)."""
    lines = [
        f"{figures.area.name}: {figures.area.what}: {figures.walked}/{figures.branches} branches walked "
        f"({figures.percent:.1f} %, target {TARGET:.0f} %), {figures.exempt} exempt, "
        + (f"{figures.error_tested} error paths tested by make test, " if figures.error_tested else "")
        + f"merged from {figures.processes} process(es)"
    ]
    for f in figures.files:
        if f.branches:
            pct = 100.0 * f.walked / f.judged if f.judged else 100.0
            tested = f"  error paths tested {len(f.error_tested)}" if f.error_tested else ""
            lines.append(f"  {f.path:48} {f.walked:5}/{f.judged:<5} {pct:5.1f} %  exempt {len(f.exempt)}{tested}")
    missing = [(f.path, b, b in f.tested) for f in figures.files for b in f.missing]
    if missing:
        lines.append(
            f"branches not walked ({len(missing)}; each needs a scenario, a test or a coverage-exempt.yaml entry):"
        )
        for path, (src, dst), by_tests in missing[:listed]:
            where = "exit" if dst < 0 else f"line {dst}"
            mark = " [make test walks it]" if by_tests else ""
            lines.append(f"  {path}:{src} -> {where}: {source_line(path, src)[:80]}{mark}")
        if len(missing) > listed:
            lines.append(f"  ... and {len(missing) - listed} more (the HTML report lists every one)")
    for s in figures.stale_exemptions:
        lines.append(f"stale exemption (remove it): {s}")
    return "\n".join(lines)


def run(args: Any) -> int:
    """`python -m harness coverage`: each area's figures from MLX_PARITY_COVERAGE's folder (or
    --data), the branches not walked, HTML under --html; exit 1 under --fail-under."""
    root = Path(args.data).expanduser().resolve() if args.data else folder()
    if root is None:
        raise HarnessError("no coverage folder: give --data DIR or set MLX_PARITY_COVERAGE (docs/coverage.md)")
    exemptions = load_exemptions()
    areas = args.area or list(AREAS)
    html = Path(args.html).expanduser().resolve() if args.html else None
    if html is not None and html.exists() and any(html.iterdir()):
        raise HarnessError(f"--html {html}: exists and is not empty; name a new folder (nothing is written over)")
    below, records = [], {}
    tested = tested_arcs(root) if "parity" in areas else None
    if "parity" in areas and tested is None:
        print("make test recorded nothing here: no error path of models/ is credited as tested")
    for i, area in enumerate(areas):
        figures = measure(area, root, exemptions, html / area if html is not None else None, tested)
        print(("\n" if i else "") + render(figures, listed=args.list))
        records[area] = {
            "area": area,
            "what": figures.area.what,
            "branches": figures.branches,
            "walked": figures.walked,
            "exempt": figures.exempt,
            "error_paths_tested": figures.error_tested,
            "percent": round(figures.percent, 2),
            "processes": figures.processes,
            "missing": [f"{f.path}:{a}->{b}" for f in figures.files for a, b in f.missing],
        }
        if args.fail_under is not None and figures.percent < args.fail_under:
            below.append(f"{area} {figures.percent:.1f} % < {args.fail_under} %")
    if args.json:
        from harness.fileio import atomic_write_json

        atomic_write_json(Path(args.json).expanduser().resolve(), records)
    if html is not None:
        print(f"HTML: {html}/<area>/index.html")
    if below:
        print(f"coverage below the bar: {'; '.join(below)}")
        return 1
    return 0


def read_figures(path: Path) -> dict[str, dict[str, Any]]:
    """A coverage.json written by `python -m harness coverage --json` (make coverage), checked:
    one line naming the file and the field when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HarnessError(f"coverage figures {path}: unreadable: {e}") from None
    if not isinstance(data, dict) or not data or set(data) - set(AREAS):
        raise HarnessError(f"coverage figures {path}: expected an object keyed by area ({', '.join(AREAS)})")
    for area, record in data.items():
        for key in ("branches", "walked", "exempt"):
            value = record.get(key) if isinstance(record, dict) else None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise HarnessError(f"coverage figures {path}: {area}.{key} must be a count, got {value!r}")
        if record["walked"] > record["branches"]:
            raise HarnessError(f"coverage figures {path}: {area}.walked exceeds {area}.branches")
    return data


def figures_line(data: dict[str, dict[str, Any]] | None) -> str:
    """The sign-off's one line of branch coverage (summary.md, the page)."""
    if not data:
        return "not measured for this sign-off (make coverage, then signoff --coverage FILE)"
    parts = []
    for area in AREAS:
        if area in data:
            r = data[area]
            pct = 100.0 * r["walked"] / r["branches"] if r["branches"] else 100.0
            tested = f"{r.get('error_paths_tested', 0)} error paths tested"
            counts = f"{r['walked']}/{r['branches']}, {r['exempt']} exempt, {tested}, target {TARGET:.0f} %"
            parts.append(f"{AREAS[area].what}: {pct:.1f} % ({counts})")
    return "; ".join(parts)
