"""VAD `segments` proves it compared speech (issue 31 part 1): two empty segment lists are
identical whatever the in-tree timestamp rules do, so on a fixture the profile declares as speech
(`speech:` in profiles/vad/silero-vad.yaml) the package's segments must be non-empty under every
option set, or the check is an ERROR, "nothing exercised"; over the profile, each option set must
be walked by some fixture, and every run prints who walked it (harness/checks/vad.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from harness import vad_session
from harness.artifacts.vad import resolve_vad_weights
from harness.checks.vad import (
    AT_LEAST_ONE_SEGMENT,
    gate_fixture,
    segments_coverage,
    walked_segments,
)
from harness.errors import NothingComparedError, ProfileError
from harness.goldens.vad import ensure_goldens
from harness.paths import profiles_dir
from harness.profile.vad import load_vad_profile
from harness.vad_session import VadRun


@pytest.fixture(scope="module")
def profile():
    return load_vad_profile()


@pytest.fixture(scope="module")
def model(profile):
    from models.vad import load_model

    return load_model(resolve_vad_weights(profile))


@pytest.fixture(scope="module")
def goldens(profile):
    return ensure_goldens(profile, profile.fixtures)


def _silent(oracle):
    """The oracle's record of a fixture as if the package had found no speech in it."""
    return dataclasses.replace(oracle, segments={name: [] for name in oracle.segments})


# -- the real fixtures walk it ---------------------------------------------------------------------


def test_every_speech_fixture_walks_segments_under_every_option_set(profile, model, goldens) -> None:
    assert set(profile.speech) == {"fox.wav", "weather.wav", "message.wav", "long.wav", "fox-cut.wav"}
    verdicts = [gate_fixture(profile, model, goldens[f], check_streaming=False) for f in profile.fixtures]
    for verdict in verdicts:
        segments = [c for c in verdict.checks if c.name.startswith("segments[")]
        assert len(segments) == len(profile.timestamp_options), verdict.fixture
        for check in segments:
            assert check.passed and not check.nothing_exercised, (verdict.fixture, check.detail)
            speech = verdict.fixture in profile.speech
            assert check.details["walked"] == ([AT_LEAST_ONE_SEGMENT] if speech else []), (verdict.fixture, check)
    coverage = segments_coverage(profile, walked_segments(verdicts, profile))
    assert coverage.row is None, coverage.line
    walkers = "fox.wav, weather.wav, message.wav, long.wav, fox-cut.wav"  # silence and noise rightly have none
    assert coverage.line == (
        "exercise silero-vad segments (at least one segment): "
        + "; ".join(f"segments[{o}]: {walkers}" for o in profile.timestamp_options)
    )


# -- a speech fixture with no segment is an ERROR ----------------------------------------------------


def test_a_speech_fixture_whose_oracle_segments_are_empty_is_an_error(profile, model, goldens) -> None:
    verdict = gate_fixture(profile, model, _silent(goldens["fox.wav"]), check_streaming=False)
    segments = [c for c in verdict.checks if c.name.startswith("segments[")]
    assert segments and all(c.nothing_exercised and not c.passed for c in segments)
    assert all(c.details["walked"] == [] for c in segments)
    assert "its verdict: 4 segment(s) vs package 0" in segments[0].detail  # the in-tree side did find speech
    run = VadRun(profile, ["fox.wav"])
    run._model, run._goldens = model, {"fox.wav": _silent(goldens["fox.wav"])}
    with pytest.raises(
        NothingComparedError,
        match=r"nothing exercised: silero-vad/fox\.wav segments\[default\]: 0 segments on a speech fixture",
    ):
        run.check("fox.wav", "segments[default]")
    assert run.check("fox.wav", "probabilities").passed  # the other checks of the fixture still judge
    # The same empty record on a fixture not declared as speech is an ordinary comparison: the
    # in-tree side's 4 segments against none, a FAIL, not an ERROR.
    quiet = dataclasses.replace(profile, speech=tuple(f for f in profile.speech if f != "fox.wav"))
    judged = gate_fixture(quiet, model, _silent(goldens["fox.wav"]), check_streaming=False).checks
    segment_verdicts = [(c.passed, c.nothing_exercised) for c in judged if c.name.startswith("segments[")]
    assert segment_verdicts == [(False, False)] * len(profile.timestamp_options)


def test_an_empty_speech_fixture_is_an_error_row_through_make_parity(
    profile, goldens, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.__main__ import main

    def silent_goldens(p, fixtures, update=False):
        return {f: _silent(goldens[f]) for f in fixtures}

    monkeypatch.setattr(vad_session, "ensure_goldens", silent_goldens)
    report_path = tmp_path / "report.json"
    code = main(
        ["parity", "--model", "silero-vad", "--report", str(report_path), "--", "-p", "no:xdist", "-k", "fox.wav"]
    )
    report = json.loads(report_path.read_text())
    outcome = {r["check"]: (r["outcome"], r["summary"]) for r in report["results"]}
    assert code == 1 and report["verdict"] != "PASS"
    for name in profile.timestamp_options:
        state, summary = outcome[f"segments[{name}]"]
        assert state == "error" and "0 segments on a speech fixture" in summary, (name, summary)
    assert outcome["probabilities"][0] == "passed" and outcome["streaming"][0] == "passed"


# -- judged over the profile -----------------------------------------------------------------------


def test_an_option_set_no_fixture_walked_is_a_nothing_exercised_row(profile) -> None:
    options = list(profile.timestamp_options)
    walked = {
        (f, o): ([AT_LEAST_ONE_SEGMENT] if f == "fox.wav" and o != "strict" else [])
        for f in profile.fixtures
        for o in options
    }
    coverage = segments_coverage(profile, walked)
    assert coverage.row is not None and coverage.row.outcome == "error"
    assert (coverage.row.model, coverage.row.scenario, coverage.row.check) == ("silero-vad", "(profile)", "segments")
    assert coverage.row.summary.startswith("nothing exercised: no fixture of silero-vad walked 'segments[strict]'")
    assert coverage.row.details["not_walked"] == ["segments[strict]"]
    assert "segments[default]: fox.wav" in coverage.line and coverage.line.endswith("(NOTHING EXERCISED)")
    # A selection that left fixtures out judges nothing: said, never an error nor a pass.
    partial = {k: v for k, v in walked.items() if k[0] != "long.wav"}
    unjudged = segments_coverage(profile, partial)
    assert unjudged.row is None and "(not judged: 1 fixture(s) not run or without a result (long.wav))" in unjudged.line


def test_speech_names_the_profiles_own_fixtures(tmp_path: Path) -> None:
    data = yaml.safe_load((profiles_dir() / "vad" / "silero-vad.yaml").read_text())
    path = tmp_path / "silero-vad.yaml"
    for bad, match in (
        (["fox.wav", "german.wav"], r"speech: \['german.wav'\] — each entry must be one of the profile's fixtures"),
        (["fox.wav", "fox.wav"], r"speech: .*named once"),
        ("fox.wav", r"speech: expected a list of the fixtures that hold speech"),
    ):
        path.write_text(yaml.safe_dump(data | {"speech": bad}))
        with pytest.raises(ProfileError, match=match):
            load_vad_profile(path)
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if k != "speech"}))
    with pytest.raises(ProfileError, match=r"expected exactly the keys"):
        load_vad_profile(path)
