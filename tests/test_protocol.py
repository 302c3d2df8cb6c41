"""The implementation protocol (docs/protocol.md; issue 33 parts 2 and 3): an implementation in its
own process is judged by the same checks as an in-tree one, and each way of breaking the protocol
(a wrong message, a crash, a hang, a wrong record) ends as an error naming what was expected."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from harness.errors import HarnessError, InTreeRunError, OracleVersionError, ProfileError, RecordError
from harness.oracle.plugin import HOST, LineProcess, Timeout
from harness.oracle.streams import LINE_BYTES, LineTooLong
from harness.paths import REPO_ROOT
from harness.provenance import device_facts
from harness.runners.process import ProcessRunner, ProtocolError
from tests.conftest import VALID_PROFILE, write_profile
from tests.fakes import fake_session

FAKES = Path(__file__).parent / "protocol"
CHECKS = ["prompt_identity", "prefill_logits", "decode_logits", "teacher_forced_logits", "greedy_tokens"]


def _profile(root: Path, implementation: dict) -> None:
    """conftest's tiny profile, implemented by `implementation`, judged by CHECKS."""
    text = VALID_PROFILE.format(name="tiny")
    text = text.replace("implementation: universal-llama", f"implementation: {json.dumps(implementation)}")
    write_profile(root, text=text.replace("scenarios:", f"defaults:\n  checks: {json.dumps(CHECKS)}\nscenarios:"))


def _fake(mode: str, **more) -> dict:
    command = [sys.executable, str(FAKES / "fake_impl.py"), mode, device_facts().mlx]
    return {"name": f"fake-{mode}", "command": command, "run_timeout_s": 20, **more}


def _judge(root: Path) -> tuple[dict[tuple[str, str], object], object]:
    session = fake_session(root)
    profile = session.profile("tiny")
    results = {(s.id, c): session.run_check(profile, s, c) for s in profile.scenarios for c in CHECKS}
    runner = session._runners["tiny"]
    session.release("tiny")
    return results, runner


def _first_error(root: Path) -> HarnessError:
    session = fake_session(root)
    profile = session.profile("tiny")
    with pytest.raises(HarnessError) as caught:
        for check in CHECKS:
            session.run_check(profile, profile.scenario("plain"), check)
    session.release("tiny")
    return caught.value


def test_a_program_speaking_the_protocol_passes_every_gate_in_one_process(isolated: Path) -> None:
    _profile(isolated, _fake("ok"))
    results, runner = _judge(isolated)
    assert all(r.passed for r in results.values()), {k: r.summary for k, r in results.items() if not r.passed}
    assert isinstance(runner, ProcessRunner) and runner._proc.returncode == 0  # told bye, exited 0
    assert runner._runs == 2 * 2  # per scenario free and teacher-forced (the forced run is the free one's repeat)
    # hostile probe 2, L6: who the implementation said it is rides with every result to the report
    hellos = [r.details.get("implementation_hello") for r in results.values()]
    assert all(h is not None and h["name"] == runner.hello["name"] for h in hellos)
    assert hellos[0]["version"] == runner.hello["version"] and "mlx" in hellos[0]["environment"]


def test_a_perturbed_implementation_fails_and_localization_says_it_is_unavailable(isolated: Path) -> None:
    _profile(isolated, _fake("perturbed"))
    results, _ = _judge(isolated)
    failed = results[("plain", "decode_logits")]
    assert not failed.passed and failed.summary.startswith("first differing step 3 (1/3 steps differ)")
    assert "first diverging module: unavailable (fake-perturbed has no module taps)" in failed.summary
    assert results[("plain", "prompt_identity")].passed


def test_a_python_factory_is_served_by_the_host_and_its_own_failure_is_that_scenario_s(isolated: Path) -> None:
    host = [sys.executable, "-I", str(HOST), "fake_factory:failing_chat", str(FAKES)]
    _profile(isolated, {"name": "replay", "command": host})
    session = fake_session(isolated)
    profile = session.profile("tiny")
    assert all(session.run_check(profile, profile.scenario("plain"), c).passed for c in CHECKS)
    with pytest.raises(InTreeRunError, match="replay refused 'run': RuntimeError: cannot run chat"):
        session.run_check(profile, profile.scenario("chat"), "decode_logits")
    session.release("tiny")


def test_ext2_f5_a_factory_printing_on_stdout_does_not_break_the_protocol(isolated: Path) -> None:
    # external-2 F5: chuk-lazarus printed while loading and broke the protocol ("answered 'load'
    # with 'Loading ...'"); the host points fd 1 and sys.stdout at stderr before any import.
    host = [sys.executable, "-I", str(HOST), "fake_factory:chatty", str(FAKES)]
    _profile(isolated, {"name": "chatty", "command": host})
    session = fake_session(isolated)
    profile = session.profile("tiny")
    assert all(session.run_check(profile, profile.scenario("plain"), c).passed for c in CHECKS)
    session.release("tiny")


@pytest.mark.parametrize(
    ("mode", "error", "expected"),
    [
        ("exit-at-start", ProtocolError, r"exited before answering 'hello'.*\(exit 7\); its stderr ends:\ncannot"),
        ("garbage-hello", ProtocolError, r"answered 'hello' with 'Loading weights\.\.\. done': expected one JSON"),
        ("protocol-2", ProtocolError, r"hello: protocol 2, expected 1"),
        ("other-mlx", ProtocolError, r"it runs mlx 0\.1\.0, its oracle mlx"),
        ("mlx-null-hello", ProtocolError, r"result says it ran mlx '0\.32\.4', its hello None"),
        ("wrong-answer", ProtocolError, r"answered 'load' with op 'ran', expected 'loaded'"),
        ("crash-at-run", ProtocolError, r"exited before answering 'run'.*\(exit 139\).*Segmentation fault"),
        ("wrong-id", ProtocolError, r"answered run 'plain\.1' with id 'someone-else', expected the same id"),
        ("bad-field", RecordError, r"prompt_ids: expected a list of int token ids"),
        ("wrong-shape", RecordError, r"logits rows of 8 values, expected the oracle's vocabulary of 16"),
        ("refuse-run", InTreeRunError, r"fake-refuse-run refused 'run': no such scenario kind here"),
    ],
)
def test_each_way_of_breaking_the_protocol_is_an_error_naming_what_was_expected(
    isolated: Path, mode: str, error: type, expected: str
) -> None:
    _profile(isolated, _fake(mode))
    caught = _first_error(isolated)
    assert isinstance(caught, error), caught
    assert re.search(expected, str(caught), re.DOTALL), str(caught)


def test_a_hang_past_the_timeout_is_killed_and_named(isolated: Path) -> None:
    _profile(isolated, _fake("hang-at-run", run_timeout_s=2))
    caught = _first_error(isolated)
    assert isinstance(caught, ProtocolError) and "no answer to 'run' within 2 s" in str(caught)


def _gone(pid: int, within: float = 5.0) -> bool:
    """The process `pid` has ended (a zombie no one reaps counts as ended) within `within` seconds."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(OSError):  # no /proc (macOS): alive while kill(pid, 0) says so
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        time.sleep(0.05)
    return False


# An implementation that starts a child holding its stdout, then never answers (P50).
HANGS_WITH_A_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
print(child.pid, flush=True)
sys.stdin.readline()
time.sleep(3600)
"""


def test_m2_p50_a_timed_out_process_is_killed_with_its_children_and_closing_it_does_not_wait(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_WITH_A_CHILD)
    process = LineProcess([sys.executable, str(script)], dict(os.environ), tmp_path)
    child = int(process.receive(10) or "0")
    assert process.send('{"op": "hello"}')
    started = time.monotonic()
    with pytest.raises(Timeout):
        process.receive(0.5)
    process.kill()  # what ProcessRunner does on a timeout, then close
    process.close()
    assert time.monotonic() - started < 5, "close() waited on the child that holds its stdout"
    assert _gone(child), f"its child {child} outlived it"


def test_m2_p50_a_run_past_its_timeout_ends_with_nothing_of_the_implementation_left_running(isolated: Path) -> None:
    _profile(isolated, _fake("hang-with-a-child-at-run", run_timeout_s=1))
    started = time.monotonic()
    caught = _first_error(isolated)
    assert time.monotonic() - started < 15
    assert isinstance(caught, ProtocolError) and "no answer to 'run' within 1 s" in str(caught)
    child = re.search(r"child (\d+)", str(caught))
    assert child is not None, str(caught)
    assert _gone(int(child[1])), "the implementation's child outlived the run"


def test_m3_p51_a_huge_stderr_is_quoted_by_its_capped_end_so_a_report_row_stays_small(isolated: Path) -> None:
    _profile(isolated, _fake("huge-stderr-at-run"))
    caught = _first_error(isolated)
    message = str(caught)  # what the report's row, its JUnit and the results store carry
    assert isinstance(caught, ProtocolError) and "exited before answering 'run'" in message and "(exit 5)" in message
    assert "its stderr ends:\n… [stderr cut: 52.4 MB, last 4000 characters kept]\n" + "y" * 4000 in message
    assert len(message) < 5000, len(message)


def test_m3_p51_an_implementation_s_refusal_is_quoted_by_its_capped_start(isolated: Path) -> None:
    _profile(isolated, _fake("refuse-at-length"))
    caught = _first_error(isolated)
    assert isinstance(caught, InTreeRunError) and "fake-refuse-at-length refused 'run': why why" in str(caught)
    assert str(caught).endswith("why \n… [message cut: 500.0 kB, first 4000 characters kept]")
    assert len(str(caught)) < 4200


def test_m3_p51_the_host_cuts_a_huge_failure_message_so_that_it_stays_a_refusal(isolated: Path) -> None:
    host = [sys.executable, "-I", str(HOST), "fake_factory:failing_chat_at_length", str(FAKES)]
    _profile(isolated, {"name": "replay", "command": host})
    session = fake_session(isolated)
    profile = session.profile("tiny")
    with pytest.raises(InTreeRunError, match=r"replay refused 'run': RuntimeError: no no no") as caught:
        session.run_check(profile, profile.scenario("chat"), "decode_logits")
    session.release("tiny")
    assert not isinstance(caught.value, ProtocolError) and len(str(caught.value)) < 4200


def test_l8_p52_a_stdout_line_over_the_cap_is_a_protocol_error_at_once(isolated: Path) -> None:
    _profile(isolated, _fake("huge-stdout-at-run", run_timeout_s=30))
    started = time.monotonic()
    caught = _first_error(isolated)
    assert time.monotonic() - started < 15, "waited for the timeout instead"
    assert isinstance(caught, ProtocolError), caught
    expected = "answered 'run' with a stdout line longer than the cap of 1.0 MB (1048576 bytes): 1048576 bytes read"
    assert expected in str(caught) and "one line is at most 1048576 bytes" in str(caught)


# A 50 MiB stdout line with no newline, then a hang (P52).
WRITES_A_HUGE_LINE = """
import sys, time
for _ in range(50):
    sys.stdout.write("x" * (1 << 20))
sys.stdout.flush()
time.sleep(3600)
"""


def test_l8_p52_an_overlong_line_is_read_holding_no_more_than_the_cap(tmp_path: Path) -> None:
    script = tmp_path / "huge.py"
    script.write_text(WRITES_A_HUGE_LINE)
    tracemalloc.start()
    try:
        process = LineProcess([sys.executable, str(script)], dict(os.environ), tmp_path)
        with pytest.raises(LineTooLong, match=r"longer than the cap of 1\.0 MB \(1048576 bytes\)"):
            process.receive(20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    process.close()
    assert peak < 4 * LINE_BYTES, f"{peak} bytes held reading a 50 MiB line"


def test_a_plugin_profile_is_validated_at_the_edge(isolated: Path) -> None:
    from harness.profile.load import find_profile

    cases = [
        ({"command": ["x"], "python": "a.b:c"}, r"expected exactly one of 'command'"),
        ({"python": "a.b"}, r"python: expected 'package.module:factory'"),
        ({"python": "a.b:c"}, r"requirements: a python implementation runs in its own venv"),
        ({"comand": ["x"]}, r"implementation: unknown key\(s\) \['comand'\]"),
        ({"command": ["{python}", "x.py"]}, r"'\{python\}' needs 'requirements'"),
        ({"command": ["x"], "run_timeout_s": 0}, r"run_timeout_s: expected a number of seconds > 0"),
        # hostile probe 2, L7: an escape sequence in a name set the terminal's title and cleared it
        ({"command": ["x"], "name": "port\x1b]0;TITLE\x07\x1b[2J"}, r"name: expected printable text"),
        ({"command": ["x\ny"]}, r"command\[0\]: expected printable text"),
    ]
    for implementation, expected in cases:
        _profile(isolated, implementation)
        with pytest.raises(ProfileError, match=expected):
            find_profile("tiny")


def test_a_model_hook_cannot_reach_another_process(isolated: Path) -> None:
    _profile(isolated, _fake("ok"))
    session = fake_session(isolated)
    session.model_hook = lambda model: None
    with pytest.raises(HarnessError, match="a model hook .* cannot reach it"):
        session.runner(session.profile("tiny"))


def test_a_python_implementation_runs_in_a_venv_built_from_its_own_pins(isolated: Path) -> None:
    """Never the project's venv: the factory reports the interpreter it ran in."""
    import numpy as np

    pins = [f"numpy=={np.__version__}"]
    _profile(
        isolated, {"name": "replay", "python": "fake_factory:replay", "path": ["tests/protocol"], "requirements": pins}
    )
    results, runner = _judge(isolated)
    assert all(r.passed for r in results.values())
    prefix = runner.hello["environment"]["prefix"]
    assert prefix.startswith(str(isolated / "cache" / "venvs" / "plugin-")) and prefix != sys.prefix
    assert runner.hello["environment"]["mlx"] is None  # pinned numpy only: an mlx-free implementation


def test_a_requirements_file_is_read_into_the_venv_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.oracle import plugin as venv

    monkeypatch.setattr(venv, "REPO_ROOT", tmp_path)
    (tmp_path / "req.txt").write_text("# pins\nmlx==9.9\n\nnumpy==1.0\n")
    assert venv.expand(["-r req.txt", "extra==2"], "x") == ["mlx==9.9", "numpy==1.0", "extra==2"]
    with pytest.raises(ProfileError, match=r"implementation x: requirements: '-r nope.txt': cannot read"):
        venv.expand(["-r nope.txt"], "x")
    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(OracleVersionError, match=r"install mlx 9\.9, its oracle runs mlx 0\.32\.4.*nothing was built"):
        venv.ensure_plugin_env("x", ["-r req.txt"], "0.32.4")
    assert not (tmp_path / "cache" / "venvs").exists() or not any((tmp_path / "cache" / "venvs").glob("plugin-*/"))
    # hostile probe 2, L3: every spelling of an include is read in, so the mlx guard sees its pins
    for spelling in ("-rreq.txt", "--requirement=req.txt", "--requirement req.txt"):
        assert venv.expand([spelling], "x") == ["mlx==9.9", "numpy==1.0"], spelling
        with pytest.raises(OracleVersionError, match=r"install mlx 9\.9.*nothing was built"):
            venv.ensure_plugin_env("x", [spelling], "0.32.4")
    (tmp_path / "c.txt").write_text("mlx==9.9\n")
    for spelling in ("-c c.txt", "-cc.txt", "--constraint=c.txt"):  # a constraint file: refused, by name
        with pytest.raises(ProfileError, match=r"a constraints file is not read into the venv's hash"):
            venv.expand(["mlx-lm==0.1", spelling], "x")


def test_bench_protocol_pairs_each_run_with_the_implementation_s_own_compute(isolated: Path) -> None:
    from harness.errors import UsageError
    from harness.tools.bench_protocol import summary, timed_runs

    for mode in ("ok", "perturbed"):  # "perturbed" leaves the optional compute_s out of its answers
        _profile(isolated, _fake(mode))
        session = fake_session(isolated)
        profile = session.profile("tiny")
        spec = profile.scenario_spec(profile.scenario("plain"))
        runner = session.runner(profile)
        try:
            if mode == "ok":
                runs = timed_runs(runner, spec, 3)
                assert len(runs) == 3 and runner._runs == 4  # one warm-up run, not kept
                assert all(0 < r["compute_s"] <= r["wall_s"] and r["overhead_s"] >= 0 for r in runs)
                stats = summary(runs, spec["n_tokens"])
                assert stats["overhead_fraction"]["values"] == [r["overhead_s"] / r["compute_s"] for r in runs]
            else:
                with pytest.raises(UsageError, match="'ran' answer has compute_s None: expected its own compute"):
                    timed_runs(runner, spec, 3)
        finally:
            session.release("tiny")


def test_a_report_names_the_implementation_and_what_its_venv_is_built_from(isolated: Path) -> None:
    from harness.model_provenance import implementation_provenance
    from harness.oracle.plugin import plugin_pins

    write_profile(isolated, text=VALID_PROFILE.format(name="tiny"))
    assert implementation_provenance(fake_session(isolated).profile("tiny")) == {
        "name": "universal-llama",
        "in_tree": True,
    }
    requirements = ["my-port==0.3", "-r examples/stdio-client/requirements.txt"]
    _profile(isolated, {"name": "port", "python": "my_port:factory", "requirements": requirements})
    facts = implementation_provenance(fake_session(isolated).profile("tiny"))
    pins, digest = plugin_pins("port", requirements)
    assert facts == {
        "name": "port",
        "in_tree": False,
        "python": "my_port:factory",
        "pins_hash": digest,
        "requirements": pins.splitlines(),
    }
    assert "mlx-lm==0.32.2" in facts["requirements"] and "my-port==0.3" in facts["requirements"]  # -r read in


def test_l2_p57_the_host_s_measured_mlx_and_device_win_over_the_factory_s_claims() -> None:
    """Hostile probe 2, L2: a factory's `info.environment` overrode the mlx and device the host
    measured, so the one-mlx check judged the factory's word."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plugin_host", REPO_ROOT / "plugins" / "host.py")
    host = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host)
    measured = host.environment(None)
    claimed = host.environment({"mlx": "9.9.9", "device": "Device(gpu, 0)", "engine": "mine 1.0"})
    assert claimed["mlx"] == measured["mlx"] and claimed["device"] == measured["device"]
    assert claimed["engine"] == "mine 1.0"  # a key of its own is kept


def test_l6_p53_the_report_carries_each_plugin_s_hello_beside_its_implementation_facts() -> None:
    from harness.model_provenance import with_hellos as _with_hellos
    from harness.report import ItemResult

    hello = {"name": "port", "version": "0.3", "environment": {"mlx": "0.32.4"}}
    row = ItemResult("tiny", "plain", "greedy_tokens", "L1", "mlx-lm", "passed", "ok", details={})
    row.details["implementation_hello"] = hello
    intree = ItemResult("other", "plain", "greedy_tokens", "L1", "mlx-lm", "passed", "ok")
    provenance = {"tiny": {"implementation": {"name": "port", "in_tree": False}}, "other": {"implementation": {}}}
    out = _with_hellos(provenance, [row, intree])
    assert out["tiny"]["implementation"]["hello"] == hello and "hello" not in out["other"]["implementation"]


def _hostile_modes() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_impl", FAKES / "fake_impl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(module.HOSTILE) + list(module.HOSTILE_FILES)


@pytest.mark.parametrize("mode", ["ok", *_hostile_modes()])
def test_issue_51_part_5_no_hostile_record_passes(isolated: Path, mode: str) -> None:
    """Hostile probe 2's record attacks (its fakeplug.py FAKE_MODEs: NaN and infinite logits,
    wrong shapes and dtypes, lying tokens, EOS and prompt ids, too few or many steps, a pickled
    or linked logits file, another scenario's or an extra record), each replayed by this fake
    over the protocol: refused with an error naming what is wrong, or failed by a check; never
    a PASS."""
    _profile(isolated, _fake(mode))
    session = fake_session(isolated)
    profile = session.profile("tiny")
    outcomes, checks = [], [*CHECKS, "eos_stop"]
    for check in checks:
        try:
            result = session.run_check(profile, profile.scenario("plain"), check)
        except HarnessError as e:
            assert str(e).strip(), f"{mode}: an error with no message"
            outcomes.append("error")
            continue
        outcomes.append("passed" if result.passed else "failed")
        assert result.passed or result.summary.strip()
    session.release("tiny")
    if mode == "ok":  # the control: the same fake, unbroken, passes every one of them
        assert outcomes == ["passed"] * len(checks), outcomes
    else:
        assert outcomes != ["passed"] * len(checks), f"{mode}: every check passed"
