"""The one way the harness runs an oracle's code: `OracleProcess`.

A script of an oracle (declared in its descriptor, harness/oracle/descriptor.py) runs in the
oracle's own venv (`python -I`, so the repository is not importable there), offline
(`HF_HUB_OFFLINE=1`: it loads local directories, never the hub), in a work directory of its
own under the cache, with one command line for every script:

    python -I oracles/<oracle>/<script> --job JOB.json --out OUT/

JOB.json is everything the script is asked (a JSON object), OUT/ an empty folder for
everything it answers. A non-zero exit is an OracleError with the tail of its output, raised
inside the progress task (its line says "failed", never "done"); the environment block a
script reports (versions, device, BLAS) is checked against the project's by
`check_environment`. Long-lived benchmark workers (`serve`) and one-line questions to the
venv's interpreter (`ask`) go through here too: no other module starts an oracle process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.errors import OracleError, OracleVersionError
from harness.oracle.descriptor import OracleDescriptor, descriptor
from harness.oracle.pins import comparison_mlx
from harness.oracle.streams import LINE_BYTES, TAIL_CHARS, LineTooLong, cap_text, file_tail, read_line
from harness.oracle.venvs import OracleEnv, check_same_mlx, ensure_oracle_env
from harness.paths import cache_root
from harness.progress import progress
from harness.provenance import classify_blas, device_facts

Popen = subprocess.Popen[str]
OWNER_FILE = "owner.pid"  # the harness process a script's work directory belongs to


def _parent_death_signal() -> Any:
    """What the script's process calls before it runs (Linux): prctl(PR_SET_PDEATHSIG,
    SIGKILL), so it is killed when the harness dies, even by SIGKILL, instead of running on as
    an orphan. Resolved here, in the harness, so the forked child only makes the call. macOS has
    no such signal (None): there an orphan runs to its end, and its work directory is swept by
    the next run (`sweep_stale_work_dirs`)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def sweep_stale_work_dirs(tmp: Path) -> list[Path]:
    """Remove the scripts' work directories whose harness process is gone (killed before its
    TemporaryDirectory could clean up). A directory without an owner file is left alone
    unless it is an hour old (made by an older harness, or between mkdir and the write)."""
    removed = []
    for work in tmp.glob("oracle-*"):
        try:
            owner = int((work / OWNER_FILE).read_text())
        except (OSError, ValueError):
            try:
                stale = time.time() - work.stat().st_mtime > 3600
            except OSError:
                continue
        else:
            stale = not _alive(owner)
        if stale:
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work)
    return removed


@contextlib.contextmanager
def work_directory() -> Iterator[Path]:
    """A fresh work directory under the cache, owned by this process (swept once it is gone)."""
    tmp = cache_root() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    sweep_stale_work_dirs(tmp)
    with tempfile.TemporaryDirectory(prefix="oracle-", dir=tmp) as name:
        work = Path(name)
        (work / OWNER_FILE).write_text(f"{os.getpid()}\n")
        yield work


def start_process(
    cmd: list[str], env: dict[str, str], work: Path, stdin: int, stderr: Any, new_session: bool = False
) -> subprocess.Popen[str]:
    """The script's process: text lines on stdout, in its work folder, dying with the harness.
    `new_session`: it leads a session and process group of its own, so that it and every process
    it starts (that stays in the group) can be killed at once (`os.killpg(proc.pid, ...)`)."""
    return subprocess.Popen(
        cmd,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        cwd=work,
        preexec_fn=_parent_death_signal(),
        start_new_session=new_session,
    )


class OracleProcess:
    """One oracle's scripts, run in its venv (built on first use from its pins)."""

    def __init__(self, oracle: str):
        self.descriptor: OracleDescriptor = descriptor(oracle)
        self.name = oracle
        self._env: OracleEnv | None = None

    @property
    def env(self) -> OracleEnv:
        if self._env is None:
            env = ensure_oracle_env(self.name)
            if self.descriptor.family == "torch":
                from harness.oracle.torch_key import check_prediction

                check_prediction(self.name, env)
            self._env = env
        return self._env

    def check_versions(self) -> dict[str, str | None]:
        """Before a run: the venv's mlx is the comparison's (the project's, or a variant's pinned
        one; an mlx-free oracle has none); its versions."""
        return check_same_mlx(self.env, comparison_mlx(self.name))

    def _command(self, script: str, work: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
        cmd, env = self.env.command(
            str(self.descriptor.script(script)), "--job", str(work / "job.json"), "--out", str(work / "out"), *extra
        )
        env["HF_HUB_OFFLINE"] = "1"
        return cmd, env

    @contextlib.contextmanager
    def run(
        self,
        script: str,
        job: dict[str, Any],
        task: str | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> Iterator[Path]:
        """Run `script` on `job`; yields its OUT folder (gone when the block ends). `task` is
        the progress line shown while it runs; `on_line` sees each line it prints as it comes."""
        with work_directory() as work:
            (work / "job.json").write_text(json.dumps(job, indent=1))
            (work / "out").mkdir()
            cmd, env = self._command(script, work)
            with progress.task(task) if task else contextlib.nullcontext():
                tail, chars, size = "", 0, 0  # its output's end (enough to quote), and how much came
                with start_process(cmd, env, work, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT) as proc:
                    stdout = proc.stdout
                    assert stdout is not None
                    for line in iter(lambda: stdout.readline(LINE_BYTES), ""):  # a longer line: in pieces
                        tail = (tail + line)[-TAIL_CHARS - 1 :]
                        chars, size = chars + len(line), size + len(line.encode(errors="replace"))
                        if on_line is not None:
                            on_line(line.rstrip("\n"))
                    code = proc.wait()
                if code != 0:  # inside the task: its line says "failed", never "done"
                    said = cap_text(tail, "output", size=size, partial=chars > len(tail))
                    raise OracleError(f"oracle {self.name} {script} failed (exit {code}):\n{said}")
            yield work / "out"

    def serve(self, script: str, job: dict[str, Any], work: Path, stderr: Any = subprocess.PIPE) -> Popen:
        """A long-lived worker (`--serve`: one JSON line per request on stdin, one per answer on
        stdout) in `work`, which the caller owns and removes. `stderr`: a pipe, or a file
        (a worker that may print much to it, and is not read until it ends)."""
        (work / "job.json").write_text(json.dumps(job, indent=1))
        (work / "out").mkdir(exist_ok=True)
        cmd, env = self._command(script, work, "--serve")
        return start_process(cmd, env, work, stdin=subprocess.PIPE, stderr=stderr)

    def ask(self, code: str, *args: str) -> str:
        """The stdout of `python -c code args` in the venv: a question to its interpreter
        (installed versions, torch's CPU capability), in the environment its scripts run in."""
        cmd, env = self.env.command("-c", code, *args)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            said = cap_text(out.stderr, "stderr")
            raise OracleError(f"oracle venv {self.env.root}: {code.splitlines()[0]} ... failed: {said}")
        return out.stdout

    def check_environment(self, oracle_env: dict[str, Any]) -> None:
        """The environment block a script reported: the comparison's mlx, the project's backend and BLAS (an
        mlx-free oracle must have run without mlx)."""
        facts = device_facts()
        if self.descriptor.family != "mlx":  # another framework: judged on tokens only
            if oracle_env.get("mlx") is not None:
                raise OracleVersionError(f"oracle {self.name} ran mlx {oracle_env['mlx']}: it must run without it")
            return
        expected = comparison_mlx(self.name)
        if oracle_env.get("mlx") != expected:
            raise OracleVersionError(
                f"oracle {self.name} ran mlx {oracle_env.get('mlx')}, its comparisons run mlx {expected}"
            )
        oracle_device = str(oracle_env.get("device", ""))
        if facts.backend not in oracle_device:
            raise OracleVersionError(f"oracle {self.name} ran on {oracle_device}, the project on {facts.backend}")
        libs = oracle_env.get("blas_libraries") or []
        if libs and classify_blas(libs) != facts.blas:
            raise OracleVersionError(
                f"oracle {self.name} used BLAS {classify_blas(libs)} ({libs}), the project uses {facts.blas}"
            )


class OracleServer:
    """A script's `--serve` worker that answers questions: `{"status": "ready"}` once started,
    then one JSON answer line per JSON request line, `{"status": "error", "error": ...}` for a
    request it could not answer (an OracleError here; the worker serves the next one). Its
    stderr goes to a log in its work folder, whose tail names a worker that died."""

    def __init__(self, oracle: str, script: str, job: dict[str, Any]):
        self.oracle, self.script = oracle, script
        self._stack = contextlib.ExitStack()
        self.work = self._stack.enter_context(work_directory())
        self._log = self._stack.enter_context(open(self.work / "stderr.log", "w"))
        try:
            self.proc = OracleProcess(oracle).serve(script, job, self.work, stderr=self._log)
        except BaseException:
            self._stack.close()
            raise
        try:
            self.ready = self._answer("starting")  # {"status": "ready"} and what else it says
        except BaseException:
            self.close()
            raise

    def _answer(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = read_line(self.proc.stdout.buffer)  # read only here, as bytes: at most LINE_BYTES
        except LineTooLong as e:
            raise OracleError(f"oracle {self.oracle} {self.script}, {what}: {e}") from None
        if not line:
            self._log.flush()
            tail = file_tail(self.work / "stderr.log")
            raise OracleError(f"oracle {self.oracle} {self.script} ended while {what}:\n{tail}")
        answer = json.loads(line)
        if answer.get("status") == "error":
            raise OracleError(f"oracle {self.oracle} {self.script}, {what}: {answer.get('error')}")
        return answer

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, request: dict[str, Any], what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._answer(what)  # it is gone: its log's tail says why
        return self._answer(what)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            self._stack.close()
