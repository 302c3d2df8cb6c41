"""What the benchmarks share: the prompt, the oracle's timed job, the machine facts, the table
footer and the JSON result under reports/."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from harness.fileio import atomic_write_bytes
from harness.paths import REPO_ROOT, cache_root, reports_dir
from harness.profile import Profile
from harness.provenance import device_facts


def bench_prompt(profile: Profile, runner: Any) -> tuple[str, list[int]]:
    """The longest scenario prompt (as parity encodes it): a prompt the gate already runs."""
    active = profile.active_scenarios(device_facts().backend)
    single = [s for s in active if s.kind in ("plain", "chat") and not s.turns and s.composition is None]
    encoded = {s.id: runner.encode(profile.scenario_spec(s))[1] for s in single}
    longest = max(encoded, key=lambda sid: len(encoded[sid]))
    return longest, encoded[longest]


def write_job(directory: Path, prompt_ids: list[int], steps: int, repeats: int) -> Path:
    """The child processes' orders: the very prompt ids timed here, so every side runs the same tokens."""
    path = directory / "ids.json"
    path.write_text(json.dumps({"prompt_ids": prompt_ids, "steps": steps, "repeats": repeats}))
    return path


def oracle_runs(profile: Profile, model_dir: Path, job: Path) -> dict[str, Any]:
    """The oracle's own decode loop, timed in its venv (`python -I`: the repository is not importable there)."""
    from harness.oracle.process import OracleProcess

    orders = json.loads(job.read_text()) | {"model_dir": str(model_dir)}
    with OracleProcess(profile.oracle).run("bench.py", orders) as out:
        return json.loads((out / "result.json").read_text())


def machine(load_before: list[float]) -> dict[str, Any]:
    """Facts the figures depend on; the load averages say whether other work shared the CPU."""
    facts = device_facts()
    return {
        "device": facts.as_dict(),
        "cpu_count": os.cpu_count(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "mlx": facts.mlx,
        "blas": facts.blas,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_1m_before_after": [load_before[0], loadavg()[0]],
    }


def loadavg() -> list[float]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else [float("nan")] * 3


def scratch_dir() -> Path:
    path = cache_root() / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine_line(m: dict[str, Any]) -> str:
    """The footer of every benchmark table: machine, date and the load around the run."""
    d = m["device"]
    line = f"Machine: {d['key']} ({d['processor']}, nproc {m['nproc']}), python {m['python']}, {m['date']}"
    if "loadavg_1m_before_after" in m:
        before, after = m["loadavg_1m_before_after"]
        line += f", 1-min load before/after {before:.2f}/{after:.2f}"
    return line


def portable_record(obj: Any, key: str = "") -> Any:
    """`obj` as a record that may be tracked: no path of this machine in it. Loaded libraries
    (paths into an oracle's venv) keep their file names, which still name the BLAS; a path under
    this checkout becomes relative to it."""
    if isinstance(obj, dict):
        return {k: portable_record(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        if key == "blas_libraries":
            return [Path(p).name if isinstance(p, str) else p for p in obj]
        return [portable_record(v) for v in obj]
    if isinstance(obj, str) and obj.startswith(f"{REPO_ROOT}{os.sep}"):
        return obj[len(str(REPO_ROOT)) + 1 :]
    return obj


def write_result(result: dict[str, Any], name: str, out: Path | None) -> Path:
    """The run's JSON, at `out` or reports/bench-<name>-<UTC stamp>.json (gate-<...> as named), written
    whole (an earlier file at `out` stays until the new one is complete) and without this machine's
    paths (`portable_record`), so that it can be kept under docs/; its path is printed."""
    name = name if name.startswith("gate-") else f"bench-{name}"
    out = out or reports_dir() / f"{name}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, (json.dumps(portable_record(result), indent=2) + "\n").encode())
    print(f"bench: {out}")
    return out


def run_command(cmd: list[str], env: dict[str, str], cwd: Path | str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise SystemExit(f"bench: {' '.join(cmd[:4])} ... failed (exit {result.returncode}):\n{tail}")
    return result


def speed_result(
    model: str,
    steps: int,
    repeats: int,
    scenario: str,
    ids: list[int],
    speeds: dict[str, Any],
    load_before: list[float],
) -> dict[str, Any]:
    """A speed benchmark's result: what ran (model, prompt, steps, rounds), the speeds, the machine."""
    return {
        "model": model,
        "steps": steps,
        "repeats": repeats,
        "prompt": {"scenario": scenario, "tokens": len(ids)},
        "speed": speeds,
        "machine": machine(load_before),
    }
