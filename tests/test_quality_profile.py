"""The `quality:` section of a profile: bad input is a ProfileError naming the key, before
anything runs or is written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.errors import ProfileError
from harness.profile.load import find_profile, load_profile
from tests.conftest import VALID_PROFILE, write_profile

CORPUS = "fixtures/corpus/kjv-genesis-1-12.txt"


def _profile(root: Path, quality: str) -> Path:
    text = VALID_PROFILE.format(name="tiny") + textwrap.dedent(quality)
    return write_profile(root, "tiny", text)


def _error(root: Path, quality: str) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(_profile(root, quality))
    return str(info.value)


GOOD = f"""\
quality:
  corpus: {{path: {CORPUS}, context: 64, chunk: 16}}
  pairs:
    - id: kv8
      control: {{artifact: profile}}
      candidate: {{artifact: profile, kv: {{bits: 8, group_size: 64}}}}
"""


def test_a_valid_section_loads_into_typed_objects(isolated: Path) -> None:
    profile = load_profile(_profile(isolated, GOOD))
    pair = profile.quality.pairs[0]
    assert pair.candidate.kv.kind == "quantized" and pair.oracle_of_llm == "mlx-lm"
    assert profile.quality.corpus.settings() == {"context": 64, "stride": 64, "chunk": 16, "max_windows": None}


def test_the_shipped_profiles_carry_their_pairs() -> None:
    smol = find_profile("smollm2-135m").quality
    kinds = {p.id: p.candidate.kv.kind for p in smol.pairs}
    assert kinds == {
        "kv8-g64": "quantized",
        "kv4-g64": "quantized",
        "kv4-g32": "quantized",
        "rotating-kv4-g64": "rotating_quantized_kv",
        "mixed-kv": "mixed_kv",
    }
    assert {p.oracle_of_llm for p in smol.pairs} == {"mlx-lm", "mlx-optiq"}
    for name in ("minicpm5-2b", "minicpm5-2b-mini"):
        (pair,) = find_profile(name).quality.pairs
        assert pair.control.twin is not None and pair.candidate.artifact == "profile"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # a KV setting the oracle cannot run
        ("kv: {bits: 7, group_size: 64}", "quality.pairs[0].candidate.kv.bits: expected one of"),
        ("kv: {bits: 8, group_size: 48}", "quality.pairs[0].candidate.kv.group_size"),
        ("kv: {bits: 4, max_kv_size: 32, quantized_kv_start: 8}", "quantized_kv_start: a rotating quantized cache"),
        ("kv: {kv_config: [{layer_idx: 0, bits: 9}]}", "kv_config[0].bits"),
        ("kv: {kv_config: [{layer_idx: 0, bits: 4}], bits: 4}", "kv_config: per-layer bits stand alone"),
        ("kv: {group_size: 64}", "expected bits, max_kv_size or kv_config"),
        ("kv: {bits: 4, max_kv_size: 64}", "never rotates"),
        # a missing or unpinned control
        ("control: {}", "quality.pairs[0].control: give exactly one of 'artifact'"),
        ("control: {artifact: {source: hub, repo: a/b, revision: main}}", "revision: expected a full 40-hex"),
        ("control: {twin: no-such-twin}", "quality.pairs[0].control.twin: unknown twin"),
        # the corpus
        ("path: fixtures/corpus/missing.txt", "quality.corpus.path"),
        ("chunk: 16", "quality.corpus.chunk"),
    ],
)
def test_bad_input_names_the_profile_key(isolated: Path, change: str, expected: str) -> None:
    quality = GOOD
    key = change.split(":")[0]
    if key == "kv":
        quality = quality.replace("kv: {bits: 8, group_size: 64}", change)
    elif key == "control":
        quality = quality.replace("control: {artifact: profile}", change)
    elif key == "path":
        quality = quality.replace(f"path: {CORPUS}", change)
    elif key == "chunk":
        quality = quality.replace("chunk: 16", "chunk: 64")
    assert quality != GOOD
    assert expected in _error(isolated, quality)


def test_a_control_that_is_its_candidate_is_refused(isolated: Path) -> None:
    quality = GOOD.replace(
        "candidate: {artifact: profile, kv: {bits: 8, group_size: 64}}", "candidate: {artifact: profile}"
    )
    assert "quality.pairs[0]: the control is the candidate itself" in _error(isolated, quality)


def test_a_kv_candidate_needs_a_chunked_corpus(isolated: Path) -> None:
    assert "set quality.corpus.chunk" in _error(isolated, GOOD.replace(", chunk: 16", ""))


def test_speech_keys_on_a_language_model_are_refused(isolated: Path) -> None:
    quality = GOOD.replace("kv: {bits: 8, group_size: 64}", "requantize: {bits: 8, group_size: 64}")
    assert "quality.pairs[0].candidate.requantize: language-model pairs" in _error(isolated, quality)
    assert "quality.corpus: a language-model profile needs a corpus" in _error(
        isolated, GOOD.replace(f"  corpus: {{path: {CORPUS}, context: 64, chunk: 16}}\n", "")
    )


def test_thresholds_must_say_something(isolated: Path) -> None:
    assert "thresholds.max_wer: a word error rate is a speech pair's" in _error(
        isolated, GOOD + "      thresholds: {max_wer: 0.1}\n"
    )
    assert "expected at least one of max_mean_kl" in _error(isolated, GOOD + "      thresholds: {}\n")
    assert "min_top1_agreement: expected a fraction" in _error(
        isolated, GOOD + "      thresholds: {min_top1_agreement: 95}\n"
    )
