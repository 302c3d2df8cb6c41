"""An implementation under test in its own process, driven over docs/protocol.md: a program in any
language (`command`), or a Python factory served by plugins/host.py in its own venv.

One process per profile and session: started and handed the model once, asked for one record per
run, told `bye` when the profile is done. Whatever it answers is checked against the protocol
before anything is judged: a wrong message, a crash, a hang past its timeout or a record that is
not records version 1 is an ERROR naming what was expected, never a verdict on bits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from harness import capabilities
from harness.errors import HarnessError, InTreeRunError
from harness.implementations import RUN_KINDS, Plugin
from harness.oracle.plugin import LineProcess, Timeout, plugin_command
from harness.oracle.process import work_directory
from harness.oracle.streams import LineTooLong, cap_text
from harness.progress import progress
from harness.records import ScenarioRecord, read_generator_output
from harness.records_schema import RECORDS_VERSION
from harness.runners import ModelHook

PROTOCOL = 1


class ProtocolError(InTreeRunError):
    """The implementation broke docs/protocol.md (or died, or hung): the process is stopped."""


class ProcessRunner:
    """The session's runner (harness/runners/__init__.py `InTreeRunner`) for a profile's plugin."""

    def __init__(self, model_dir: Path, model_hook: ModelHook | None = None, label: str = "", *, plugin: Plugin):
        if model_hook is not None:
            raise HarnessError(
                f"implementation {plugin.label} runs in its own process: a model hook (a mutant, a test's "
                "perturbation) cannot reach it"
            )
        self.plugin, self.label, self._runs = plugin, label, 0
        self.last_answer: dict[str, Any] = {}  # the last `ran` (its optional compute_s: bench-protocol)
        self._stopped: str | None = None
        self._work_cm = work_directory()
        self.work = self._work_cm.__enter__()
        try:
            self._proc = LineProcess(*plugin_command(plugin), self.work)
        except BaseException:
            self._work_cm.__exit__(None, None, None)
            raise
        try:
            with progress.task(f"starting {plugin.label}"):
                hello = {"op": "hello", "protocol": PROTOCOL, "records_version": RECORDS_VERSION}
                self.hello = self._ask(hello | {"work_dir": str(self.work)}, "hello", plugin.load_timeout_s)
                check_hello(self.hello, plugin)
                self._ask({"op": "load", "model_dir": str(model_dir)}, "loaded", plugin.load_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def model(self) -> Any:
        raise HarnessError(f"implementation {self.plugin.label} runs in its own process: it has no model here")

    def run(self, spec: dict[str, Any], forced: ScenarioRecord | None = None, decode: str = "eager") -> ScenarioRecord:
        if decode not in self.hello.get("decodes", ["eager"]):
            raise InTreeRunError(
                f"{spec['id']}: {self.plugin.label} offers decodes {self.hello.get('decodes', ['eager'])}, "
                f"not {decode!r} (its hello says which it has)"
            )
        self._runs += 1
        run_id = f"{spec['id']}.{self._runs}"
        out = self.work / f"run-{self._runs}"
        out.mkdir()
        mode = "teacher_forced" if forced is not None else "free"
        request = {"op": "run", "id": run_id, "spec": spec, "forced": forced.meta() if forced is not None else None}
        with progress.task(f"{self.label}{spec['id']} ({mode}) in {self.plugin.label}"):
            answer = self._ask(request | {"decode": decode, "out": str(out)}, "ran", self.plugin.run_timeout_s, run_id)
        self.last_answer = answer
        try:
            result, records, errors = read_generator_output(out, oracle=False)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        ran_mlx = result["environment"].get("mlx", self.hello["environment"]["mlx"])
        if ran_mlx != self.hello["environment"]["mlx"]:  # hostile probe 2, L1: a hello of mlx null, then mlx
            raise ProtocolError(
                f"{spec['id']}: {self.plugin.label}'s result says it ran mlx {ran_mlx!r}, its hello "
                f"{self.hello['environment']['mlx']!r}: the one-mlx check was made on the hello (docs/protocol.md)"
            )
        if spec["id"] in errors:
            raise InTreeRunError(f"{spec['id']}: {self.plugin.label} wrote an error entry: {errors[spec['id']]}")
        if list(records) != [spec["id"]]:
            raise ProtocolError(
                f"{spec['id']}: {self.plugin.label} wrote records for {sorted(records) or 'no scenario'}, "
                f"expected exactly one, for {spec['id']!r}"
            )
        return dataclasses.replace(records[spec["id"]], mode=mode)

    @property
    def taps(self) -> bool:
        """Whether its hello says it hands over module outputs (docs/protocol.md, taps)."""
        return self.hello.get("taps") is True

    def module_outputs(self, spec: dict[str, Any], forced: ScenarioRecord, row: int) -> dict[str, np.ndarray]:
        """Its module outputs on the call that made row `row` of a teacher-forced run, named as
        the oracle names its modules, in its execution order (harness/checks/localize.py)."""
        self._runs += 1
        run_id, out = f"{spec['id']}.taps.{self._runs}", self.work / f"run-{self._runs}"
        out.mkdir()
        request = {"op": "run", "id": run_id, "spec": spec, "forced": forced.meta(), "decode": "eager"}
        try:
            with progress.task(f"{self.label}{spec['id']} (module taps, row {row}) in {self.plugin.label}"):
                self._ask(request | {"out": str(out), "taps": {"row": row}}, "ran", self.plugin.run_timeout_s, run_id)
            return read_module_outputs(out, f"{spec['id']}: {self.plugin.label}'s module taps")
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def run_streamed(self, spec: dict[str, Any], seconds: float) -> ScenarioRecord:
        raise InTreeRunError(f"{spec['id']}: protocol version {PROTOCOL} has no streamed run")

    # -- the conversation --------------------------------------------------------------------

    def _ask(self, message: dict[str, Any], expect: str, timeout: float, run_id: str | None = None) -> dict[str, Any]:
        """Send one request and return its one answer, which must be `expect` (for a run, with
        its id); an `error` answer is the implementation's own refusal (the process stays up)."""
        op = message["op"]
        if self._stopped is not None:
            raise ProtocolError(f"{self.plugin.label} was stopped earlier: {self._stopped}")
        if not self._proc.send(json.dumps(message)):
            self._fail(f"its stdin closed before {op!r} could be sent")
        try:
            line = self._proc.receive(timeout)
        except Timeout:
            self._fail(f"no answer to {op!r} within {timeout:g} s (expected {expect!r}); the process was killed")
        except LineTooLong as e:
            self._fail(f"answered {op!r} with {e} (docs/protocol.md: one line is at most {e.limit} bytes)")
        if line is None:
            self._fail(f"it exited before answering {op!r} (expected {expect!r})")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("op"), str):
            self._fail(f"answered {op!r} with {line.strip()[:200]!r}: expected one JSON object with an 'op' per line")
        if answer["op"] == "error" and op != "hello":
            said = cap_text(str(answer.get("message", "(no message)")), "message", keep_end=False)
            raise InTreeRunError(f"{self.plugin.label} refused {op!r}: {said}")
        if answer["op"] != expect:
            self._fail(f"answered {op!r} with op {answer['op']!r}, expected {expect!r}")
        if run_id is not None and answer.get("id") != run_id:
            self._fail(f"answered run {run_id!r} with id {answer.get('id')!r}, expected the same id")
        return answer

    def _fail(self, what: str) -> None:
        """Stop the process and raise a ProtocolError naming what happened and its stderr's tail."""
        self._stopped = what
        self._proc.kill()
        raise ProtocolError(f"implementation {self.plugin.label} broke protocol {PROTOCOL}: {what}{self._tail()}")

    def _tail(self) -> str:
        code = self._proc.returncode
        tail = self._proc.stderr_tail()
        said = f"; its stderr ends:\n{tail}" if tail else "; its stderr is empty"
        return (f" (exit {code})" if code is not None else "") + said

    def close(self) -> None:
        """`bye`, then the process ends (killed if it does not within 10 s) and its work goes."""
        if self._proc.returncode is None and self._stopped is None:
            with contextlib.suppress(HarnessError):
                self._ask({"op": "bye"}, "bye", 10.0)
            self._proc.wait(10)
        self._proc.close()
        self._work_cm.__exit__(None, None, None)


def read_module_outputs(out: Path, what: str) -> dict[str, np.ndarray]:
    """modules.json (`order`: the module names) and module.<k>.npy (a float32 vector each)."""
    try:
        order = json.loads((out / "modules.json").read_text())["order"]
        if not (isinstance(order, list) and order and all(isinstance(n, str) for n in order)):
            raise ValueError(f"order: expected a non-empty list of module names, got {order!r}")
        if len(set(order)) != len(order):
            raise ValueError("order: a module named twice")
        found = {name: np.load(out / f"module.{k}.npy", allow_pickle=False) for k, name in enumerate(order)}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProtocolError(f"{what}: {type(e).__name__}: {e} (docs/protocol.md, taps)") from e
    for name, array in found.items():
        if array.dtype != np.float32 or array.ndim != 1:
            raise ProtocolError(f"{what}: {name} is {array.dtype} of shape {array.shape}, expected a float32 vector")
    return found


def check_capabilities(hello: dict[str, Any], plugin: Plugin, wrong: Any) -> None:
    """Its hello's `serves` and `fields` (else its profile's, else the undeclared default) against
    what its profile's checks need: a check it cannot serve is refused here, before `load`."""
    for key in ("serves", "fields"):
        value = hello.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise wrong(f"{key}: expected a list of strings, got {value!r}")
    unknown = sorted(set(hello.get("serves") or ()) - set(RUN_KINDS))
    if unknown:
        raise wrong(f"serves: unknown run kind(s) {unknown}; known: {list(RUN_KINDS)}")
    serves, fields = capabilities.from_hello(hello, plugin)
    need = capabilities.unserved(plugin._needs, serves, fields)
    if need is not None:
        said = "its hello's serves" if "serves" in hello else "declared by neither its hello nor its profile"
        raise wrong(capabilities.refusal(need, plugin.label, serves, said))


def check_hello(hello: dict[str, Any], plugin: Plugin) -> None:
    """The implementation's hello, against the protocol and the one-mlx rule."""
    from harness.provenance import device_facts

    def wrong(what: str) -> ProtocolError:
        return ProtocolError(f"implementation {plugin.label}'s hello: {what} (docs/protocol.md, hello)")

    if hello.get("protocol") != PROTOCOL:
        raise wrong(f"protocol {hello.get('protocol')!r}, expected {PROTOCOL}")
    if hello.get("records_version") != RECORDS_VERSION:
        raise wrong(f"records_version {hello.get('records_version')!r}, expected {RECORDS_VERSION}")
    if hello.get("produces") != plugin.produces:
        raise wrong(f"produces {hello.get('produces')!r}, the profile says {plugin.produces!r}")
    for key in ("name", "version"):
        if not isinstance(hello.get(key), str):
            raise wrong(f"{key}: expected a string, got {hello.get(key)!r}")
    environment = hello.get("environment")
    if not isinstance(environment, dict) or "mlx" not in environment:
        raise wrong(f"environment: expected an object with 'mlx' (a version or null), got {environment!r}")
    decodes = hello.get("decodes", ["eager"])
    if not isinstance(decodes, list) or "eager" not in decodes or not set(decodes) <= {"eager", "compiled"}:
        raise wrong(f"decodes: expected a list with 'eager' (and 'compiled' if it has it), got {decodes!r}")
    check_capabilities(hello, plugin, wrong)
    facts = device_facts()
    mlx = plugin._comparison_mlx or facts.mlx  # its oracle's: a variant's pinned one, else the project's
    if environment["mlx"] is not None:
        if environment["mlx"] != mlx:
            raise wrong(
                f"it runs mlx {environment['mlx']}, its oracle mlx {mlx}: bits are compared "
                "within one mlx version (pin mlx in its requirements)"
            )
        if facts.backend not in str(environment.get("device", "")):
            raise wrong(f"it runs on {environment.get('device')!r}, the project on {facts.backend}")
