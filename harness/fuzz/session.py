"""One differential example, judged as the gates judge: the oracle's record from a warm oracle
process (oracles/mlx-lm/fuzz.py, started once through the oracle seam), the in-tree runs and
every check of the scenario from `ParitySession.run_check` (determinism repeat, teacher forcing,
compact-free full vectors), nothing stored: the example's golden lives in memory only."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.checks.compare import CheckResult
from harness.errors import HarnessError, NothingComparedError, OracleError
from harness.goldens.specs import oracle_spec
from harness.goldens.store import Golden
from harness.oracle.process import OracleProcess, OracleServer
from harness.profile import Profile, Scenario
from harness.records import ScenarioRecord, read_generator_output
from harness.session import ParitySession


class WarmOracle:
    """The oracle's fuzz.py, model loaded once; its environment checked as a generator's is."""

    def __init__(self, oracle: str, model_dir: Path):
        self.oracle = oracle
        self.process = OracleProcess(oracle)
        self.process.check_versions()
        self.server = OracleServer(oracle, "fuzz.py", {"model_dir": str(model_dir)})
        try:
            self.process.check_environment(self.server.ready.get("environment", {}))
        except BaseException:
            self.server.close()
            raise
        self._answers = 0

    def record(self, spec: dict[str, Any]) -> ScenarioRecord:
        """The oracle's record of one scenario spec; an OracleError names what it could not run."""
        self._answers += 1
        out = self.server.work / f"example-{self._answers}"
        try:
            self.server.ask({"scenario": spec, "out": str(out)}, f"running {spec['id']}")
            _, records, errors = read_generator_output(out)
            if spec["id"] in errors:
                raise OracleError(f"oracle {self.oracle} cannot run {spec['id']}: {errors[spec['id']]}")
            return records[spec["id"]]
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def close(self) -> None:
        self.server.close()


@dataclass
class FuzzSession(ParitySession):
    """A ParitySession whose goldens are the warm oracle's records of the examples, in memory."""

    _examples: dict[tuple[str, str], ScenarioRecord] = field(default_factory=dict)
    nothing_compared: Counter[str] = field(default_factory=Counter)  # per check: examples it had nothing to judge

    def add_golden(self, profile: Profile, scenario: Scenario, record: ScenarioRecord) -> None:
        self._examples[(profile.name, scenario.id)] = record

    def golden(self, profile: Profile, scenario: Scenario) -> Golden:
        try:
            record = self._examples[(profile.name, scenario.id)]
        except KeyError:
            raise HarnessError(f"{profile.name}/{scenario.id}: no oracle record for this example") from None
        return Golden(Path(f"<fuzz example {scenario.id}>"), {}, record)

    def full_golden(self, profile: Profile, scenario: Scenario) -> ScenarioRecord:
        return self.golden(profile, scenario).record

    def goldens(self, profile: Profile, regenerate: bool = False) -> dict[str, Golden]:
        return {s.id: self.golden(profile, s) for s in profile.scenarios}

    def recorded_elsewhere(self, profile: Profile, scenario: Scenario) -> str | None:
        return None

    def judge(self, profile: Profile, scenario: Scenario, oracle: WarmOracle) -> list[CheckResult]:
        """Every check of the example: the oracle's record made first, then the gates' judging;
        an exception of a check is its result (failed, with the error), as make parity's ERROR."""
        self.add_golden(profile, scenario, oracle.record(oracle_spec(profile, scenario)))
        results = []
        try:
            for check in profile.planned(scenario).checks:
                try:
                    results.append(self.run_check(profile, scenario, check))
                except NothingComparedError:
                    # The example leaves the check nothing to judge (an EOS forced at the first
                    # step: no decode rows): a profile would not name it there; not a failure.
                    self.nothing_compared[check] += 1
                except Exception as e:  # noqa: BLE001 - an ERROR of the check, as make parity's
                    results.append(CheckResult(check, False, f"ERROR {type(e).__name__}: {e}"))
        finally:
            self.forget_runs(profile, scenario)
            self._examples.pop((profile.name, scenario.id), None)
        return results
