"""The oracle side of a language-model pair: oracles/<oracle>/quality.py in its own venv
(`python -I`, as the golden generators run), one process per pair (optiq's patches are
process-global), talking to the harness through files only; its per-window progress lines are
passed on as they come."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.artifacts.files import sha256_file
from harness.errors import OracleError
from harness.paths import cache_root, oracles_dir
from harness.provenance import device_facts, golden_key
from harness.quality.records import Measurement, MeasurementError
from harness.runners.oracle import OracleRunner
from harness.runners.venvs import check_same_mlx, common_sources, ensure_oracle_env, oracle_pins_hash

SCRIPT = "quality.py"


def oracle_facts(oracle: str) -> dict[str, Any]:
    """What the oracle's numbers depend on: pins, the quality script, the common modules it loads,
    and the device's golden key (part of the cache key)."""
    return {
        "name": oracle,
        "pins_hash": oracle_pins_hash(oracle),
        "script_sha256": sha256_file(oracles_dir() / oracle / SCRIPT),
        "common_sha256": {name: sha256_file(p) for name, p in common_sources(oracle, SCRIPT).items()},
        "device": golden_key(oracle).as_dict(),
    }


def run_oracle(oracle: str, job: dict[str, Any], on_window: Callable[[int, int], None] | None = None) -> Measurement:
    env = ensure_oracle_env(oracle)
    check_same_mlx(env, device_facts().mlx)
    (cache_root() / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quality-", dir=cache_root() / "tmp") as tmp:
        work = Path(tmp)
        (work / "job.json").write_text(json.dumps(job, indent=1))
        out = work / "out"
        out.mkdir()
        cmd, child_env = env.command(
            str(oracles_dir() / oracle / SCRIPT), "--job", str(work / "job.json"), "--out", str(out)
        )
        child_env["HF_HUB_OFFLINE"] = "1"  # the script loads local directories, never the hub
        tail: list[str] = []
        with subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env, cwd=work
        ) as proc:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail = (tail + [line.rstrip()])[-20:]
                if line.startswith("quality: window ") and on_window is not None:
                    done, total = line.split()[-1].split("/")
                    on_window(int(done), int(total))
            code = proc.wait()
        if code != 0:
            raise OracleError(f"oracle {oracle} quality.py failed (exit {code}):\n" + "\n".join(tail))
        try:
            measurement = Measurement.from_dir(out)
        except MeasurementError as e:
            raise OracleError(f"oracle {oracle} quality.py wrote a bad result: {e}") from None
    OracleRunner(oracle)._check_environment(measurement.environment)
    return measurement
