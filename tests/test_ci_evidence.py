"""CI runs the evidence (issue 31 part 5): a scheduled job runs `make mutants` and every
`make nightly` profile (nightly-tagged scenarios included) on the CPU backend; the Apple Silicon
nightly signs off a hosted runner's CPU device beside the self-hosted Metal one (issue 35 part 5)."""

from __future__ import annotations

import fnmatch
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


def test_a_hosted_mac_signs_off_its_cpu_device_and_the_matrix_merges_it() -> None:
    """GitHub's hosted arm64 macOS runner: the CPU device (its GPU is paravirtual), every nightly
    profile but the two full-size fp32 twins (7 GB of memory), said in the job summary, uploaded
    under a name the matrix job downloads."""
    workflow = yaml.safe_load((WORKFLOW.parent / "nightly-signoff.yml").read_text())
    job, matrix = workflow["jobs"]["hosted-cpu"], workflow["jobs"]["matrix"]
    assert job["runs-on"] == "macos-14" and job["env"]["MLX_PARITY_DEVICE"] == "cpu"
    hosted = job["env"]["HOSTED_MODELS"].split()
    assert sorted(set(_nightly_models()) - set(hosted)) == ["minicpm5-2b", "whisper-large-v3-turbo"]
    assert set(hosted) <= set(_nightly_models()) and len(hosted) == len(set(hosted))
    for each in (job, workflow["jobs"]["signoff"]):  # make's venv from the interpreter the cache is keyed on
        step = next(s for s in each["steps"] if s.get("id") == "signoff")
        assert step["env"]["PYTHON"] == "${{ steps.py.outputs.python-path }}"
    run = next(s["run"] for s in job["steps"] if s.get("id") == "signoff")
    assert 'make signoff DEVICE=cpu SIGNOFF_MODELS="$HOSTED_MODELS"' in run
    assert "CPU (Accelerate)" in run and "GITHUB_STEP_SUMMARY" in run and "summary.md" in run
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    download = next(s for s in matrix["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    pattern = download["with"]["pattern"].replace("${{ github.run_number }}", "7")
    for name in (upload["with"]["name"], "signoff-${{ github.run_number }}"):
        assert fnmatch.fnmatch(name.replace("${{ github.run_number }}", "7"), pattern), (name, pattern)
    assert ".cache/history.sqlite" in upload["with"]["path"]
    cached = next(s["with"]["path"] for s in job["steps"] if s.get("id") == "cpu")
    assert "goldens/*/cpu-arm64-*" in cached


def test_make_test_leaves_the_nightly_tests_to_a_scheduled_job() -> None:
    """make test (and make coverage, make test with coverage) deselect the tests marked nightly;
    make test-nightly runs exactly those, and the scheduled workflow runs it."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    test = re.search(r"^test: venv\n\t(.+)$", makefile, re.M).group(1)
    nightly = re.search(r"^test-nightly: venv\n\t(.+)$", makefile, re.M).group(1)
    assert '-m "not nightly"' in test and "-m nightly " in nightly
    assert test.replace('-m "not nightly"', "-m nightly") == nightly
    coverage = re.search(r"^coverage: venv\n(?:\t.+\n)+", makefile, re.M).group(0)
    assert '-m pytest tests -m "not nightly"' in coverage
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert any(step.get("run", "") == "make test-nightly" for step in jobs["test-nightly"]["steps"])
