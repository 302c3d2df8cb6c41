"""Differential fuzzing against the oracle (harness/fuzz/, docs/fuzz.md): what it draws is what a
profile accepts and reaches the paths it exists for; a small fixed-seed run passes on the
in-tree implementation; a fault no scenario was written for is found and shrunk into a scenario
a profile can keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from harness.checks import registry
from harness.cli import main as harness_main
from harness.fuzz.run import Finding, FuzzRun
from harness.fuzz.strategies import MARKERS, chat_scenarios
from harness.profile.load import find_profile, load_profile, scenario_from_dict
from harness.tools import mutant_faults as fault

EOS = [1, 130073]
MODEL = "minicpm5-2b-mini"


def toy_encode(text: str) -> list[int]:
    """A stand-in tokenizer for the strategy's own tests: one id per UTF-8 byte."""
    return [300 + b for b in text.encode()]


def _whole_characters(data: list[int]) -> bool:
    try:
        bytes(data).decode()
    except UnicodeDecodeError:
        return False
    return True


def _as_profile_scenario(data: dict) -> dict:
    scenario = {"id": "fuzz-example", **data}
    asked = registry.asked_for(find_profile(MODEL), scenario_from_dict(scenario, "example"))
    return scenario | ({"checks": [*find_profile(MODEL).defaults.checks, *asked]} if asked else {})


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(chat_scenarios(toy_encode, EOS))
def test_every_drawn_scenario_is_one_the_profile_accepts(data: dict) -> None:
    profile = load_profile(Path(find_profile(MODEL).source_file), [_as_profile_scenario(data)])
    assert [s.id for s in profile.scenarios] == ["fuzz-example"]


def test_the_draws_reach_the_paths_the_fuzzer_exists_for() -> None:
    """Over 300 draws: a wrapped rotating window across turns, quantized KV from a late start, a
    chunked prefill, a forced EOS mid-stream and a stop there, a character cut mid-way, a marker
    sharing a forced text with other text (each one path a missed outside fault sat on)."""
    seen: dict[str, int] = dict.fromkeys(
        ("rotating-turns", "late-quantized", "chunked", "eos-mid", "stop-eos", "cut-multibyte", "marker-in-text"), 0
    )

    @settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(chat_scenarios(toy_encode, EOS))
    def draw(data: dict) -> None:
        forced = data.get("forced_prefix", [])
        seen["rotating-turns"] += "turns" in data and data.get("max_kv_size", 999) < 40
        seen["late-quantized"] += data.get("quantized_kv_start", 0) > 20
        seen["chunked"] += data.get("prefill_step_size", 2048) < 16
        seen["eos-mid"] += any(t in EOS for t in forced[:-1])
        seen["stop-eos"] += data.get("stop") == "eos"
        seen["cut-multibyte"] += not _whole_characters([t - 300 for t in forced if t not in EOS])
        texts = [f["text"] for f in (data.get("response") or {}).get("forced", [])]
        seen["marker-in-text"] += any(m in t and t != m for t in texts for m in MARKERS)

    draw()
    assert all(seen.values()), seen


def test_a_finding_is_written_as_a_scenario_the_profile_loads(tmp_path: Path) -> None:
    data = {"steps": 1, "turns": [[{"role": "user", "content": "Hi."}]] * 2, "max_kv_size": 8}
    finding = Finding("prefill_logits", data, {"prefill_logits": "first differing step 2", "decode_logits": "x"})
    text = finding.as_yaml(MODEL)
    assert text.startswith("# Found by `python -m harness fuzz --model minicpm5-2b-mini`")
    assert "#   prefill_logits: first differing step 2" in text
    loaded = yaml.safe_load(text)
    profile = load_profile(Path(find_profile(MODEL).source_file), loaded)
    assert profile.scenarios[0].id == finding.scenario_id() and profile.scenarios[0].max_kv_size == 8
    run = FuzzRun(MODEL, 1, findings={"prefill_logits": finding})
    written = run.write(tmp_path / "out")
    assert [p.name for p in written] == [f"found-1-{finding.scenario_id()}.yaml"]
    summary = json.loads((tmp_path / "out" / "fuzz.json").read_text())
    assert summary["findings"][0]["first_failing_check"] == "prefill_logits"
    with pytest.raises(FileExistsError):  # a new folder each run: nothing is overwritten
        run.write(tmp_path / "out")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--examples", "0"], "--examples 0: expected 1..100000"),
        (["--max-steps", "65"], "--max-steps 65: expected 1..64"),
        (["--mutant", "no-such"], "--mutant 'no-such': no such mutant"),
    ],
)
def test_bad_input_is_refused_naming_it(args: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert harness_main(["fuzz", *args, "--no-database", "--out", str(tmp_path / "f")]) == 2
    assert message in capsys.readouterr().out
    assert not (tmp_path / "f").exists()


def test_an_existing_out_folder_is_refused_and_kept(tmp_path: Path, capsys) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "keep").write_text("mine")
    assert harness_main(["fuzz", "--examples", "1", "--no-database", "--out", str(tmp_path / "f")]) == 2
    assert "exists; the fuzzer writes a new folder" in capsys.readouterr().out
    assert (tmp_path / "f" / "keep").read_text() == "mine"


def test_a_fixed_seed_run_passes_on_the_in_tree_implementation() -> None:
    run = FuzzRun(MODEL, 4, seed=0, shrink=False)
    run.run()
    assert run.findings == {}, {k: f.summaries for k, f in run.findings.items()}
    assert run.stats.judged >= 3 and run.stats.passed == run.stats.judged


def test_a_fault_is_found_and_shrunk_into_a_scenario(tmp_path: Path) -> None:
    """A final-norm epsilon off (mutant final-norm-eps) fails every example: the fuzzer stops at
    the first, shrinks it to the least it can (one message, one step, no cache options) and
    writes it out; the logits checks name it."""
    run = FuzzRun(MODEL, 3, seed=0, model_hook=fault.final_norm_eps)
    run.run()
    assert list(run.findings) == ["prefill_logits"], list(run.findings)
    shrunk = run.findings["prefill_logits"].scenario
    assert shrunk["steps"] == 1 and "messages" in shrunk, shrunk
    assert not {"max_kv_size", "kv_bits", "forced_prefix", "response", "turns"} & set(shrunk), shrunk
    assert "differ" in run.findings["prefill_logits"].summaries["prefill_logits"]


def test_a_fault_on_a_path_no_scenario_named_is_found() -> None:
    """rotating-wrapped-order (a wrapped ring reordered wrongly before a multi-token write) passes
    rotating-kv and rotating-kv-chunked; the fuzzer's turns over a small window find it."""
    run = FuzzRun(MODEL, 30, seed=1, shrink=False, patch=fault.rotating_wrapped_order)
    run.run()
    assert run.findings, run.stats.as_dict()
    found = next(iter(run.findings.values())).scenario
    assert "turns" in found and "max_kv_size" in found, found
