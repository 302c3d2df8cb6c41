"""`make mutants`: judged through the session's own path, and a matrix with no check unkilled."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.checks.compare import CheckResult
from harness.checks.registry import CHECKS
from harness.errors import InTreeRunError
from harness.paths import REPO_ROOT
from harness.profile.load import find_profile
from harness.session import ParitySession
from harness.tools import mutants


def test_every_mutant_names_a_scenario_of_its_profile() -> None:
    for mutant in mutants.MUTANTS:
        scenario = find_profile(mutant.model).scenario(mutant.scenario)
        assert scenario.id == mutant.scenario


def test_every_gate_test_named_in_the_matrix_exists() -> None:
    for check in CHECKS.values():
        for test in check.failing_tests:
            path, name = test.split("::")
            tree = ast.parse((REPO_ROOT / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in names, f"{test} (named for {check.name}) does not exist"


def test_a_mutant_is_judged_by_run_check_on_every_declared_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """No check function is called directly: `ParitySession.run_check` (digests, full vectors on
    demand, errors) judges, and an error counts as caught, never as a pass."""
    seen = []

    def run_check(self: ParitySession, profile, scenario, check: str) -> CheckResult:
        seen.append((check, self.intree_spec_edits.get((profile.name, scenario.id))))
        if check == "decode_logits":
            raise InTreeRunError("the in-tree run crashed")
        return CheckResult(check, check != "eos_stop", "scripted")

    monkeypatch.setattr(ParitySession, "run_check", run_check)
    mutant = mutants.Mutant("m", "a fault", "minicpm5-2b-mini", "rotating-kv", spec_edits={"max_kv_size": 25})
    outcome = mutants.judge(mutant)
    profile = find_profile("minicpm5-2b-mini")
    assert [c for c, _ in seen] == profile.checks(profile.scenario("rotating-kv"))
    assert all(edits == {"max_kv_size": 25} for _, edits in seen)
    assert outcome["killed"] and outcome["outcomes"]["decode_logits"] == "error"
    assert outcome["outcomes"].get("eos_stop", "failed") == "failed"


def test_the_matrix_names_every_check_without_a_kill() -> None:
    checks = mutants.registry()
    untested = [c for c in checks if not CHECKS[c].failing_tests]
    judged = {"a": {"outcomes": {untested[0]: "failed", untested[1]: "error"}}}
    lines, lacking = mutants.matrix(judged)
    assert untested[0] not in lacking and untested[1] in lacking  # an error is not a check failing
    assert set(lacking) == set(untested[1:])
    assert len(lines) == 2 + len(checks)
    assert lines[2 + checks.index(untested[0])].startswith(f"| {untested[0]} | K |")


def test_the_mutant_list_can_kill_every_check_of_the_registry() -> None:
    """Statically: every registry check is declared by some mutant's scenario or has a gate test
    (whether the mutant really kills it is what `make mutants` runs and docs/mutants.md records)."""
    declared = {c.name for c in CHECKS.values() if c.failing_tests}
    for m in mutants.MUTANTS:
        profile = find_profile(m.model)
        declared |= set(profile.checks(profile.scenario(m.scenario)))
    assert set(mutants.registry()) <= declared, sorted(set(mutants.registry()) - declared)
    assert Path(REPO_ROOT / "docs" / "mutants.md").is_file()
