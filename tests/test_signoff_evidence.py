"""Issue 53 part 5: fuzzing and mutation figures carried into the sign-off (summary.md, the
page, report.json), read from the files make fuzz and make mutate write, and refused naming
the field when a file is not one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.fileio import atomic_create_json
from harness.fuzz.run import FuzzRun
from harness.mutate import report
from harness.mutate.targets import Target
from harness.signoff.evidence import read_fuzz, read_mutate
from tests.test_signoff import _render, _report


def _mutate_json(path: Path) -> Path:
    """A mutate.json as harness/mutate/cli.py writes it: one module, 3 killed, 1 equivalent, 1 untriaged."""
    found = [
        report.Mutant(f"core/Op#{i}", "core/Op", i + 1, f"{i + 1}: x", "f", outcome)
        for i, outcome in enumerate(["killed", "killed", "timeout", "survived", "survived"])
    ]
    triage = {"core/Op#3": report.Triage("m.py", "core/Op#3", "4: x", "equivalent", "same value")}
    result = report.judge(Target("m.py", tests=("t.py",)), found, triage)
    atomic_create_json(path, {"tool": "cosmic-ray", "modules": [result.as_dict()]})
    return path


def test_the_sign_off_carries_the_fuzz_and_mutation_figures(tmp_path: Path) -> None:
    fuzz = FuzzRun("minicpm5-2b-mini", 5, seed=3)
    fuzz.stats.judged, fuzz.stats.passed, fuzz.stats.seconds = 4, 4, 20.0
    fuzz.write(tmp_path / "fuzz")
    evidence = {
        "fuzz": read_fuzz(tmp_path / "fuzz" / "fuzz.json"),
        "mutate": read_mutate(_mutate_json(tmp_path / "m.json")),
    }
    directory = _render(_report(("m", "a", "decode_logits", "passed")), tmp_path / "with", evidence=evidence)
    summary = (directory / "summary.md").read_text()
    assert (
        "- differential fuzzing: minicpm5-2b-mini: 4/4 examples passed (seed 3, 0.2 examples/s), no finding" in summary
    )
    assert "- mutation testing: m.py: 75.0 % killed (3 of 5, 1 equivalent, 0 known gaps, 1 untriaged)" in summary
    page = (directory / "index.html").read_text()
    assert "mutation testing: m.py: 75.0 % killed" in page and "differential fuzzing: minicpm5-2b-mini" in page
    saved = json.loads((directory / "report.json").read_text())["evidence"]
    assert saved["mutate"]["modules"][0]["untriaged"] == 1 and saved["fuzz"]["judged"] == 4
    without = _render(_report(("m", "a", "decode_logits", "passed")), tmp_path / "without")
    assert "- mutation testing: not given for this sign-off" in (without / "summary.md").read_text()


@pytest.mark.parametrize(
    ("reader", "text", "said"),
    [
        (read_fuzz, "[]", "expected a JSON object"),
        (read_fuzz, '{"model": "m", "findings": [], "judged": 2, "passed": 3}', "passed .3. exceeds judged .2."),
        (read_fuzz, '{"model": "m", "findings": [], "judged": -1, "passed": 0}', "judged must be a count"),
        (read_fuzz, '{"model": "m"}', "a findings list"),
        (read_mutate, '{"modules": []}', "non-empty modules list"),
        (read_mutate, '{"modules": [{"module": "m.py", "mutants": 1, "killed": 1, "timeout": 0}]}', "survived must"),
        (read_mutate, "{", "unreadable"),
    ],
)
def test_malformed_figures_are_refused_naming_the_field(tmp_path: Path, reader, text: str, said: str) -> None:
    path = tmp_path / "figures.json"
    path.write_text(text)
    with pytest.raises(HarnessError, match=said):
        reader(path)
