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


# -- probe 2 (hostile-probe-2.md) M8: a malformed report is one line naming the file and the field --


def _variant(name: str) -> dict:
    """The probe's malformed reports, made from a real one (M5-M11)."""
    report = json.load(gzip.open(CPU_FAIL, "rt"))
    failed = next(i for i, r in enumerate(report["results"]) if r["outcome"] == "failed")
    if name == "nomodel":
        del report["results"][0]["model"]
    elif name == "nullsummary":
        report["results"][failed]["summary"] = None
    elif name == "resultsdict":
        report["results"] = {"a": report["results"][0]}
    elif name == "intsummary":
        report["results"][failed]["summary"] = 12345
    elif name == "listmodel":
        report["results"][0]["model"] = ["smollm2-135m", "x"]
    elif name == "slashkey":
        report["context"]["device"]["key"] = "cpu/../evil"
    elif name == "perstep":
        report["results"][failed]["details"]["per_step"] = [1, 2]
    return report


MALFORMED = [
    ("M5", "nomodel", "results[0].model: expected a non-empty string, missing"),
    ("M6", "nullsummary", "results[{failed}].summary: expected a string, got null"),
    ("M7", "resultsdict", "results: expected a list of check results, got an object"),
    ("M8", "intsummary", "results[{failed}].summary: expected a string, got the number 12345"),
    ("M9", "listmodel", "results[0].model: expected a non-empty string, got a list"),
    ("M10", "trunc.gz", "cannot read a JSON report: a truncated gzip file"),
    ("M11", "slashkey", "context.device.key: expected the golden key: a name of letters, digits and . _ + -"),
    ("M8", "perstep", "results[{failed}].details.per_step: expected a list of objects"),
]


def _write_variant(tmp_path: Path, name: str) -> Path:
    if name == "trunc.gz":
        data = gzip.compress(json.dumps(json.load(gzip.open(CPU_FAIL, "rt"))).encode())
        path = tmp_path / "trunc.json.gz"
        path.write_bytes(data[: len(data) // 2])
    else:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_variant(name)))
    return path


@pytest.mark.parametrize("verb", ["matrix", "signoff"])
@pytest.mark.parametrize(("case", "name", "says"), MALFORMED)
def test_m8_m5_m11_a_malformed_report_is_one_line_naming_the_file_and_field(
    tmp_path: Path, capsys, verb: str, case: str, name: str, says: str
) -> None:
    """M8 (M5-M11): matrix and signoff --from-report read a report with one reader
    (harness/report.py read_report): a malformed one is exit 2, one line naming the file, the
    field and what was expected; nothing is written."""
    path = _write_variant(tmp_path, name)
    failed = next(i for i, r in enumerate(json.load(gzip.open(CPU_FAIL, "rt"))["results"]) if r["outcome"] == "failed")
    out = tmp_path / "out"
    if verb == "matrix":
        code = cli(["matrix", str(path), "--out", str(out)])
    else:
        (tmp_path / "none.yaml").write_text("[]\n")
        code = cli(["signoff", "--from-report", str(path), "--out", str(out), "--waivers", str(tmp_path / "none.yaml")])
    err = capsys.readouterr().err
    assert code == 2, (case, err)
    assert err.startswith(f"error: {path}: {says.format(failed=failed)}"), (case, err)
    assert len(err.strip().splitlines()) == 1 and not out.exists(), (case, err)


def test_m8_l16_a_gzip_bomb_is_refused_past_the_read_limit(tmp_path: Path, capsys, monkeypatch) -> None:
    """L16 (M16): a report is read up to READ_LIMIT bytes after gzip, never further: a bomb is
    refused naming the limit (the probe's 1.5 MB of 1.5 GB cost 3.1 GB before)."""
    from harness import report

    assert report.READ_LIMIT == 256 << 20  # as shipped; 1 MiB here, so that the bomb is small
    monkeypatch.setattr(report, "READ_LIMIT", 1 << 20)
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(b'{"results": [], "context": {}, "pad": "' + b" " * (4 << 20) + b'"}')
    assert bomb.stat().st_size < 64 << 10
    reads = []
    real_open = gzip.open

    def counting_open(*args, **kwargs):
        handle = real_open(*args, **kwargs)
        read = handle.read
        handle.read = lambda n=-1: reads.append(n) or read(n)
        return handle

    monkeypatch.setattr(gzip, "open", counting_open)
    assert cli(["matrix", str(bomb), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {bomb}: cannot read a JSON report: larger than 1 MiB once decompressed (a gzip bomb?); " + (
        "refused, not read further\n"
    )
    assert reads == [(1 << 20) + 1] and not (tmp_path / "m").exists()  # one bounded read, nothing written


def test_m8_l17_matrix_out_naming_a_file_is_refused(tmp_path: Path, capsys) -> None:
    """L17 (M20): `matrix --out <an existing file>` is refused naming it (was NotADirectoryError)."""
    target = tmp_path / "afile"
    target.write_text("mine\n")
    assert _matrix(target, CPU_PASS) == 2
    assert capsys.readouterr().err == f"error: --out {target}: a file, not a folder: name a new folder for the " + (
        "matrix's two files\n"
    )
    assert target.read_text() == "mine\n"
    under = tmp_path / "afile" / "m"  # under a file: the write fails, named
    assert _matrix(under, CPU_PASS) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {under}: cannot write the matrix there: ")


def test_m8_a_good_report_still_reads_as_before(tmp_path: Path) -> None:
    """The reader's checks pass every report the harness writes (both fixtures, an H200 run)."""
    from harness.report import read_report

    for path in (CPU_FAIL, CPU_PASS, H200):
        assert read_report(path)["results"]


def test_hostile_text_stays_text_in_the_markdown() -> None:
    """Hostile probe 2, L18 (M21): a check name with '|', a newline, '## heading' and a
    javascript: link broke matrix.md's table and injected a heading and a link."""
    from harness.markdown import md_code, md_text

    hostile = "x|y\n## heading [x](javascript:alert(1)) <script>&"
    text = md_text(hostile)
    assert "\n" not in text and "|" not in text.replace("\\|", "")
    assert "<script>" not in text and "&lt;script&gt;" in text and "&amp;" in text
    assert "\\[x\\](javascript" in text and "prefill_logits" == md_text("prefill_logits")
    assert md_code("a`b|c\nd") == "`a'b\\|c d`"
