"""Profile validation: every malformed input names the file, the key and the expectation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.checks import registry
from harness.errors import ProfileError, UnknownModelError
from harness.paths import REPO_ROOT
from harness.profile.load import find_profile, load_profile
from tests.conftest import VALID_PROFILE, write_profile


def test_valid_profile_loads_into_typed_objects(isolated: Path) -> None:
    profile = load_profile(write_profile(isolated))
    assert profile.name == "tiny" and profile.tier == "L1"
    plain, chat = profile.scenarios
    assert plain.kind == "plain" and chat.kind == "chat"
    assert profile.steps(plain) == 3 and profile.steps(chat) == 32
    assert profile.checks(chat) == registry.defaults()
    assert profile.scenario_spec(plain)["n_tokens"] == 4


def test_repository_profiles_are_valid() -> None:
    for path in sorted((Path(__file__).parent.parent / "profiles").glob("*.yaml")):
        assert load_profile(path).name == path.stem


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("tier: L1", "tier: L3"), "tier: expected one of 'L1' | 'L2', got 'L3'"),
        (lambda t: t + "colour: blue\n", "unknown key(s) ['colour']"),
        (lambda t: t.replace("oracle: mlx-lm\n", ""), "oracle: missing required field"),
        (lambda t: t.replace("steps: 3", "steps: three"), "scenarios[0].steps: expected an integer, got 'three'"),
        (
            lambda t: t.replace("revision: 0123456789abcdef0123456789abcdef01234567", "revision: main"),
            "artifact.revision: expected a full 40-hex commit sha",
        ),
        (
            lambda t: t.replace('prompt: "Hello"', 'prompt: "Hello"\n    messages: []'),
            "expected exactly one of 'prompt' or 'messages'",
        ),
        (lambda t: t.replace("id: chat", "id: plain"), "duplicate scenario id 'plain'"),
        (
            lambda t: t.replace("steps: 3", "steps: 3\n    checks: [logits_everywhere]"),
            "scenarios[0].checks[0]: expected one of",
        ),
        (lambda t: t.replace("name: tiny", "name: other"), "name: expected the file's stem 'tiny'"),
        # Schema additions: L2, speech, scoping.
        (lambda t: t.replace("oracle: mlx-lm", "oracle: mlx-whisper"), "oracle: universal-llama is judged by 'mlx-lm'"),
        (
            lambda t: t.replace('prompt: "Hello"', 'prompt: "Hello"\n    oracle: mlx-optiq'),
            "mlx-optiq judges composed paths only: add 'composition'",
        ),
        (
            lambda t: t.replace('prompt: "Hello"', 'prompt: "Hello"\n    checks: [mel]'),
            "do not apply to universal-llama",
        ),
        (
            lambda t: t.replace('prompt: "Hello"', 'prompt: "Hello"\n    backends: [tpu]'),
            "backends[0]: expected one of 'cpu' | 'gpu'",
        ),
        (
            lambda t: t.replace(
                "revision: 0123456789abcdef0123456789abcdef01234567",
                "revision: 0123456789abcdef0123456789abcdef01234567\n  parts: [{package: x}]",
            ),
            "artifact.parts: only a pypi-ct2 model.bin can be split",
        ),
        (lambda t: "just: [unclosed", "cannot read profile YAML"),
    ],
)
def test_malformed_profiles_name_file_key_and_expectation(isolated: Path, edit, message: str) -> None:
    path = write_profile(isolated, text=edit(VALID_PROFILE.format(name="tiny")))
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_unknown_model_lists_known_ones(isolated: Path) -> None:
    write_profile(isolated)
    with pytest.raises(UnknownModelError, match=r"unknown model 'nope'.*known models: tiny"):
        find_profile("nope")


def test_scenario_hash_changes_with_what_is_computed(isolated: Path) -> None:
    path = write_profile(isolated)
    before = load_profile(path)
    path.write_text(VALID_PROFILE.format(name="tiny").replace("steps: 3", "steps: 4"))
    after = load_profile(path)
    assert before.planned(before.scenarios[0]).spec_sha256 != after.planned(after.scenarios[0]).spec_sha256
    assert before.planned(before.scenarios[1]).spec_sha256 == after.planned(after.scenarios[1]).spec_sha256


SPEECH_PROFILE = """\
name: tiny
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
{extra}
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # PyTorch's floats are not MLX's bits: logits gates against openai-whisper are refused.
        (
            "    oracle: openai-whisper\n    checks: [decode_tokens, decode_logits]",
            "compare MLX bits, which openai-whisper (PyTorch) does not compute",
        ),
        # An L2 budget's origin lives in its calibration record, not in a string typed beside it.
        (
            "    composition: {kind: whisper-fast, budget: {max_differing_tokens: 2, origin: x}}\n"
            "    checks: [token_budget]",
            "budget.origin: the origin of a budget lives in its calibration record",
        ),
        ("    composition: {kind: whisper-fast}\n    checks: [token_budget]", "budget: expected"),
        ("    checks: [token_budget]", "token_budget judges an in-tree composition"),
        (
            "    composition: {kind: mixed_kv}\n    checks: [transcript]",
            "whisper cannot be judged by 'mlx-optiq'",
        ),
        (
            "    writer_options: {max_line_width: 10}\n    checks: [transcript]",
            "writer_options: only meaningful with the writers check",
        ),
    ],
)
def test_speech_scenarios_refuse_gates_that_cannot_hold(isolated: Path, extra: str, message: str) -> None:
    path = write_profile(isolated, text=SPEECH_PROFILE.format(extra=extra))
    with pytest.raises(ProfileError, match=re.escape(message)):
        load_profile(path)


def test_foreign_oracle_and_fast_path_scenarios_load(isolated: Path) -> None:
    extra = "    oracle: openai-whisper\n    checks: [decode_tokens, transcript_text]"
    profile = load_profile(write_profile(isolated, text=SPEECH_PROFILE.format(extra=extra)))
    assert profile.oracle_of(profile.scenarios[0]) == "openai-whisper" and profile.tier_of(profile.scenarios[0]) == "L1"
    extra = (
        "    composition:\n      kind: whisper-fast\n      budget: {max_differing_tokens: 0}\n"
        "    checks: [mel, token_budget]"
    )
    profile = load_profile(write_profile(isolated, text=SPEECH_PROFILE.format(extra=extra)))
    fast = profile.scenarios[0]
    # Judged at L2 against the plain oracle's reference path, which never sees the composition.
    assert profile.tier_of(fast) == "L2" and profile.oracle_of(fast) == "mlx-whisper"
    assert profile.intree_composition(fast) and profile.scenario_spec(fast)["composition"]["kind"] == "whisper-fast"


def test_compiled_decode_is_for_plain_and_chat_scenarios(isolated: Path) -> None:
    text = VALID_PROFILE.format(name="tiny").replace(
        '    prompt: "Hello"\n', '    prompt: "Hello"\n    checks: [compiled_decode]\n'
    )
    profile = load_profile(write_profile(isolated, text=text))
    assert profile.checks(profile.scenarios[0]) == ["compiled_decode"]
    turns = "  - id: two\n    turns:\n      - [{role: user, content: a}]\n      - [{role: user, content: b}]\n"
    with_turns = load_profile(write_profile(isolated, text=text + turns + "    checks: [compiled_decode]\n"))
    assert with_turns.checks(with_turns.scenarios[-1]) == ["compiled_decode"]  # the kept cache, compiled
    blocks = load_profile(
        write_profile(
            isolated, text=text.replace("[compiled_decode]\n", "[compiled_decode]\n    compiled_variant: blocks\n")
        )
    )
    assert blocks.scenarios[0].compiled_variant == "blocks"
    assert "compiled_variant" not in blocks.scenario_spec(blocks.scenarios[0])  # the in-tree side's choice: not hashed
    with pytest.raises(ProfileError, match="compiled_variant"):  # masked is not bit-exact by construction
        load_profile(
            write_profile(
                isolated, text=text.replace("[compiled_decode]\n", "[compiled_decode]\n    compiled_variant: masked\n")
            )
        )
    no_check = text.replace("    checks: [compiled_decode]\n", "    compiled_variant: blocks\n")
    with pytest.raises(ProfileError, match="compiled_variant: picks the compiled_decode check's variant"):
        load_profile(write_profile(isolated, text=no_check))
    batch = "  - id: rows\n    batch:\n      - {prompt: a}\n      - {prompt: b}\n"
    with pytest.raises(ProfileError, match=r"compiled_decode runs plain and chat scenarios \(turns included\) only"):
        load_profile(write_profile(isolated, text=text + batch + "    checks: [compiled_decode]\n"))
    for option in ("kv_bits: 8", "max_kv_size: 16"):
        eager = text.replace("    checks: [compiled_decode]\n", f"    checks: [compiled_decode]\n    {option}\n")
        with pytest.raises(
            ProfileError, match=f"compiled_decode with {option.split(':')[0]}: that cache is not compiled"
        ):
            load_profile(write_profile(isolated, text=eager))


def test_audio_paths_must_resolve_inside_the_repository(isolated: Path) -> None:
    depth = len(REPO_ROOT.resolve().parts) - 1
    escape = "../" * depth + "etc/passwd"  # a file that exists, outside the repository
    text = SPEECH_PROFILE.format(extra="    checks: [mel]").replace("fixtures/audio/fox.wav", escape)
    with pytest.raises(ProfileError, match=r"scenarios\[0\]\.audio: .* outside the repository"):
        load_profile(write_profile(isolated, text=text))
    inside = SPEECH_PROFILE.format(extra="    checks: [mel]").replace(
        "fixtures/audio/fox.wav", "fixtures/../fixtures/audio/fox.wav"
    )
    assert load_profile(write_profile(isolated, text=inside)).scenarios[0].audio


def test_stop_at_eos_is_for_plain_and_chat_scenarios_judged_by_mlx_lm(isolated: Path) -> None:
    text = VALID_PROFILE.format(name="tiny").replace('    prompt: "Hello"\n', '    prompt: "Hello"\n    stop: eos\n')
    profile = load_profile(write_profile(isolated, text=text))
    plain = profile.scenarios[0]
    assert profile.scenario_spec(plain)["stop"] == "eos" and "stop" not in profile.scenario_spec(profile.scenarios[1])
    assert profile.expected_rows(plain) is None  # the run decides where it ends
    turns = "  - id: two\n    stop: eos\n    turns:\n"
    turns += "      - [{role: user, content: a}]\n      - [{role: user, content: b}]\n"
    with pytest.raises(ProfileError, match=r"\.stop: only plain and chat scenarios stop at EOS"):
        load_profile(write_profile(isolated, text=text + turns))
    with pytest.raises(ProfileError, match=r"stop: expected one of 'eos', got 'newline'"):
        load_profile(write_profile(isolated, text=text.replace("stop: eos", "stop: newline")))


def test_the_nightly_list_is_read_from_the_profiles(isolated: Path) -> None:
    """`make nightly` runs what `python -m harness list --nightly` prints: a profile with a CPU
    scenario, unless it says `nightly: false`; a GPU-only one is not in it."""
    from harness.profile.load import nightly_models

    write_profile(isolated, "tiny")
    text = VALID_PROFILE.format(name="held")
    write_profile(isolated, "held", text.replace("\nscenarios:", "\nnightly: false\nscenarios:", 1))
    gpu = re.sub(r"\n( *)- id: ", r"\n\1- backends: [gpu]\n\1  id: ", VALID_PROFILE.format(name="gpu"))
    write_profile(isolated, "gpu", gpu)
    assert load_profile(isolated / "profiles" / "held.yaml").nightly is False
    assert not load_profile(isolated / "profiles" / "gpu.yaml").active_scenarios("cpu")
    assert nightly_models() == ["tiny"]
    with pytest.raises(ProfileError, match=r"nightly: expected a boolean"):
        load_profile(write_profile(isolated, "bad", text.replace("\nscenarios:", "\nnightly: maybe\nscenarios:", 1)))
