"""The oracle side: a generator script run inside its oracle's own venv (`python -I`, so the
repository is not importable there), talking to the harness through files only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.errors import OracleError, OracleVersionError
from harness.paths import cache_root
from harness.progress import progress
from harness.provenance import classify_blas, device_facts
from harness.records import ScenarioRecord, read_generator_output
from harness.runners.venvs import MLX_FREE_ORACLES, OracleEnv, check_same_mlx, ensure_oracle_env
from harness.timing import clock

OWNER_FILE = "owner.pid"  # the harness process a generator's work directory belongs to


def _parent_death_signal() -> Any:
    """What the generator's process calls before it runs (Linux): prctl(PR_SET_PDEATHSIG,
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
    """Remove the generators' work directories whose harness process is gone (killed before
    its TemporaryDirectory could clean up). A directory without an owner file is left alone
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


class OracleRunner:
    def __init__(self, oracle: str):
        self.oracle = oracle
        self._env: OracleEnv | None = None

    @property
    def env(self) -> OracleEnv:
        if self._env is None:
            self._env = ensure_oracle_env(self.oracle)
        return self._env

    def run(
        self, model_dir: Path, specs: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, ScenarioRecord], dict[str, str]]:
        """Generate oracle records for `specs`: (oracle environment, records by id, oracle errors by id)."""
        facts = device_facts()
        with clock.phase("venv"):
            check_same_mlx(self.env, facts.mlx)
        (cache_root() / "tmp").mkdir(parents=True, exist_ok=True)
        sweep_stale_work_dirs(cache_root() / "tmp")
        with tempfile.TemporaryDirectory(prefix="oracle-", dir=cache_root() / "tmp") as tmp:
            work = Path(tmp)
            (work / OWNER_FILE).write_text(f"{os.getpid()}\n")
            spec_path = work / "spec.json"
            spec_path.write_text(json.dumps({"model_dir": str(model_dir), "scenarios": specs}, indent=2))
            out = work / "out"
            out.mkdir()
            cmd, env = self.env.command(str(self.env.generator), "--spec", str(spec_path), "--out", str(out))
            env["HF_HUB_OFFLINE"] = "1"  # the generator loads a local directory, never the hub
            ids = ", ".join(s["id"] for s in specs)
            with progress.task(f"oracle {self.oracle}: generating goldens for {ids}"):
                result = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=work,
                    check=False,
                    preexec_fn=_parent_death_signal(),
                )
                if result.returncode != 0:  # inside the task: its line says "failed", never "done"
                    tail = "\n".join(result.stderr.strip().splitlines()[-20:])
                    raise OracleError(f"oracle {self.oracle} generator failed (exit {result.returncode}):\n{tail}")
            environment, records, errors = read_generator_output(out)
        self._check_environment(environment.get("environment", {}))
        missing = {s["id"] for s in specs} - set(records) - set(errors)
        if missing:
            raise OracleError(f"oracle {self.oracle} produced no record for scenario(s) {sorted(missing)}")
        return environment["environment"], records, errors

    def _check_environment(self, oracle_env: dict[str, Any]) -> None:
        facts = device_facts()
        if self.oracle in MLX_FREE_ORACLES:  # another framework: judged on tokens only
            if oracle_env.get("mlx") is not None:
                raise OracleVersionError(f"oracle {self.oracle} ran mlx {oracle_env['mlx']}: it must run without it")
            return
        if oracle_env.get("mlx") != facts.mlx:
            raise OracleVersionError(
                f"oracle {self.oracle} ran mlx {oracle_env.get('mlx')}, the project runs mlx {facts.mlx}"
            )
        oracle_device = str(oracle_env.get("device", ""))
        if facts.backend not in oracle_device:
            raise OracleVersionError(f"oracle {self.oracle} ran on {oracle_device}, the project on {facts.backend}")
        libs = oracle_env.get("blas_libraries") or []
        if libs and classify_blas(libs) != facts.blas:
            raise OracleVersionError(
                f"oracle {self.oracle} used BLAS {classify_blas(libs)} ({libs}), the project uses {facts.blas}"
            )
