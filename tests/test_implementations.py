"""The implementation seam (issue 33 part 1): one descriptor per implementation under test;
what applies to it follows from the records it produces."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.checks import registry
from harness.errors import HarnessError, ProfileError
from harness.implementations import IMPLEMENTATIONS, LLM, RECORD_KINDS, SPEECH, VAD, implementation, sources_of
from harness.oracle.descriptor import ORACLES, oracles_serving, quality_oracle
from harness.profile.load import load_profile
from tests.conftest import VALID_PROFILE, write_profile


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_every_row_names_a_runner_and_a_package_that_exist(name: str) -> None:
    d = IMPLEMENTATIONS[name]
    assert isinstance(d.runner_class(), type)
    assert d.sources() and all(p.suffix == ".py" for p in d.sources())


@pytest.mark.parametrize("kind", RECORD_KINDS)
def test_every_record_kind_has_checks_and_an_oracle(kind: str) -> None:
    assert registry.of(kind) and oracles_serving(kind)


def test_checks_and_oracles_follow_the_records() -> None:
    assert {"prompt_identity", "decode_logits"} <= set(registry.of(LLM))
    assert {"mel", "decode_logits"} <= set(registry.of(SPEECH)) and "prompt_identity" not in registry.of(SPEECH)
    assert set(registry.of(VAD)) == {"input", "probabilities", "segments", "streaming"}
    assert set(oracles_serving(SPEECH)) == {"mlx-whisper", "openai-whisper"}
    assert quality_oracle(LLM) == "mlx-lm" and quality_oracle(SPEECH) == "mlx-whisper"
    assert all(set(o.serves) <= set(RECORD_KINDS) for o in ORACLES.values())
    assert all(set(c.records) <= set(RECORD_KINDS) for c in registry.CHECKS.values())


def test_sources_of_a_kind_are_its_implementations_files() -> None:
    assert sources_of(SPEECH) == IMPLEMENTATIONS["whisper"].sources()
    assert sources_of(LLM) == IMPLEMENTATIONS["universal-llama"].sources()
    assert [p.name for p in sources_of(VAD)][:1] and all("models/vad" in p.as_posix() for p in sources_of(VAD))


def test_an_unknown_implementation_is_named_with_the_table() -> None:
    with pytest.raises(HarnessError, match=r"unknown implementation 'nope'.*harness/implementations.py"):
        implementation("nope")


def test_a_profile_naming_an_unknown_implementation_is_refused(isolated: Path) -> None:
    text = VALID_PROFILE.format(name="tiny").replace("implementation: universal-llama", "implementation: nope")
    with pytest.raises(ProfileError, match="implementation.*universal-llama.*whisper"):
        load_profile(write_profile(isolated, text=text))


def test_a_profile_follows_its_implementations_row(isolated: Path) -> None:
    profile = load_profile(write_profile(isolated))
    assert profile.under_test is IMPLEMENTATIONS["universal-llama"] and profile.under_test.localizes


def test_a_mistyped_implementation_gets_the_close_names() -> None:
    with pytest.raises(HarnessError, match=r"unknown implementation 'wisper': did you mean 'whisper'\?"):
        implementation("wisper")
