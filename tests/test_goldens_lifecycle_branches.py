"""What a golden depends on and what its oracle is asked (harness/goldens/lifecycle.py,
harness/goldens/specs.py): common modules only when the generator loads some, and an in-tree
composition kept from the oracle's spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.goldens import lifecycle
from harness.goldens.specs import oracle_spec, runnable_spec
from harness.profile.load import load_profile
from tests.conftest import write_profile
from tests.fakes import fake_session
from tests.test_profile import SPEECH_PROFILE


def test_a_generator_loading_no_common_module_has_no_common_hashes(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oracle's provenance names the oracles/common modules its generator loads, and leaves
    the key out when it loads none."""
    write_profile(isolated)
    session = fake_session(isolated)
    profile = session.profile("tiny")
    scenario = profile.scenarios[0]
    assert session.provenance(profile, scenario)["oracle"]["common_sha256"]  # mlx-lm's generator loads some
    monkeypatch.setattr(lifecycle, "common_sources", lambda oracle: {})
    oracle = session.provenance(profile, scenario)["oracle"]
    assert "common_sha256" not in oracle and oracle["name"] == "mlx-lm"


def test_an_intree_composition_is_not_sent_to_the_oracle(isolated: Path) -> None:
    """A whisper-fast scenario is judged against the oracle's reference path: the oracle's spec
    is the runnable spec without the composition, everything else kept."""
    extra = (
        "    composition:\n      kind: whisper-fast\n      budget: {max_differing_tokens: 0}\n"
        "    checks: [mel, token_budget]"
    )
    profile = load_profile(write_profile(isolated, text=SPEECH_PROFILE.format(extra=extra)))
    fast = profile.scenarios[0]
    runnable = runnable_spec(profile.planned(fast).spec_dict())
    assert runnable["composition"]["kind"] == "whisper-fast"
    spec = oracle_spec(profile, fast)
    assert "composition" not in spec
    assert spec == {k: v for k, v in runnable.items() if k != "composition"}
    assert spec["audio"].endswith("fixtures/audio/fox.wav") and Path(spec["audio"]).is_absolute()
