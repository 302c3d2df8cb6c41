"""Implementations under test in their own process (docs/protocol.md), on the oracle seam's side:
their venvs, built from a profile's requirements like an oracle's from its pins, and the process
itself (start it, a line in, a line out within a timeout, stderr kept, killed when done). What
the lines mean is harness/runners/process.py's."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
from pathlib import Path

from harness import settings
from harness.errors import OracleVersionError, ProfileError
from harness.fileio import atomic_write_bytes
from harness.implementations import Plugin
from harness.oracle.pins import pinned_mlx, pins_hash, project_mlx
from harness.oracle.process import start_process
from harness.oracle.venvs import OracleEnv, Pins, ensure_built
from harness.paths import REPO_ROOT, cache_root
from harness.timing import clock

HOST = REPO_ROOT / "plugins" / "host.py"  # runs inside the plugin venv: imports nothing of ours


class Timeout(Exception):
    """No line came within the time given."""


class LineProcess:
    """A started implementation: JSON lines to its stdin, lines from its stdout, stderr to a file."""

    def __init__(self, cmd: list[str], env: dict[str, str], work: Path):
        self.stderr_path = work / "stderr.log"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - open for the process's life
        self._proc = start_process(cmd, env, work, stdin=subprocess.PIPE, stderr=self._stderr)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def send(self, line: str) -> bool:
        """False when its stdin is closed (it has exited)."""
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def receive(self, timeout: float) -> str | None:
        """Its next line; None once its stdout has closed; Timeout after `timeout` seconds."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise Timeout from None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout)

    def stderr_tail(self, lines: int) -> list[str]:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace").splitlines()[-lines:]

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self.wait(10)

    def close(self) -> None:
        self.kill()
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._stderr.close()


def plugin_command(plugin: Plugin) -> tuple[list[str], dict[str, str]]:
    """The process to start and its environment (offline: no hub access from an implementation)."""
    env = settings.environment()
    python = None
    if plugin.requirements:
        venv = ensure_plugin_env(plugin.label, plugin.requirements, plugin._comparison_mlx or project_mlx())
        python, env = venv.python, venv.command()[1]
    if plugin.python is not None:
        cmd = [str(python), "-I", str(HOST), plugin.python, *(str(REPO_ROOT / p) for p in plugin.path)]
    else:
        assert plugin.command is not None
        cmd = [c.replace("{python}", str(python)).replace("{repo}", str(REPO_ROOT)) for c in plugin.command]
    return cmd, env | {"HF_HUB_OFFLINE": "1"}


def ensure_plugin_env(label: str, requirements: list[str], mlx: str | None) -> OracleEnv:
    """The venv of a plugin implementation (harness/implementations.py `Plugin`), built from the
    profile's requirements like an oracle's (keyed by their hash, under `venvs/plugin-<hash>`; pip
    runs in the repository, so a requirement may be a folder of it). An exact mlx pin must be `mlx`,
    its comparisons' (the one-mlx rule); without one, the plugin's own handshake says which it runs."""
    pins, digest = plugin_pins(label, requirements)
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
        return ensure_built(
            env, check, Pins(root.with_name(root.name + ".requirements.txt"), cwd=REPO_ROOT), "implementation venv"
        )


def plugin_pins(label: str, requirements: list[str]) -> tuple[str, str]:
    """What a plugin's venv is built from (its requirement lines, `-r FILE` read in) and their hash."""
    pins = "\n".join(expand(requirements, label)) + "\n"
    return pins, pins_hash(pins)


def expand(requirements: list[str], label: str) -> list[str]:
    """The requirement lines, each `-r FILE` (a file of the repository) replaced by its lines, so
    that the venv's hash is that of what pip installs, not of a file name."""
    lines = []
    for line in requirements:
        if not line.startswith(("-r ", "--requirement ")):
            lines.append(line)
            continue
        path = REPO_ROOT / line.split(maxsplit=1)[1].strip()
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"implementation {label}: requirements: {line!r}: cannot read {path}: {e}") from None
        lines += expand([t.strip() for t in text.splitlines() if t.strip() and not t.startswith("#")], label)
    return lines
