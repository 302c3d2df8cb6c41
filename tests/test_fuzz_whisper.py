"""Differential fuzzing of a Whisper profile (harness/fuzz/speech.py, docs/fuzz.md): every drawn
scenario is one the profile loads, the draws reach each audio edit and decode option, a small
fixed-seed run passes on the in-tree implementation, and a planted fault is found, shrunk and
written out as a scenario that loads, with its WAV beside it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from harness.checks import registry
from harness.cli import main as harness_main
from harness.fuzz import run as fuzz_run
from harness.fuzz import speech
from harness.fuzz.run import FuzzRun
from harness.oracle.descriptor import descriptor
from harness.paths import REPO_ROOT
from harness.profile.inputs import read_yaml
from harness.profile.load import find_profile, load_profile, scenario_from_dict
from harness.tools import mutant_faults as fault

MODEL = "whisper-tiny-en"
FAST = "whisper-large-v3-turbo-mini"  # seeded small weights: an example in seconds, not minutes


def _as_profile_scenario(model: str, data: dict[str, Any]) -> dict[str, Any]:
    scenario = {"id": "fuzz-example", **data}
    asked = registry.asked_for(find_profile(model), scenario_from_dict(scenario, "example"))
    return scenario | ({"checks": [*find_profile(model).defaults.checks, *asked]} if asked else {})


def _load_with(model: str, scenario: dict[str, Any]) -> Any:
    """The profile with `scenario` beside its own (its certificate names them), as the fuzzer loads it."""
    path = Path(find_profile(model).source_file)
    return load_profile(path, [*read_yaml(path)["scenarios"], scenario])


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(speech.whisper_scenarios())
def test_every_drawn_scenario_is_one_the_profile_accepts(data: dict[str, Any]) -> None:
    profile = _load_with(MODEL, _as_profile_scenario(MODEL, data))
    assert profile.scenarios[-1].id == "fuzz-example"
    assert (REPO_ROOT / data["audio"]).resolve().is_relative_to(speech.AUDIO_DIR.resolve())


def test_a_multilingual_draw_is_one_the_multilingual_profile_accepts() -> None:
    @settings(max_examples=15, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(speech.whisper_scenarios(multilingual=True))
    def draw(data: dict[str, Any]) -> None:
        _load_with(FAST, _as_profile_scenario(FAST, data))

    draw()


def test_the_draws_reach_each_audio_edit_and_decode_option() -> None:
    """Over 300 draws: two clips, a cut, a pause, a clip brought to either side of the 30 s
    window, a gain that clips, and every decode option kind (fallback ladders, sampling with
    candidates, thresholds, prompt, timestamps, words, clip ranges, token caps, streaming)."""
    edits = ("two-clips", "cut", "pause", "just-under-30s", "just-over-30s", "gain-clipped", "quiet")
    options = (
        "greedy", "default-ladder", "ladder", "sampled", "best_of", "condition_on_previous_text", "initial_prompt",
        "without_timestamps", "word_timestamps", "hallucination_silence_threshold", "no_speech_threshold",
        "logprob_threshold", "compression_ratio_threshold", "sample_len", "suppress_blank", "max_initial_timestamp",
        "clip_timestamps", "language", "stream_chunks",
    )  # fmt: skip
    seen = dict.fromkeys(edits + options, 0)

    @settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(speech.audio_recipes(), speech.whisper_options(False, 12))
    def draw(recipe: dict[str, Any], scenario: dict[str, Any]) -> None:
        samples = speech.edited(recipe)
        seen["two-clips"] += len(recipe["clips"]) == 2
        seen["cut"] += "cut" in recipe
        seen["pause"] += "silence" in recipe and recipe["silence"][1] < 3 * speech.RATE
        near = abs(len(samples) - speech.WINDOW) <= speech.NEAR_WINDOW
        seen["just-under-30s"] += near and len(samples) <= speech.WINDOW
        seen["just-over-30s"] += near and len(samples) > speech.WINDOW
        seen["gain-clipped"] += recipe.get("gain", 1) > 1 and bool((abs(samples.astype(int)) >= 32767).any())
        seen["quiet"] += recipe.get("gain", 1) < 0.5
        chosen = scenario["options"]
        temperature = chosen.get("temperature")
        seen["greedy"] += temperature == 0.0
        seen["default-ladder"] += "temperature" not in chosen
        seen["ladder"] += isinstance(temperature, list)
        seen["sampled"] += isinstance(temperature, float) and temperature > 0
        for key in options[4:-1]:
            seen[key] += key in chosen
        seen["stream_chunks"] += "stream_chunks" in scenario

    draw()
    assert all(seen.values()), {k: v for k, v in seen.items() if not v}


def test_an_edit_is_written_once_by_its_content_with_its_recipe(tmp_path: Path) -> None:
    recipe = {"clips": ["fox.wav", "silence.wav"], "cut": [100, 40_100], "silence": [5, 7], "gain": 4.0}
    path = speech.write_audio(recipe, tmp_path)
    assert path == speech.write_audio(dict(recipe), tmp_path)
    assert len(speech.edited(recipe)) == 40_007 and speech.recipe_of(path) == recipe
    assert path.stat().st_size == 44 + 2 * 40_007


def test_a_profile_whose_oracle_has_no_warm_process_is_refused_naming_those_that_have(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    without = dataclasses.replace(descriptor("mlx-whisper"), scripts=("generate.py",))
    monkeypatch.setattr(fuzz_run, "descriptor", lambda name: without)
    assert harness_main(["fuzz", "--model", MODEL, "--no-database", "--out", str(tmp_path / "f")]) == 2
    out = capsys.readouterr().out
    assert "whisper-tiny-en is judged by mlx-whisper: the fuzzer draws chat or transcription scenarios" in out
    assert "(mlx-lm, mlx-whisper)" in out and not (tmp_path / "f").exists()


def test_a_fixed_seed_run_passes_on_the_in_tree_implementation() -> None:
    """Seed 2's first three examples (a 6 s clip greedy; 4 s and 5 s edits through drawn
    fallback ladders, clip ranges, prompts): all pass. The seed is picked for a short run (an
    example with word timestamps and the hallucination rule on a 41 s edit costs minutes)."""
    run = FuzzRun(FAST, 3, seed=2, shrink=False, max_steps=8)
    run.run()
    assert run.findings == {}, {k: f.summaries for k, f in run.findings.items()}
    assert run.stats.judged == 3 and run.stats.passed == 3, run.stats.as_dict()


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
def test_a_fault_on_a_path_is_found_shrunk_and_written_with_its_audio(tmp_path: Path) -> None:
    """The log-probability fallback rule dropped (mutant fallback-logprob) passes seed 14's first
    example (greedy, no threshold reached) and fails its second (the default ladder: the twin's
    random weights never reach the threshold): the fuzzer finds it, shrinks it within its budget
    and writes it out with its WAV beside it; the scenario loads."""
    run = FuzzRun(FAST, 2, seed=14, max_steps=8, patch=fault.no_logprob_fallback, shrink_budget=3)
    run.run()
    assert 2 < run.stats.judged <= 2 + 3 and run.stats.passed >= 1, run.stats.as_dict()  # shrinking, in budget
    # Fewer decode calls than the oracle's fail encoder_output first; as many (the last rung's
    # decision), fallback_decisions: each a finding of its own, fallback_decisions in both.
    assert run.findings and all("fallback_decisions" in f.summaries for f in run.findings.values()), run.findings
    finding = next(iter(run.findings.values()))
    written = run.write(tmp_path / "out")
    text = written[0].read_text()
    assert f"#   {finding.origin}: " in text and "made from fixtures/audio by {" in text
    scenario = yaml.safe_load(text)[0]
    assert (tmp_path / "out" / Path(scenario["audio"]).name).is_file()
    assert _load_with(FAST, scenario).scenarios[-1].id == scenario["id"]
    summary = json.loads((tmp_path / "out" / "fuzz.json").read_text())
    assert summary["findings"][0]["first_failing_check"] == finding.origin
