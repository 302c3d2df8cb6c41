"""CI runs the evidence (issue 31 part 5): a scheduled job runs `make mutants` and every
`make nightly` profile (nightly-tagged scenarios included) on the CPU backend."""

from __future__ import annotations

import re

import yaml

from harness.paths import REPO_ROOT

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "nightly-cpu.yml"


def _nightly_models() -> list[str]:
    """The Makefile's NIGHTLY_MODELS is read from the profiles, not typed: it is what
    `python -m harness list --nightly` prints."""
    from harness.profile.load import nightly_models

    makefile = (REPO_ROOT / "Makefile").read_text()
    line = re.search(r"^NIGHTLY_MODELS \?= (.+)$", makefile, re.M).group(1)
    assert line == "$(shell $(PY) -m harness list --nightly)", line
    return nightly_models()


def test_a_scheduled_job_runs_make_mutants_and_every_nightly_profile() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert "schedule" in workflow[True]  # PyYAML reads the key `on` as True
    jobs = workflow["jobs"]
    assert any("make mutants" in step.get("run", "") for step in jobs["mutants"]["steps"])
    nightly = jobs["nightly-scenarios"]
    assert nightly["strategy"]["matrix"]["model"] == _nightly_models()
    assert any(
        step.get("run", "").startswith("make nightly NIGHTLY_MODELS=") and "matrix.model" in step["run"]
        for step in nightly["steps"]
    )
