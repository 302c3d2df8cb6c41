"""Draft-model speculative decoding at L1 (issue 17 part 3): the `speculative` gate against
mlx-lm's speculative_generate_step, its goldens' always-accepted / always-rejected claims,
the gate failing on an acceptance rule off by one, and the profile keys' validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import models.universal.speculative as speculative
from harness.checks.speculative import verify_steps
from harness.errors import ProfileError
from harness.profile.load import load_profile
from harness.session import ParitySession

MINI = "minicpm5-2b-mini"


def _session(model: str, *scenario_ids: str) -> ParitySession:
    """A session that makes (or reads) only these scenarios' goldens."""
    return ParitySession(selected_scenarios={model: set(scenario_ids)})


def _scenario(session: ParitySession, model: str, scenario_id: str):
    profile = session.profile(model)
    return profile, profile.scenario(scenario_id)


def test_accepted_count_is_the_leading_agreement() -> None:
    assert speculative.accepted_count([1, 2, 3], [1, 2]) == 2
    assert speculative.accepted_count([1, 5, 3], [1, 2]) == 1
    assert speculative.accepted_count([4, 2, 3], [1, 2]) == 0


@pytest.mark.parametrize(
    ("model", "scenario_id", "expect"),
    [
        (MINI, "spec-twin-k2", "rejected"),
        (MINI, "spec-self-k5", "accepted"),
        ("smollm2-135m", "spec-self-k2", "accepted"),
        ("smollm2-135m", "spec-self-k5", "accepted"),
    ],
)
def test_the_draft_goldens_are_always_rejected_or_always_accepted(model: str, scenario_id: str, expect: str) -> None:
    """What the scenarios claim, read from the oracle's record (not assumed)."""
    session = _session(model, scenario_id)
    profile, scenario = _scenario(session, model, scenario_id)
    golden = session.golden(profile, scenario).record
    steps = verify_steps(golden)
    assert steps and sum(len(s["tokens"]) for s in steps) == len(golden.tokens) == profile.steps(scenario) + 1
    k = scenario.draft["num_draft_tokens"]
    assert all(1 <= s["drafted"] <= k for s in steps)
    if expect == "rejected":
        assert [s["accepted"] for s in steps] == [0] * len(steps), steps
    else:
        assert [s["accepted"] for s in steps] == [s["drafted"] for s in steps], steps
    rows = sum(s["drafted"] + 1 for s in steps)  # one target row per verified position
    verify = golden.arrays.get("verify_logits")
    if verify is None:  # a compact golden whose blob is not at hand: the full record has it
        verify = session.full_golden(profile, scenario).arrays["verify_logits"]
    assert verify.shape[0] == rows


REQUANT = ("spec-requant-k2", "spec-requant-k5")


@pytest.mark.parametrize("scenario_id", REQUANT)
def test_the_requantized_draft_is_accepted_mostly_but_not_always(scenario_id: str) -> None:
    """SmolLM2 drafting with its own weights requantized: the golden (mlx-lm's run) holds
    accepted drafts, a majority of them, and rejected ones, in a partially accepted step; the
    draft it ran is the recipe's build of the target (same tokenizer, the recipe's quantization)."""
    import json

    from harness.artifacts.draft import with_draft_dir
    from harness.artifacts.requantize import requantized_provenance

    session = _session("smollm2-135m", scenario_id)
    profile, scenario = _scenario(session, "smollm2-135m", scenario_id)
    golden = session.golden(profile, scenario).record
    steps = verify_steps(golden)
    accepted, drafted = sum(s["accepted"] for s in steps), sum(s["drafted"] for s in steps)
    assert sum(len(s["tokens"]) for s in steps) == len(golden.tokens) == profile.steps(scenario) + 1
    assert drafted // 2 < accepted < drafted, steps
    assert any(0 < s["accepted"] < s["drafted"] for s in steps), steps
    assert sum(golden.extra["step_info"][i]["from_draft"] for i in range(len(golden.tokens))) == accepted
    spec = profile.scenario_spec(scenario)
    draft_dir = Path(with_draft_dir(spec)["draft"]["model_dir"])
    target_dir = session.artifact(profile).model_dir
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["quantization"] == scenario.draft["requantize"]
    assert (draft_dir / "tokenizer.json").read_bytes() == (target_dir / "tokenizer.json").read_bytes()
    draft_provenance = session.golden(profile, scenario).manifest["provenance"]["draft"]
    assert draft_provenance == requantized_provenance(spec)  # the golden was made with this very draft


def test_drafting_with_the_unrequantized_weights_fails_the_speculative_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-tree side drafting with the target's own (not requantized) weights feeds other
    drafts: the gate fails at the first verify step the requantized draft only partly passed,
    naming the verify row after the last accepted draft."""
    import harness.runners.speculative as runner_side

    scenario_id = "spec-requant-k2"
    session = _session("smollm2-135m", scenario_id)
    profile, scenario = _scenario(session, "smollm2-135m", scenario_id)
    expected = verify_steps(session.golden(profile, scenario).record)  # (the unperturbed pass: make test's parity)
    first = next(j for j, s in enumerate(expected) if s["accepted"] < s["drafted"])
    monkeypatch.setattr(runner_side, "draft_model", lambda runner, draft: runner.model)
    result = session.run_check(profile, scenario, "speculative")
    assert not result.passed, result.summary
    # the first draft the requantized model got wrong is fed differently: its verify row differs
    position = expected[first]["accepted"] + 1
    assert result.summary.startswith(f"verify step {first} position {position} (target logits row)"), result.summary
    assert result.first_bad_step == first


def test_an_acceptance_rule_off_by_one_fails_the_speculative_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """One draft accepted too many (the always-rejected draft) and one too few (the
    always-accepted one): the gate fails naming the verify step and the accepted count."""
    ids = ("spec-twin-k2", "spec-self-k5")
    session = _session(MINI, *ids)
    for scenario_id in ids:
        profile, scenario = _scenario(session, MINI, scenario_id)
        assert session.run_check(profile, scenario, "speculative").passed
    rule = speculative.accepted_count
    cases = {
        "spec-twin-k2": lambda t, d: min(rule(t, d) + 1, len(d)),
        "spec-self-k5": lambda t, d: max(rule(t, d) - 1, 0),
    }
    for scenario_id, off_by_one in cases.items():
        session = _session(MINI, *ids)
        monkeypatch.setattr(speculative, "accepted_count", off_by_one)
        profile, scenario = _scenario(session, MINI, scenario_id)
        result = session.run_check(profile, scenario, "speculative")
        assert not result.passed, result.summary
        assert result.summary.startswith("verify step 0: accepted differs"), result.summary
        assert result.first_bad_step == 0


def _profile_with(tmp_path: Path, scenario: dict) -> Path:
    data = yaml.safe_load((Path(__file__).parents[1] / "profiles" / f"{MINI}.yaml").read_text())
    data["scenarios"] = [scenario]
    path = tmp_path / f"{MINI}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BASE = {"id": "s", "prompt": "hi", "checks": ["greedy_tokens", "speculative"]}


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        (
            BASE | {"draft": {"artifact": "target", "num_draft_tokens": 0}},
            r"draft.num_draft_tokens: expected an int >= 1",
        ),
        (BASE | {"draft": {"artifact": "x", "num_draft_tokens": 2}}, r"draft.artifact: expected 'target' or a pinned"),
        (BASE | {"draft": {"artifact": "target", "num_draft_tokens": 2, "k": 1}}, r"draft: unknown key\(s\) \['k'\]"),
        (
            BASE | {"draft": {"artifact": {"source": "hub", "repo": "a/b"}, "num_draft_tokens": 2}},
            r"draft.artifact.revision: required",
        ),
        (
            BASE
            | {
                "checks": ["teacher_forced_logits", "speculative"],
                "draft": {"artifact": "target", "num_draft_tokens": 2},
            },
            r"checks: a draft scenario names 'speculative' and only .*teacher_forced_logits",
        ),
        (
            BASE | {"checks": ["greedy_tokens"], "draft": {"artifact": "target", "num_draft_tokens": 2}},
            "speculative missing",
        ),
        (BASE, r"checks: speculative needs a 'draft' scenario"),
        (
            BASE | {"draft": {"requantize": {"bits": 7, "group_size": 64}, "num_draft_tokens": 2}},
            r"draft.requantize.bits: expected one of \[2, 3, 4, 5, 6, 8\]",
        ),
        (
            BASE | {"draft": {"requantize": {"bits": 4, "group_size": 48}, "num_draft_tokens": 2}},
            r"draft.requantize.group_size: expected one of \[32, 64, 128\]",
        ),
        (
            BASE | {"draft": {"requantize": {"bits": 4}, "num_draft_tokens": 2}},
            r"draft.requantize: expected a mapping \{bits, group_size\}",
        ),
        (
            BASE
            | {"draft": {"artifact": "target", "requantize": {"bits": 4, "group_size": 64}, "num_draft_tokens": 2}},
            r"draft: give exactly one of 'artifact' \(a draft model\) and 'requantize'",
        ),
        (BASE | {"draft": {"num_draft_tokens": 2}}, r"draft: give exactly one of 'artifact'"),
        (
            BASE | {"kv_bits": 4, "draft": {"artifact": "target", "num_draft_tokens": 2}},
            r"draft: \['kv_bits'\] are not options of the draft run",
        ),
    ],
)
def test_bad_draft_scenarios_are_profile_errors_naming_the_key(tmp_path: Path, scenario: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile(_profile_with(tmp_path, scenario))


def test_two_draft_runs_must_agree_on_every_verify_row_and_step() -> None:
    """The determinism self-check covers what only the draft record has (verify rows, steps)."""
    import numpy as np

    from harness.errors import NonDeterministicError
    from harness.records import ScenarioRecord
    from harness.repeat import check_deterministic

    def record(verify: np.ndarray, accepted: int) -> ScenarioRecord:
        info = [{"from_draft": False, "verify_step": 0, "drafted": 2, "accepted": accepted}]
        return ScenarioRecord(
            "s", None, [1], [2], np.zeros((1, 4), np.float32), [0],
            arrays={"verify_logits": verify}, extra={"step_info": info},
        )  # fmt: skip

    rows = np.zeros((3, 4), np.float32)
    check_deterministic("s", record(rows, 0), record(rows.copy(), 0))
    with pytest.raises(NonDeterministicError, match="verify rows or steps differ"):
        check_deterministic("s", record(rows, 0), record(rows, 1))
    with pytest.raises(NonDeterministicError, match="verify rows or steps differ"):
        check_deterministic("s", record(rows, 0), record(rows + np.float32(1e-30), 0))


def _quantized_dir(path: Path, width: int, quantized: bool = True) -> Path:
    """A tiny model directory: one affine-quantized linear (4 bits, group 32) and a norm."""
    import json

    import mlx.core as mx

    path.mkdir()
    weight = mx.random.normal((8, width), key=mx.random.key(0))
    tensors = {"model.norm.weight": mx.ones((width,))}
    if quantized:
        packed, scales, biases = mx.quantize(weight, group_size=32, bits=4)
        tensors |= {"proj.weight": packed, "proj.scales": scales, "proj.biases": biases}
    else:
        tensors["proj.weight"] = weight
    mx.save_safetensors(str(path / "model.safetensors"), tensors)
    config = {"model_type": "llama"} | ({"quantization": {"group_size": 32, "bits": 4}} if quantized else {})
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    return path


def test_requantize_rebuilds_on_a_changed_recipe_and_is_deterministic(tmp_path: Path, monkeypatch) -> None:
    """Built once into the cache, keyed by the recipe and the source's files; the same inputs
    give the same bytes; a changed recipe string or bit width is another directory; a file
    changed after the build is found by the integrity check and the directory rebuilt."""
    import json

    import harness.artifacts.requantize as requantize
    from harness.artifacts.files import check_files

    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    source = _quantized_dir(tmp_path / "src", 64)
    monkeypatch.setattr(requantize, "_source", lambda draft, where: (source, {"source": "tiny"}, {"x": "h"}))
    draft = {"requantize": {"bits": 8, "group_size": 64}, "recipe": "r1", "num_draft_tokens": 2}
    first, identity = requantize.requantized_draft(draft, "s.draft")
    assert check_files(first) == [] and identity["bits"] == 8 and identity["recipe"] == "r1"
    assert json.loads((first / "config.json").read_text())["quantization"] == {"group_size": 64, "bits": 8}
    weights = (first / "model.safetensors").read_bytes()
    again = requantize.requantized_draft(draft | {"recipe": "r2"}, "s.draft")[0]
    other = requantize.requantized_draft(draft | {"requantize": {"bits": 3, "group_size": 64}}, "s.draft")[0]
    assert len({first, again, other}) == 3
    assert (again / "model.safetensors").read_bytes() == weights  # deterministic
    (first / "model.safetensors").write_bytes(b"corrupt")
    assert requantize.requantized_draft(draft, "s.draft")[0] == first
    assert (first / "model.safetensors").read_bytes() == weights  # made again, not trusted


def test_requantize_refuses_a_group_size_that_does_not_divide_or_an_unquantized_target(tmp_path: Path) -> None:
    from harness.artifacts.requantize import requantize_dir
    from harness.errors import ArtifactError

    out = tmp_path / "out"
    out.mkdir()
    narrow = _quantized_dir(tmp_path / "narrow", 96)
    with pytest.raises(ArtifactError, match=r"s.draft.requantize.group_size: 64 does not divide proj's input width 96"):
        requantize_dir(narrow, out, 4, 64, "s.draft")
    plain = _quantized_dir(tmp_path / "plain", 64, quantized=False)
    with pytest.raises(ArtifactError, match=r"s.draft.requantize: the target .* has no quantized weights"):
        requantize_dir(plain, out, 4, 64, "s.draft")
