"""Implementations under test in their own process (docs/protocol.md), on the oracle seam's side:
their venvs, built from a profile's requirements like an oracle's from its pins, and the process
itself (start it, a line in, a line out within a timeout and a length cap, stderr kept to a file
whose end is quoted, killed with its process group when done). What the lines mean is
harness/runners/process.py's."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from harness import settings
from harness.errors import OracleVersionError, ProfileError
from harness.fileio import atomic_write_bytes
from harness.implementations import Plugin
from harness.oracle.installed import VERIFIED
from harness.oracle.pins import parse_requirements, pinned_mlx, pins_hash, project_mlx
from harness.oracle.process import start_process
from harness.oracle.streams import LineTooLong, file_tail, read_line
from harness.oracle.venvs import OracleEnv, Pins, ensure_built
from harness.paths import REPO_ROOT, cache_root
from harness.timing import clock

HOST = REPO_ROOT / "plugins" / "host.py"  # runs inside the plugin venv: imports nothing of ours


KILL_WAIT_S = 10.0  # for its process to be reaped once SIGKILL is sent (then it is given up on)
READER_WAIT_S = 2.0  # for the thread reading its stdout to see the end once its group is killed


class Timeout(Exception):
    """No line came within the time given."""


class LineProcess:
    """A started implementation: JSON lines to its stdin, lines from its stdout, stderr to a file.

    It leads a process group of its own: `kill` (on a timeout, and in `close`) sends SIGKILL to the
    whole group, so a child it started that holds its stdout (or anything else) goes with it. No
    call waits without a time limit: `close` never waits on the thread reading its stdout, which
    ends by itself when the last holder of the pipe is gone."""

    def __init__(self, cmd: list[str], env: dict[str, str], work: Path):
        self.stderr_path = work / "stderr.log"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - open for the process's life
        self._proc = start_process(cmd, env, work, stdin=subprocess.PIPE, stderr=self._stderr, new_session=True)
        self._lines: queue.Queue[str | LineTooLong | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Its stdout, line by line (each at most LINE_BYTES: a longer one is handed on as
        LineTooLong, and reading stops), until the end; only this thread touches (and closes) it:
        a close from another thread would wait on this thread's read (the lock of the stream)."""
        stdout = self._proc.stdout
        assert stdout is not None
        try:
            while line := read_line(stdout.buffer):
                self._lines.put(line.decode(errors="replace"))
        except LineTooLong as e:
            self._lines.put(e)
        except (OSError, ValueError):
            pass
        finally:
            self._lines.put(None)
            with contextlib.suppress(OSError):
                stdout.close()

    def send(self, line: str) -> bool:
        """False when its stdin is closed (it has exited)."""
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def receive(self, timeout: float) -> str | None:
        """Its next line; None once its stdout has closed; Timeout after `timeout` seconds;
        LineTooLong for a line over LINE_BYTES."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise Timeout from None
        if isinstance(line, LineTooLong):
            raise line
        return line

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout)

    def stderr_tail(self) -> str:
        """The end of its stderr, as much as an error quotes (harness/oracle/streams.py)."""
        return file_tail(self.stderr_path)

    def kill(self) -> None:
        """SIGKILL to its process group (it, and whatever it started that is still in the group,
        even once it has exited itself), then its exit is collected (at most KILL_WAIT_S)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self.wait(KILL_WAIT_S)

    def close(self) -> None:
        """Kill its group and close the harness's ends of its streams, in bounded time."""
        self.kill()
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        self._reader.join(READER_WAIT_S)  # at its end once the group is gone; a daemon if not
        self._stderr.close()


def plugin_command(plugin: Plugin) -> tuple[list[str], dict[str, str]]:
    """The process to start and its environment (offline: no hub access from an implementation)."""
    env = settings.environment()
    python = None
    if plugin.requirements:
        mlx = plugin._comparison_mlx or project_mlx()
        venv = ensure_plugin_env(plugin.label, plugin.requirements, mlx, plugin.interpreter)
        python, env = venv.python, venv.command()[1]
    if plugin.python is not None:
        cmd = [str(python), "-I", str(HOST), plugin.python, *(str(REPO_ROOT / p) for p in plugin.path)]
    else:
        assert plugin.command is not None
        cmd = [c.replace("{python}", str(python)).replace("{repo}", str(REPO_ROOT)) for c in plugin.command]
    return cmd, env | {"HF_HUB_OFFLINE": "1"}


def ensure_plugin_env(
    label: str, requirements: list[str], mlx: str | None, interpreter: str | None = None
) -> OracleEnv:
    """The venv of a plugin implementation (harness/implementations.py `Plugin`), built from the
    profile's requirements like an oracle's (keyed by their hash, under `venvs/plugin-<hash>`; pip
    runs in the repository, so a requirement may be a folder of it). An exact mlx pin must be `mlx`,
    its comparisons' (the one-mlx rule); without one, the plugin's own handshake says which it runs.
    `interpreter` (the profile's, a version such as "3.12" or a path) makes it on that Python
    (its version is then part of the hash); without it, on the project's."""
    python = find_interpreter(label, interpreter) if interpreter else None
    pins, digest = plugin_pins(label, requirements, python)
    root = cache_root() / "venvs" / f"plugin-{digest}"
    env = OracleEnv(name=label, root=root, pins_hash=digest, pins=pins)

    def check() -> None:
        wrong = [v for v in pinned_mlx(pins) if v != mlx]
        if wrong:
            raise OracleVersionError(
                f"implementation {label}: its requirements install mlx {', '.join(wrong)}, its oracle runs mlx "
                f"{mlx}: bits are compared within one mlx version (nothing was built)"
            )
        root.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root.with_name(root.name + ".requirements.txt"), pins.encode())

    with clock.phase("venv"):
        pinned = Pins(root.with_name(root.name + ".requirements.txt"), cwd=REPO_ROOT, python=python and python[0])
        names = [req.name for req in parse_requirements(pins)]  # the implementation itself among them
        return ensure_built(env, check, pinned, "implementation venv", (*VERIFIED, *names))


def plugin_pins(label: str, requirements: list[str], python: tuple[str, str] | None = None) -> tuple[str, str]:
    """What a plugin's venv is built from (its requirement lines, `-r FILE` read in, and the
    version of the interpreter a profile names) and their hash."""
    pins = "\n".join(expand(requirements, label)) + "\n"
    if python is None:
        return pins, pins_hash(pins)
    major, minor = (int(n) for n in python[1].split(".")[:2])
    return f"# python {python[1]}\n" + pins, pins_hash(pins, (major, minor))


def find_interpreter(label: str, wanted: str) -> tuple[str, str]:
    """(path, version) of the Python a profile's `interpreter:` names: a path, or a version found
    on PATH as pythonX.Y (then by uv, which knows the Pythons it manages); a clear error naming
    the versions this machine has otherwise."""
    import shutil

    candidates = [wanted] if "/" in wanted else [shutil.which(f"python{wanted}") or ""]
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if "/" not in wanted and not candidates[0] and uv:
        found = subprocess.run([uv, "python", "find", "--no-python-downloads", wanted], capture_output=True, text=True)
        candidates = [found.stdout.strip()] if found.returncode == 0 else []
    for path in filter(None, candidates):
        probe = subprocess.run([path, "-I", "-c", _VERSION], capture_output=True, text=True, check=False)
        version = probe.stdout.strip()
        if probe.returncode == 0 and ("/" in wanted or version == wanted or version.startswith(wanted + ".")):
            return path, version
    have = sorted({v for v in (_version_of(p) for p in _pythons_on_path()) if v})
    raise OracleVersionError(
        f"implementation {label}: interpreter {wanted!r}: no such Python on this machine (found: "
        f"{', '.join(have) or 'none on PATH'}); install it (e.g. `uv python install {wanted}` where "
        "python.org's builds can be downloaded) or give its path as `interpreter:`"
    )


_VERSION = "import platform; print(platform.python_version())"


def _pythons_on_path() -> list[str]:
    seen = []
    for folder in settings.environment().get("PATH", "").split(os.pathsep):
        with contextlib.suppress(OSError):
            seen += [str(p) for p in Path(folder).glob("python3*") if re.fullmatch(r"python3(\.\d+)?", p.name)]
    return seen


def _version_of(path: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        probe = subprocess.run([path, "-I", "-c", _VERSION], capture_output=True, text=True, timeout=20)
        return probe.stdout.strip() if probe.returncode == 0 else ""
    return ""


# pip's spellings of a requirements include (-r FILE, -rFILE, --requirement=FILE) and a constraints file
_INCLUDE = re.compile(r"(?:-r|--requirement)(?:=|\s+|(?=[^\s=-]))(\S.*)")
_CONSTRAINT = re.compile(r"(?:-c|--constraint)(?:=|\s+|(?=[^\s=-]))(\S.*)")


def expand(requirements: list[str], label: str) -> list[str]:
    """The requirement lines, each `-r FILE` (a file of the repository) replaced by its lines, so
    that the venv's hash is that of what pip installs, not of a file name."""
    lines = []
    for line in requirements:
        if _CONSTRAINT.match(line.strip()):
            raise ProfileError(
                f"implementation {label}: requirements: {line!r}: a constraints file is not read into the venv's "
                "hash or the one-mlx check: pin its versions as requirement lines (or in a -r file) instead"
            )
        include = _INCLUDE.match(line.strip())
        if include is None:
            lines.append(line)
            continue
        path = REPO_ROOT / include.group(1).strip()
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"implementation {label}: requirements: {line!r}: cannot read {path}: {e}") from None
        lines += expand([t.strip() for t in text.splitlines() if t.strip() and not t.startswith("#")], label)
    return lines
