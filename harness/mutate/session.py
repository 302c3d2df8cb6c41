"""One module's mutation run with cosmic-ray (docs/mutants.md): the tool in its own venv, the
repository copied where the tool may edit it, the unmutated run timed, every mutant judged.

cosmic-ray edits the module on disk, runs the target's judging command (harness/mutate/
targets.py) in a fresh process and puts the module back: a mutant is killed when the command
exits non-zero (a failed or crashed check, a failed test, a timeout). It works in a copy of
the working tree (tracked and untracked files, not ignored ones) under .cache/mutate/, never in
the repository. Its session (SQLite) is keyed by the sha256 of everything copied (but the
triage file, whose edits change no outcome), the commands and the tool's pins: an unchanged
tree resumes where an interrupted run stopped; any change starts a new session. The copy is
made afresh on every run (an interrupted run can leave a mutant applied), and a session the
database engine cannot read is discarded and begun again.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.artifacts.files import sha256_file
from harness.errors import HarnessError
from harness.mutate.targets import Target
from harness.paths import cache_root, shown

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
# Operators left out: a binary operator swapped for a power, shift, bitwise or modulo one, or a
# comparison for an identity test, is a crash or an obvious type error on this code (numbers and
# arrays); the kept set (arithmetic and comparison swaps, numbers +-1, negated conditions, removed
# decorators, break/continue, zero-iteration loops, boolean swaps) is what a one-line slip writes.
EXCLUDED_OPERATORS = (
    r"core/ReplaceBinaryOperator_.*_(Pow|BitOr|BitAnd|BitXor|LShift|RShift|Mod|FloorDiv)$",
    r"core/ReplaceBinaryOperator_(Pow|BitOr|BitAnd|BitXor|LShift|RShift)_.*$",
    r"core/ReplaceComparisonOperator_.*_(Is|IsNot)$",
)
MIN_TIMEOUT_S = 120.0
TIMEOUT_FACTOR = 4.0


class MutateError(HarnessError):
    """The tool, the copy or the unmutated run failed: nothing about the mutants is known."""


def _run(argv: list[str], what: str, cwd: Path | None = None, timeout: float | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MutateError(f"{what}: {e}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise MutateError(f"{what}: exit {done.returncode}\n{tail}")
    return done.stdout


def tool_venv() -> Path:
    """cosmic-ray's venv, built from REQUIREMENTS on first use (.cache/tools/cosmic-ray-<pins>/)."""
    pins = sha256_file(REQUIREMENTS)
    venv = cache_root() / "tools" / f"cosmic-ray-{pins[:16]}"
    marker = venv / "pins.sha256"
    if marker.is_file() and marker.read_text().strip() == pins and (venv / "bin" / "cosmic-ray").is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    print(f"mutate: building the cosmic-ray venv {shown(venv)} ...", flush=True)
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], "pip install")
    marker.write_text(pins + "\n")
    return venv


def tree_files(root: Path) -> list[str]:
    """The working tree's files (tracked and untracked, not ignored), repo-relative."""
    out = _run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"], f"git ls-files in {root}")
    return sorted(p for p in out.split("\0") if p and (root / p).is_file())


def judging_command(target: Target) -> str:
    """The command cosmic-ray runs per mutant: the target's runs against the real cache, the
    failing module never localized (a kill needs a failure, not its diagnosis)."""
    env = ["env", f"MLX_PARITY_CACHE={cache_root()}", "MLX_PARITY_LOCALIZE=0", "PYTHONDONTWRITEBYTECODE=1"]
    runs = " && ".join(shlex.join(c) for c in target.commands(sys.executable))
    return shlex.join([*env, "sh", "-c", runs])


@dataclass
class Session:
    target: Target
    root: Path  # the repository whose working tree is mutated (a copy of it)
    sessions: Path | None = None  # where sessions live (default .cache/mutate/)
    unhashed: tuple[str, ...] = ()  # copied but not keyed: mutation.yaml (its triage changes no outcome)
    folder: Path = Path()
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.files = tuple(tree_files(self.root))
        if self.target.module not in self.files:
            raise MutateError(f"{self.target.module}: not a file of the working tree of {self.root}")
        digest = hashlib.sha256()
        for name in self.files:
            if name not in self.unhashed:
                digest.update(f"{name}\0{sha256_file(self.root / name)}\n".encode())
        digest.update(judging_command(self.target).encode() + sha256_file(REQUIREMENTS).encode())
        digest.update("\n".join(EXCLUDED_OPERATORS).encode())
        self.folder = (self.sessions or cache_root() / "mutate") / self.target.slug / digest.hexdigest()[:16]

    @property
    def tree(self) -> Path:
        return self.folder / "tree"

    @property
    def database(self) -> Path:
        return self.folder / "session.sqlite"

    def copy(self) -> None:
        shutil.rmtree(self.tree, ignore_errors=True)
        for name in self.files:
            (self.tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / name, self.tree / name)

    def config(self, timeout: float) -> Path:
        path = self.folder / "cosmic-ray.toml"
        excluded = ",\n  ".join(json.dumps(e) for e in EXCLUDED_OPERATORS)
        path.write_text(
            "[cosmic-ray]\n"
            f"module-path = {json.dumps(self.target.module)}\n"
            f"timeout = {timeout:.1f}\n"
            "excluded-modules = []\n"
            f"test-command = {json.dumps(judging_command(self.target))}\n\n"
            '[cosmic-ray.distributor]\nname = "local"\n\n'
            f"[cosmic-ray.filters.operators-filter]\nexclude-operators = [\n  {excluded},\n]\n"
        )
        return path

    def baseline(self) -> float:
        """The unmutated run's seconds (recorded once per session); it must pass."""
        path = self.folder / "baseline.json"
        if path.is_file():
            try:
                return float(json.loads(path.read_text())["seconds"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink()
        start = time.perf_counter()
        argv = shlex.split(judging_command(self.target))
        try:
            _run(argv, f"the unmutated run of {self.target.module} ({' '.join(argv[5:])})", cwd=self.tree)
        except MutateError as e:
            raise MutateError(f"{e}\nthe unmutated run must pass before mutants can be judged") from None
        seconds = time.perf_counter() - start
        path.write_text(json.dumps({"seconds": round(seconds, 2)}) + "\n")
        return seconds

    def _readable(self) -> bool:
        try:
            with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True) as db:
                return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        except sqlite3.Error:
            return False

    def run(self) -> list[tuple[dict, dict | None]]:
        """Every mutant of the module with its result (None: not run), after running the
        pending ones; (job, result) as `cosmic-ray dump` writes them."""
        venv = tool_venv()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.copy()
        seconds = self.baseline()
        timeout = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * seconds)
        config = self.config(timeout)
        tool = venv / "bin"
        if self.database.exists() and not self._readable():
            print(f"mutate: {shown(self.database)}: unreadable session, begun again", flush=True)
            self.database.unlink()
        if not self.database.exists():
            partial = self.database.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            _run([str(tool / "cosmic-ray"), "init", str(config), str(partial)], "cosmic-ray init", cwd=self.tree)
            _run([str(tool / "cr-filter-operators"), str(partial), str(config)], "cr-filter-operators", cwd=self.tree)
            partial.rename(self.database)
        jobs = self.dump(tool)
        pending = sum(1 for _, result in jobs if result is None)
        print(
            f"mutate {self.target.module}: {len(jobs)} mutants, {pending} to run; the unmutated run "
            f"{seconds:.0f} s, timeout {timeout:.0f} s; session {shown(self.folder)}",
            flush=True,
        )
        if pending:
            _run([str(tool / "cosmic-ray"), "exec", str(config), str(self.database)], "cosmic-ray exec", cwd=self.tree)
        return self.dump(tool)

    def dump(self, tool: Path) -> list[tuple[dict, dict | None]]:
        out = _run([str(tool / "cosmic-ray"), "dump", str(self.database)], "cosmic-ray dump", cwd=self.tree)
        return [tuple(json.loads(line)) for line in out.splitlines() if line.strip()]
