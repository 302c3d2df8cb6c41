"""`python -m harness matrix`: reports and results stores from several machines merged into
one page and one Markdown table, each failure linked; different harness versions refused.

Inputs are reports real runs wrote: this CPU's failing run (tests/fixtures/screens/, every
in-tree RMSNorm nudged) and an H200 run (docs/gpu-runs/).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from harness.__main__ import main as cli
from harness.history import store
from harness.paths import REPO_ROOT

CPU_FAIL = Path(__file__).parent / "fixtures" / "screens" / "parity-fail.json.gz"
CPU_PASS = Path(__file__).parent / "fixtures" / "screens" / "parity-pass.json.gz"
H200 = REPO_ROOT / "docs" / "gpu-runs" / "parity-smollm2-135m-20261130T195436156598Z.json"


def _matrix(out: Path, *inputs: Path | str, capsys=None) -> int:
    return cli(["matrix", *map(str, inputs), "--out", str(out)])


def test_a_cpu_and_an_h200_report_make_one_matrix_with_linked_failures(tmp_path: Path) -> None:
    assert _matrix(tmp_path / "m", CPU_FAIL, H200) == 0
    md = (tmp_path / "m" / "matrix.md").read_text()
    cpu = json.load(gzip.open(CPU_FAIL, "rt"))["context"]["device"]["key"]
    gpu = json.loads(H200.read_text())["context"]["device"]["key"]
    assert f"| `{cpu}` |" in md and f"| `{gpu}` |" in md  # the golden key's parts, per device
    row = next(line for line in md.splitlines() if line.startswith("| smollm2-135m / plain / prefill_logits |"))
    assert re.fullmatch(r"\| smollm2-135m / plain / prefill_logits \| \[FAIL\]\(#f\d+\) \| ✓ \|", row), row
    anchor = re.search(r"#(f\d+)", row).group(1)
    assert f'<a id="{anchor}"></a>**smollm2-135m/plain/prefill_logits**' in md
    assert "first diverging module `model.layers.0.input_layernorm`" in md
    html = (tmp_path / "m" / "index.html").read_text()
    assert f'id="{anchor}"' in html and f'href="#{anchor}"' in html
    failing = sum(r["outcome"] != "passed" for r in json.load(gzip.open(CPU_FAIL, "rt"))["results"])
    assert len(re.findall(r'<div id="f\d+" class="failure">', html)) == failing


def test_the_newest_result_per_device_wins_and_a_store_reads_as_its_reports(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store, "checkout_state", lambda: ("abc1234", False))
    db = tmp_path / "history.sqlite"
    for path in (CPU_FAIL, CPU_PASS):  # recorded in this order; the failing run finished later
        store.record(db, "parity", json.load(gzip.open(path, "rt")), None)
    assert _matrix(tmp_path / "from-db", db) == 0
    assert _matrix(tmp_path / "from-reports", CPU_FAIL, CPU_PASS) == 0
    from_db = (tmp_path / "from-db" / "matrix.md").read_text()
    from_reports = (tmp_path / "from-reports" / "matrix.md").read_text()
    assert "FAIL" in from_db and "FAIL" in from_reports  # the newer (failing) run's results
    table = [line for line in from_db.splitlines() if line.startswith("| smollm2-135m /")]
    assert table == [line for line in from_reports.splitlines() if line.startswith("| smollm2-135m /")]


def test_different_harness_versions_are_refused_unless_asked(tmp_path: Path, capsys) -> None:
    other = json.load(gzip.open(CPU_PASS, "rt")) | {"harness_version": "0.0.9"}
    older = tmp_path / "older.json"
    older.write_text(json.dumps(other))
    assert _matrix(tmp_path / "m", older, H200) == 2
    assert "different harness versions (0.0.9: older.json; 0.1.0:" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    assert cli(["matrix", str(older), str(H200), "--out", str(tmp_path / "m"), "--mixed-versions"]) == 0
    assert "**Mixed harness versions**: 0.0.9, 0.1.0" in (tmp_path / "m" / "matrix.md").read_text()


def test_a_matrix_is_never_written_over_another(tmp_path: Path, capsys) -> None:
    assert _matrix(tmp_path / "m", H200) == 0
    before = (tmp_path / "m" / "matrix.md").read_bytes()
    assert _matrix(tmp_path / "m", CPU_PASS) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (tmp_path / "m" / "matrix.md").read_bytes() == before


def test_the_matrix_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    from tests.test_signoff import _browse

    assert _matrix(tmp_path / "m", CPU_FAIL, H200) == 0
    run = _browse(tmp_path / "m" / "index.html", "--virtual-time-budget=5000", "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    body = dom.split('<table id="matrix">')[1].split("</table>")[0]
    rows = body.count("<tr>") - 1  # the header row
    assert rows == len(json.load(gzip.open(CPU_FAIL, "rt"))["results"])
    assert dom.count('class="cell failed"') == 50 and 'id="mixed"' not in dom


@pytest.mark.parametrize("bad", ["nothing.json", "not-json.json"])
def test_an_input_that_is_not_a_report_is_named(tmp_path: Path, capsys, bad: str) -> None:
    path = tmp_path / bad
    if bad == "not-json.json":
        path.write_text("{oops")
    assert _matrix(tmp_path / "m", path) == 2
    assert str(path) in capsys.readouterr().err
