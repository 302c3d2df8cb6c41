"""Speech pairs go to the Whisper measurement layer (harness/quality/whisper.py, another
module's contract); here it is a fake, so what is tested is the dispatch, the summaries, the
cross-check's parity failure and the report of this side."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main as harness_main
from harness.errors import HarnessError
from harness.quality import run as quality_run
from tests.conftest import write_profile

PROFILE = textwrap.dedent(
    """\
    name: tiny-whisper
    implementation: whisper
    tier: L1
    oracle: mlx-whisper
    artifact:
      source: hub
      repo: example-org/tiny-whisper
      revision: 0123456789abcdef0123456789abcdef01234567
    scenarios:
      - id: fox
        audio: fixtures/audio/fox.wav
        checks: [mel, transcript]
    quality:
      pairs:
        - id: q8
          control: {artifact: profile}
          candidate: {artifact: profile, requantize: {bits: 8, group_size: 64}}
          thresholds: {max_wer: 0.05}
    """
)


@dataclass
class FakeFixtureQuality:
    fixture: str
    kl: np.ndarray
    top1_agree: np.ndarray
    control_text: str
    candidate_text: str
    word_errors: int
    reference_words: int
    cross_check: str


def _install_fake(monkeypatch: pytest.MonkeyPatch, tmp: Path, cross_check: str, word_errors: int) -> dict:
    calls: dict = {}
    fake = types.ModuleType("harness.quality.whisper")

    def build_whisper_candidate(control_dir: Path, *, bits: int, group_size: int) -> Path:
        calls["build"] = (control_dir, bits, group_size)
        out = tmp / f"candidate-{bits}"
        out.mkdir(exist_ok=True)
        return out

    def measure_whisper_pair(*, profile, control_dir, candidate_dir, fixtures, progress=None):
        calls["measure"] = (control_dir, candidate_dir, [f.name for f in fixtures])
        return [
            FakeFixtureQuality(
                "fixtures/audio/fox.wav",
                np.array([0.0, 0.02, 0.04]),
                np.array([1, 1, 0], bool),
                "the quick brown fox",
                "the quick brown box",
                word_errors,
                4,
                cross_check,
            ),
            FakeFixtureQuality(
                "fixtures/audio/two.wav",
                np.array([0.01]),
                np.array([1], bool),
                "a b c d e f",
                "a b c d e f",
                0,
                6,
                "equal",
            ),
        ]

    fake.build_whisper_candidate = build_whisper_candidate
    fake.measure_whisper_pair = measure_whisper_pair
    monkeypatch.setitem(sys.modules, "harness.quality.whisper", fake)
    return calls


def _resolved(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    from harness.quality import sides

    (tmp / "control").mkdir(exist_ok=True)
    (tmp / "control" / "config.json").write_text('{"n_vocab": 51864}')
    control = sides.ResolvedSide(tmp / "control", {"identity": {"source": "hub"}, "tokenizer": "t"}, "real", "control")
    monkeypatch.setattr(quality_run, "resolve_side", lambda profile, side, where: control)


def test_a_speech_pair_is_summarized_from_the_layers_fixtures(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(isolated, "tiny-whisper", PROFILE)
    calls = _install_fake(monkeypatch, isolated, "equal", word_errors=1)
    _resolved(monkeypatch, isolated)
    assert (
        harness_main(["quality", "--model", "tiny-whisper"]) == 3
    )  # WER 1/10 > max_wer 0.05: a quality FAIL, no parity failure
    assert calls["build"] == (isolated / "control", 8, 64)
    assert calls["measure"][2] == ["fox.wav"]  # the profile's speech fixtures by default
    (report,) = (isolated / "reports").glob("quality-tiny-whisper-*/quality.json")
    (pair,) = json.loads(report.read_text())["pairs"]
    assert pair["source"] == "computed"
    assert pair["summary"]["steps"] == 4 and pair["summary"]["wer"] == pytest.approx(0.1)
    assert pair["summary"]["top1_agreement"]["value"] == pytest.approx(0.75)
    assert pair["quality"]["status"] == "FAIL" and "max_wer" in pair["quality"]["reasons"][0]
    assert pair["cross_check"]["status"] == "equal"
    calls.clear()
    assert harness_main(["quality", "--model", "tiny-whisper"]) == 3  # a second run: served from the cache
    assert "measure" not in calls
    again = max((isolated / "reports").glob("quality-tiny-whisper-*/quality.json"), key=lambda p: p.stat().st_mtime_ns)
    (cached,) = json.loads(again.read_text())["pairs"]
    assert cached["source"] == "cached" and cached["summary"] == pair["summary"]


def test_a_speech_cross_check_difference_is_a_parity_failure(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(isolated, "tiny-whisper", PROFILE)
    _install_fake(monkeypatch, isolated, "differs: step 2 logits", word_errors=0)
    _resolved(monkeypatch, isolated)
    assert harness_main(["quality", "--model", "tiny-whisper"]) == 1
    (report,) = (isolated / "reports").glob("quality-tiny-whisper-*/quality.json")
    (pair,) = json.loads(report.read_text())["pairs"]
    assert pair["cross_check"]["status"] == "differs" and "fox.wav: differs: step 2" in pair["cross_check"]["detail"]


def test_without_the_layer_the_error_names_it(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(isolated, "tiny-whisper", PROFILE)
    _resolved(monkeypatch, isolated)
    monkeypatch.setitem(sys.modules, "harness.quality.whisper", None)  # its import fails, as when absent
    with pytest.raises(HarnessError, match=r"harness/quality/whisper.py.*not in this tree"):
        quality_run.whisper_layer()
    assert harness_main(["quality", "--model", "tiny-whisper"]) == 2
    assert not list((isolated / "reports").iterdir())  # nothing written
