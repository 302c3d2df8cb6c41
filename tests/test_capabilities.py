"""Capabilities (issue 46 part 1): every implementation declares the run kinds it serves; a check
needing one it does not serve is refused before anything runs (by the profile loader, or at a
plug-in's hello), and a forced run refused at run time errs only the checks judging it."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from harness import capabilities, implementations
from harness.errors import HarnessError, ProfileError
from harness.oracle.plugin import HOST
from harness.profile.load import available_profiles, load_profile
from harness.runners.process import ProtocolError
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import fake_session
from tests.test_protocol import FAKES, _fake

FREE_RUN = ["prompt_identity", "prefill_logits", "decode_logits", "greedy_tokens"]
FORCED = ["teacher_forced_logits", "detokenize"]


def _write(root: Path, implementation: dict | str, checks: list[str], scenarios: str = "") -> Path:
    text = VALID_PROFILE.format(name="tiny")
    if isinstance(implementation, dict):
        text = text.replace("implementation: universal-llama", f"implementation: {json.dumps(implementation)}")
    text = text.replace("scenarios:", f"defaults:\n  checks: {json.dumps(checks)}\nscenarios:{scenarios}")
    return write_profile(root, text=text)


def _host(factory: str, name: str) -> dict:
    return {"name": name, "command": [sys.executable, "-I", str(HOST), f"fake_factory:{factory}", str(FAKES)]}


def test_an_in_tree_row_serving_no_forced_run_is_refused_by_the_loader(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = implementations.IMPLEMENTATIONS["universal-llama"]
    monkeypatch.setitem(implementations.IMPLEMENTATIONS, row.name, dataclasses.replace(row, serves=("free",)))
    path = _write(isolated, "universal-llama", FREE_RUN + ["teacher_forced_logits"])
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    said = str(caught.value)
    assert "check teacher_forced_logits needs a teacher_forced run, which universal-llama does not serve" in said
    assert "scenarios[0] (plain)" in said and "harness/implementations.py" in said
    load_profile(_write(isolated, "universal-llama", FREE_RUN))  # its free-run checks load


def test_in_tree_rows_declare_what_their_profiles_need() -> None:
    assert set(implementations.IMPLEMENTATIONS["universal-llama"].serves) >= {"stopped", "batched", "compiled"}
    assert "streamed" in implementations.IMPLEMENTATIONS["whisper"].serves
    scenario = type("S", (), {"stop": "eos", "batch": None})()
    assert capabilities.run_kinds("eos_stop", scenario) == ["free", "stopped"]
    assert capabilities.run_kinds("teacher_forced_logits", scenario) == ["teacher_forced", "stopped"]


@pytest.mark.parametrize(
    ("serves", "checks", "scenarios", "kind", "check"),
    [
        (["free"], FREE_RUN + ["teacher_forced_logits"], "", "teacher_forced", "teacher_forced_logits"),
        (["free"], FREE_RUN + ["detokenize"], "", "teacher_forced", "detokenize"),
        (
            ["free", "teacher_forced"],
            FREE_RUN + ["eos_stop"],
            '\n  - id: stops\n    prompt: "Hi"\n    stop: eos',
            "stopped",
            "prompt_identity",
        ),
    ],
    ids=["teacher_forced_logits", "detokenize", "stop"],
)
def test_a_plugin_whose_profile_declares_its_serves_is_refused_by_the_loader(
    isolated: Path, serves: list[str], checks: list[str], scenarios: str, kind: str, check: str
) -> None:
    path = _write(isolated, _fake("ok", serves=serves), checks, scenarios)
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    said = str(caught.value)
    assert f"check {check} needs a {kind} run, which fake-ok does not serve" in said, said
    assert "its profile's implementation.serves" in said


def test_an_unknown_run_kind_in_a_profile_is_refused(isolated: Path) -> None:
    with pytest.raises(ProfileError, match=r"implementation\.serves: unknown run kind\(s\) \['forced'\]"):
        load_profile(_write(isolated, _fake("ok", serves=["free", "forced"]), FREE_RUN))


@pytest.mark.parametrize(
    ("implementation", "label"),
    [(_fake("serves-free"), "fake-serves-free"), (_host("free_only", "free-only"), "free-only")],
    ids=["protocol-hello", "factory-info"],
)
def test_a_plugin_declaring_its_serves_in_its_hello_is_refused_there(
    isolated: Path, implementation: dict, label: str
) -> None:
    _write(isolated, implementation, FREE_RUN + ["teacher_forced_logits"])
    session = fake_session(isolated)
    profile = session.profile("tiny")  # loads: its capabilities come in its hello
    with pytest.raises(ProtocolError) as caught:
        session.run_check(profile, profile.scenario("plain"), "prompt_identity")
    said = str(caught.value)
    assert f"check teacher_forced_logits needs a teacher_forced run, which {label} does not serve" in said, said
    assert "its hello's serves" in said and "hello" in said
    session.release("tiny")


@pytest.mark.parametrize("factory", ["free_only", None], ids=["factory-info", "protocol-hello"])
def test_a_plugin_serving_free_runs_passes_the_free_run_checks(isolated: Path, factory: str | None) -> None:
    _write(isolated, _host(factory, "free-only") if factory else _fake("serves-free"), FREE_RUN)
    session = fake_session(isolated)
    profile = session.profile("tiny")
    results = {(s.id, c): session.run_check(profile, s, c) for s in profile.scenarios for c in FREE_RUN}
    session.release("tiny")
    assert all(r.passed for r in results.values()), {k: r.summary for k, r in results.items() if not r.passed}


def test_a_refused_forced_run_errs_only_the_checks_judging_it(isolated: Path) -> None:
    # external trial 2 (mlx-beam): a refused forced run turned every check of the scenario into an
    # ERROR, prompt_identity and the free-run logits included.
    _write(isolated, _fake("refuse-forced"), FREE_RUN + FORCED)
    session = fake_session(isolated)
    profile = session.profile("tiny")
    passed, errors = {}, {}
    for s in profile.scenarios:
        for check in FORCED + FREE_RUN:  # the forced checks first: their failure must not reach the others
            try:
                passed[(s.id, check)] = session.run_check(profile, s, check)
            except HarnessError as e:
                errors[(s.id, check)] = str(e)
    session.release("tiny")
    assert sorted(errors) == sorted((s.id, c) for s in profile.scenarios for c in FORCED), errors
    assert all(r.passed for r in passed.values()), {k: r.summary for k, r in passed.items() if not r.passed}
    for said in errors.values():
        assert re.search(
            r"teacher-forced run already failed .*fake-refuse-forced refused 'run': cannot be fed tokens", said
        )


def test_every_profile_still_loads_with_its_implementation_s_capabilities() -> None:
    for name, path in available_profiles().items():
        profile = load_profile(path)
        d = profile.under_test
        if d.plugin is None:
            assert capabilities.unserved(capabilities.needs(profile), d.serves, d.fields) is None, name
        else:
            assert d.plugin._needs == capabilities.needs(profile), name


def test_the_dspark_adapter_declares_free_runs_only() -> None:
    source = (Path(__file__).parents[1] / "examples" / "dspark" / "adapter.py").read_text()
    assert re.search(r'"serves": \["free"\]', source)


def test_declared_fields_refuse_an_array_check_and_undeclared_ones_keep_today_s_runs() -> None:
    needed = (("scenarios[0] (fox)", "mel", "free"), ("scenarios[0] (fox)", "mel", "field mel"))
    assert capabilities.unserved(needed, ["free"], None) is None  # no fields declared: as before
    assert capabilities.unserved(needed, ["free"], ["mel"]) is None
    need = capabilities.unserved(needed, ["free"], ["encoder"])
    assert need == needed[1]
    said = capabilities.refusal(need, "vayu", ["free"], "its hello's serves")
    assert said.startswith("scenarios[0] (fox): check mel needs the record array 'mel', which vayu does not write")
    plugin = implementations.Plugin(command=["x"])
    assert capabilities.from_hello({"decodes": ["eager", "compiled"]}, plugin)[0] == [
        "free",
        "teacher_forced",
        "compiled",
    ]
    assert capabilities.from_hello({}, dataclasses.replace(plugin, serves=["free"])) == (["free"], None)
