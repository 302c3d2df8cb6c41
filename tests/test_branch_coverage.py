"""Branch coverage recorded by the gates (issue 53 part 1): a parity process records models/'
branches into MLX_PARITY_COVERAGE/parity/, the report merges processes, lists every branch not
walked and takes out only what coverage-exempt.yaml exempts with a reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.branch_coverage import AREAS, EXEMPT_FILE, Exemption, load_exemptions, measure, render
from harness.errors import HarnessError
from harness.paths import REPO_ROOT

MASKS = "models/universal/masks.py"


def _record(root: Path, code: str, plugin: str = "harness.branch_coverage_plugin") -> None:
    """A process that loads the parity run's coverage plugin first, as pytest's -p does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_PARITY_")} | {"MLX_PARITY_COVERAGE": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", f"import {plugin}\n{code}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]


def _line(path: str, text: str, after: str = "def create_attention_mask") -> int:
    lines = (REPO_ROOT / path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines, 1) if i > start and text in line)


@pytest.fixture(scope="module")
def one_query(tmp_path_factory) -> Path:
    """models/ recorded by a process that asked for one mask: one query, no window."""
    root = tmp_path_factory.mktemp("cov")
    _record(root, "from models.universal.masks import create_attention_mask\ncreate_attention_mask(1, 0, False, None)")
    return root


def test_a_parity_process_records_models_branches_and_the_report_lists_those_not_walked(one_query: Path) -> None:
    figures = measure("parity", one_query, [])
    masks = next(f for f in figures.files if f.path == MASKS)
    window, one = _line(MASKS, "if window_size is not None:"), _line(MASKS, "if n_queries == 1:")
    assert (window, window + 1) in masks.missing  # a window: never asked
    assert (one, one + 2) in masks.missing  # more than one query: never asked
    assert masks.walked == 2 and masks.branches == 8  # three ifs of this function, one of create_causal_mask
    assert figures.processes == 1
    assert all(f.path.startswith("models/") for f in figures.files)
    assert any(f.path.startswith("models/whisper/") and f.walked == 0 for f in figures.files)  # never imported
    text = render(figures, listed=100000)
    assert f"{MASKS}:{one} -> line {one + 2}: if n_queries == 1:" in text
    assert "target 95 %" in text


def test_an_exemption_takes_its_branches_out_and_a_stale_one_is_said(one_query: Path) -> None:
    window = _line(MASKS, "if window_size is not None:")
    before = measure("parity", one_query, [])
    exempt = [Exemption(MASKS, window, "no profile asks for a window"), Exemption(MASKS, 14, "a line with no branch")]
    after = measure("parity", one_query, exempt)
    masks = next(f for f in after.files if f.path == MASKS)
    assert (window, window + 1) in masks.exempt and (window, window + 1) not in masks.missing
    assert after.branches == before.branches - 1 and after.walked == before.walked
    assert after.stale_exemptions == [f"{MASKS}:14 (a line with no branch): no branch of that line is left unwalked"]


def test_processes_are_merged(one_query: Path, tmp_path: Path) -> None:
    root = tmp_path / "merged"
    (root / "parity").mkdir(parents=True)
    for piece in (one_query / "parity").glob(".coverage.*"):
        (root / "parity" / piece.name).write_bytes(piece.read_bytes())
    _record(root, "from models.universal.masks import create_attention_mask\ncreate_attention_mask(3, 0, True, None)")
    masks = next(f for f in measure("parity", root, []).files if f.path == MASKS)
    assert masks.walked == 5  # one query; then three with an array, through create_causal_mask without a window


def test_one_area_a_process(tmp_path: Path) -> None:
    """make test's processes record the judges; a parity plugin imported there records nothing more."""
    _record(tmp_path, "import harness.branch_coverage_plugin\nimport models.universal.masks", plugin="conftest")
    assert list((tmp_path / "tests").glob(".coverage.*"))
    assert not (tmp_path / "parity").exists()


def test_nothing_recorded_is_an_error_naming_the_folder(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"no coverage recorded for parity .* run with MLX_PARITY_COVERAGE="):
        measure("parity", tmp_path, [])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("file: x\n", "expected a list"),
        ("- {file: models/universal/masks.py, line: 30}\n", "entry 1: expected exactly the keys file, line, reason"),
        ("- {file: models/nope.py, line: 3, reason: a b c}\n", "entry 1: file 'models/nope.py' is not a file"),
        ("- {file: models/universal/masks.py, line: 0, reason: a b c}\n", "entry 1: line must be a positive"),
        ("- {file: models/universal/masks.py, line: 30, reason: why}\n", "a reason of a few words is required"),
        ("- [\n", "unreadable"),
    ],
)
def test_a_malformed_exemption_is_refused_naming_the_entry(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "coverage-exempt.yaml"
    path.write_text(text)
    with pytest.raises(HarnessError, match=said):
        load_exemptions(path)


def test_the_repositorys_exemptions_are_well_formed_and_name_judged_files() -> None:
    for e in load_exemptions(EXEMPT_FILE):
        assert any(e.file.startswith(s) for area in AREAS.values() for s in area.sources), e


def test_the_verb_reports_and_writes_json_and_html(one_query: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness", "coverage", "--data", str(one_query), "--area", "parity"]
        + ["--json", str(tmp_path / "c.json"), "--html", str(tmp_path / "html"), "--fail-under", "95"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1, out.stderr[-2000:]  # far below the bar
    assert "coverage below the bar: parity" in out.stdout
    record = json.loads((tmp_path / "c.json").read_text())["parity"]
    assert record["walked"] < record["branches"] and f"{MASKS}:" in " ".join(record["missing"])
    assert (tmp_path / "html" / "parity" / "index.html").is_file()


def test_an_error_path_make_test_raises_counts_apart_and_nothing_else_it_walks_does(
    one_query: Path, tmp_path: Path
) -> None:
    """A branch into a `raise` of models/ that no gate walks and a unit test does is an error
    path tested (out of the gates' figure, counted apart); a branch make test walks into
    anything else stays missing, marked as walked by make test (it needs a scenario)."""
    from harness.branch_coverage import tested_arcs

    root = tmp_path / "both"
    (root / "parity").mkdir(parents=True)
    for piece in (one_query / "parity").glob(".coverage.*"):
        (root / "parity" / piece.name).write_bytes(piece.read_bytes())
    config = "rope_theta=1e4, rope_traditional=False, rope_scaling=None, max_position_embeddings=None"
    code = (
        "from types import SimpleNamespace\nfrom models.universal.rope import make_rope\n"
        f"config = SimpleNamespace(attention_head_dim=8, {config}, rope_type='bogus')\n"
        "try:\n    make_rope(config)\nexcept ValueError:\n    pass\n"
    )
    rope = "models/universal/rope.py"
    _record(root, code, plugin="conftest")
    before = next(f for f in measure("parity", root, []).files if f.path == rope)
    figures = measure("parity", root, [], tested=tested_arcs(root))
    after = next(f for f in figures.files if f.path == rope)
    longrope = _line(rope, 'if rope_type == "longrope":', after="def make_rope")
    raising = _line(rope, 'raise ValueError(f"unsupported rope_type', after="def make_rope")
    assert (longrope, raising) in after.error_tested and (longrope, raising) not in after.missing
    assert (longrope, raising) in before.missing and not before.error_tested
    first = _line(rope, 'if rope_type in ("default", "linear"):', after="def make_rope")
    assert (first, first + 3) in after.missing and (first, first + 3) in after.tested  # walked, not an error path
    assert after.judged == before.judged - 1 and figures.error_tested == 1
    assert "1 error paths tested by make test" in render(figures)
    assert "[make test walks it]" in render(figures, listed=100000)


def test_without_make_tests_recording_no_error_path_is_credited(one_query: Path) -> None:
    from harness.branch_coverage import tested_arcs

    assert tested_arcs(one_query) is None
    assert measure("parity", one_query, [], tested=None).error_tested == 0
