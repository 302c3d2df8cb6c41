"""The oracle side of the goldens: the oracle's generate.py, run through its process seam
(harness/oracle/process.py) on the scenarios' specs; its records read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import OracleError
from harness.oracle.process import OracleProcess
from harness.oracle.venvs import OracleEnv
from harness.records import ScenarioRecord, read_generator_output
from harness.timing import clock


class OracleRunner:
    def __init__(self, oracle: str):
        self.oracle = oracle
        self.process = OracleProcess(oracle)

    @property
    def env(self) -> OracleEnv:
        return self.process.env

    def run(
        self, model_dir: Path, specs: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, ScenarioRecord], dict[str, str]]:
        """Generate oracle records for `specs`: (oracle environment, records by id, oracle errors by id)."""
        with clock.phase("venv"):
            self.process.check_versions()
        ids = ", ".join(s["id"] for s in specs)
        job = {"model_dir": str(model_dir), "scenarios": specs}
        with self.process.run("generate.py", job, task=f"oracle {self.oracle}: generating goldens for {ids}") as out:
            environment, records, errors = read_generator_output(out)
        self.process.check_environment(environment.get("environment", {}))
        missing = {s["id"] for s in specs} - set(records) - set(errors)
        if missing:
            raise OracleError(f"oracle {self.oracle} produced no record for scenario(s) {sorted(missing)}")
        return environment["environment"], records, errors
