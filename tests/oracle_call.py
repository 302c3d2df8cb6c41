"""Run a short script inside a pinned oracle venv and read back what it computed.

For tests whose expected values are what a reference library computes: instead of typing
those values in, the test asks the reference itself (in the venv the harness builds from
oracles/<name>/requirements.txt) and compares the in-tree values with its answer, so the
test fails when either side changes. One call per test module (a module-scoped fixture)
keeps the venv start-up (a few seconds) to one per module.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def oracle_answer(oracle: str, script: str, job: Any, workdir: Path, timeout: float = 300) -> Any:
    """Run `script` (Python source) with the interpreter of `oracle`'s venv; what it wrote.

    The script is called as `oracle.py JOB OUT`: it reads `job` (as JSON) from JOB and writes
    its answer (JSON) to OUT. It runs in `workdir`, where it may find files the test put there.
    """
    from harness.oracle.venvs import ensure_oracle_env

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.json").write_text(json.dumps(job))
    (workdir / "oracle.py").write_text(script)
    cmd, env = ensure_oracle_env(oracle).command(
        str(workdir / "oracle.py"), str(workdir / "job.json"), str(workdir / "out.json")
    )
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=workdir, check=False, timeout=timeout)
    assert out.returncode == 0, f"{oracle} oracle script failed:\n{out.stderr[-3000:]}"
    return json.loads((workdir / "out.json").read_text())
