"""A pytest plugin for the verdict tests: parity checks that pass, fail or crash on cue.

`python -m harness parity ... -- -p tests.fault_plugin` with MLX_PARITY_TEST_FAULTS, a JSON
object from "scenario/check" (or "check") to an action, replaces ParitySession.run_check:
"pass", "fail", "nan" (a failing result whose details hold NaN), an exception class name
raised from the check ("ValueError", "StopIteration", "KeyboardInterrupt"), and
"teardown:<name>" (the check passes, then the profile's release raises it), "walked:<a>|<b>" (the
check passes having walked those declared paths; "walked:" none), "flaky" (fails and passes by
turns). Unlisted checks pass. A checkout's own `.test-faults.json` adds to them (a fault
committed into a scratch history, for the bisection tests).
No model is loaded: these tests are about what the harness says of a check's outcome.
"""

from __future__ import annotations

import builtins
import json
import os

from harness.checks.compare import CheckResult
from harness.paths import REPO_ROOT
from harness.session import ParitySession


def pytest_configure(config) -> None:
    faults = json.loads(os.environ.get("MLX_PARITY_TEST_FAULTS", "{}"))
    planted = REPO_ROOT / ".test-faults.json"  # a fault committed into a checkout (the bisection tests)
    if planted.is_file():
        faults |= json.loads(planted.read_text())

    def action(scenario, check) -> str:
        return faults.get(f"{scenario.id}/{check}", faults.get(check, "pass"))

    def run_check(self, profile, scenario, check):
        what = action(scenario, check)
        if what.startswith("teardown:"):
            self._fault_on_release = what.split(":", 1)[1]
            what = "pass"
        if what == "flaky":  # fails, then passes, then fails... (a count kept beside the planted file)
            count = REPO_ROOT / ".test-faults-count"
            n = int(count.read_text()) if count.is_file() else 0
            count.write_text(str(n + 1))
            what = "fail" if n % 2 == 0 else "pass"
        if what == "pass":
            return CheckResult(check, True, f"{check}: scripted pass", steps_compared=1)
        if what.startswith("walked:"):
            walked = [p for p in what.split(":", 1)[1].split("|") if p]
            return CheckResult(check, True, f"{check}: scripted pass", steps_compared=1, details={"walked": walked})
        if what == "fail":
            return CheckResult(check, False, f"{check}: scripted failure", first_bad_step=0, steps_compared=1)
        if what == "nan":
            return CheckResult(
                check, False, "scripted NaN", details={"max_abs_diff": float("nan"), "inf": float("-inf")}
            )
        raise getattr(builtins, what)(f"scripted {what} in {scenario.id}/{check}")

    def release(self, name: str) -> None:
        fault = getattr(self, "_fault_on_release", None)
        if fault:
            self._fault_on_release = None
            raise getattr(builtins, fault)(f"scripted {fault} while releasing {name}")

    ParitySession.run_check = run_check
    ParitySession.release = release
