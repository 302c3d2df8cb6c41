"""Serves a Python implementation over docs/protocol.md, inside that implementation's own venv.

Run by the harness as `python -I host.py package.module:factory [FOLDER...]` (each FOLDER put on
sys.path first); it imports
nothing of the harness (the venv has only the implementation's requirements) and needs numpy.

The factory (called once, with no arguments) returns an object with:

- `info` (optional dict): `name`, `version`, `produces` ("llm" or "speech", default "llm"),
  `decodes` (default ["eager"]), `environment` (merged over what the host finds: mlx's version
  and default device, which is `MLX_PARITY_DEVICE`'s where that is set); `serves`, the run kinds
  it serves (docs/protocol.md, hello: `free`, `teacher_forced`, `stopped`, `batched`, `compiled`,
  ...; absent: free and teacher-forced, and compiled where `decodes` names it), and `fields`, the
  optional record arrays it writes (absent: not declared), both passed on in its hello: a profile
  check needing a run it does not serve is refused there, before `load`; `taps`, a map from the
  oracle's module names to paths under its `model` attribute (docs/protocol.md, taps), which
  localizes a failing logits row to the first module that differs;
- `load(model_dir: str) -> None`;
- `run(spec: dict, forced: dict | None, decode: str) -> dict`: the record's meta (docs/records.md:
  `rendered_prompt`, `prompt_ids`, `tokens`, `eos_ids`, optional fields) plus `logits` (a 2-D
  array, one row per token) and optional `arrays` ({name: array}). `forced` is the golden's
  record meta when the run is teacher-forced: feed its `tokens`.

An exception in `load` or `run` is answered as an `error` (its type and message); the host
serves on. Anything the package prints on stdout goes to stderr (`guard_stdout`).
"""

import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
import traceback

PROTOCOL = 1
RECORDS_VERSION = 1
MESSAGE_CHARS = 10_000  # of an error's message: a line is at most 1 MiB (docs/protocol.md), a refusal stays one


PROTOCOL_OUT = sys.stdout  # guard_stdout() swaps in a private handle on fd 1 before any import


def say(message):
    PROTOCOL_OUT.write(json.dumps(message) + "\n")
    PROTOCOL_OUT.flush()


def guard_stdout():
    """The protocol owns stdout (docs/protocol.md): keep a private handle on fd 1 and point fd 1
    and sys.stdout at stderr, so that a package printing while it loads or runs (a `print`, a
    progress bar, a C library writing to fd 1) lands in the stderr tail the harness quotes
    instead of breaking the protocol."""
    global PROTOCOL_OUT
    sys.stdout.flush()
    PROTOCOL_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr


def environment(extra):
    found = {"python": sys.version.split()[0]}
    try:
        found["mlx"] = importlib.metadata.version("mlx")
        import mlx.core as mx

        found["device"] = str(mx.default_device())
    except importlib.metadata.PackageNotFoundError:
        found["mlx"] = None
    return dict(extra or {}) | found  # what was measured here wins: a factory may add keys, not override them


def write_record(out, scenario_id, answer, env):
    """What a generator writes for one scenario: the arrays first, result.json last (atomically)."""
    import numpy as np

    answer = dict(answer)
    logits = np.ascontiguousarray(answer.pop("logits"), dtype=np.float32)
    arrays = answer.pop("arrays", None) or {}
    np.save(os.path.join(out, f"{scenario_id}.logits.npy"), logits, allow_pickle=False)
    for name, array in arrays.items():
        np.save(os.path.join(out, f"{scenario_id}.{name}.npy"), np.asarray(array, np.float32), allow_pickle=False)
    if arrays:
        answer["arrays"] = sorted(arrays)
    result = {"records_version": RECORDS_VERSION, "scenarios": {scenario_id: answer}, "environment": env}
    tmp = os.path.join(out, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(out, "result.json"))


def _module_taps():
    """oracles/common/module_taps.py, the tap proxy the oracles and in-tree localization use
    (plain MLX, no project imports), loaded by path from beside this file."""
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "oracles", "common", "module_taps.py"
    )
    spec = importlib.util.spec_from_file_location("module_taps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ModuleTaps:
    """Module taps for a factory that declares them (docs/protocol.md, taps): `info["taps"]` maps
    the oracle's module names to paths under the factory's `model` ("{i}" runs over the layers),
    "logits" to the module whose output is a call's logits. Every call's outputs are kept (the last
    position, float32); the call whose logits row is the run's row `row` is the one answered."""

    def __init__(self, root, correspondence):
        self.calls, self.current, self._restore = [], {}, []
        self._tap = _module_taps()._Tap  # calls the module, then self._record(name, output)
        for name, path in correspondence.items():
            if "{i}" not in name:
                self._swap(root, path, name)
                continue
            i = 0
            while _resolve(root, path.format(i=i)) is not None:
                self._swap(root, path.format(i=i), name.format(i=i))
                i += 1
            if i == 0:
                raise ValueError(f"taps: {path!r} names no module of the model (for {name!r})")
        if "logits" not in correspondence:
            raise ValueError("taps: no 'logits' entry (the module whose output is each call's logits)")

    def _swap(self, root, path, name):
        parent_path, _, key = path.rpartition(".")
        parent = _resolve(root, parent_path) if parent_path else root
        parent = parent._inner if isinstance(parent, self._tap) else parent  # a block tapped before its parts
        inner = _resolve(root, path)
        if parent is None or inner is None:
            raise ValueError(f"taps: {path!r} names no module of the model (for {name!r})")
        self._restore.append((parent, key, inner))
        tap = self._tap(inner, name, self)
        if isinstance(parent, list):
            parent[int(key)] = tap
        else:
            setattr(parent, key, tap)

    def _record(self, name, out):
        import mlx.core as mx
        import numpy as np

        value = out[0] if isinstance(out, tuple | list) else out  # (output, cache), as attention layers return
        for field in ("logits", "hidden_states"):  # an output object (transformers-style)
            value = getattr(value, field, value) if not isinstance(value, mx.array) else value
        if not isinstance(value, mx.array):
            raise TypeError(f"taps: {name} returned {type(out).__name__}, not an MLX array")
        last = value[0, -1] if value.ndim == 3 else value.reshape(-1)
        self.current[name] = np.array(last.astype(mx.float32))
        if name == "logits":  # a call ends with its logits
            self.calls.append(self.current)
            self.current = {}

    def remove(self):
        for parent, key, inner in reversed(self._restore):
            if isinstance(parent, list):
                parent[int(key)] = inner
            else:
                vars(parent).pop(key, None)  # an MLX module keeps the proxy in its instance dict
                setattr(parent, key, inner)

    def answer(self, logits_row, out):
        """Write the outputs of the call whose logits are `logits_row` (modules.json, module.<k>.npy)."""
        import numpy as np

        found = [c for c in self.calls if np.array_equal(c["logits"], logits_row)]
        if not found:
            raise ValueError(f"taps: none of the {len(self.calls)} model calls made that row's logits")
        order = [name for name in found[0] if name != "logits"]
        for k, name in enumerate(order):
            np.save(os.path.join(out, f"module.{k}.npy"), found[0][name], allow_pickle=False)
        with open(os.path.join(out, "modules.json"), "w") as f:
            json.dump({"order": order}, f)


def _resolve(root, path):
    node = root
    for part in path.split(".") if path else ():
        try:
            node = (
                node[int(part)] if part.isdigit() else (node[part] if isinstance(node, dict) else getattr(node, part))
            )
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
    return node


def run_tapped(impl, message):
    """A teacher-forced run with module taps on (`taps: {"row": r}`): the run as usual, then the
    module outputs of the call that made row r, instead of the record."""
    import numpy as np

    correspondence = (getattr(impl, "info", None) or {}).get("taps")
    if not correspondence or message.get("forced") is None:
        raise ValueError("taps: this implementation declares none" if not correspondence else "taps: forced runs only")
    taps = ModuleTaps(impl.model, correspondence)
    try:
        answer = impl.run(message["spec"], message["forced"], "eager")
    finally:
        taps.remove()
    row = message["taps"]["row"]
    taps.answer(np.asarray(answer["logits"], np.float32)[row], message["out"])


def serve(impl, lines):
    info = dict(getattr(impl, "info", None) or {})
    env = environment(info.get("environment"))
    for line in lines:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            say({"op": "error", "id": None, "message": f"not a JSON line: {line[:200]!r}"})
            continue
        op = message.get("op") if isinstance(message, dict) else None
        try:
            if op == "hello":
                say(
                    {
                        "op": "hello",
                        "protocol": PROTOCOL,
                        "records_version": RECORDS_VERSION,
                        "produces": info.get("produces", "llm"),
                        "name": str(info.get("name", type(impl).__name__)),
                        "version": str(info.get("version", "")),
                        "environment": env,
                        "decodes": list(info.get("decodes", ["eager"])),
                        "taps": bool(info.get("taps")),
                    }
                    | {key: list(info[key]) for key in ("serves", "fields") if key in info}
                )
            elif op == "load":
                impl.load(message["model_dir"])
                say({"op": "loaded"})
            elif op == "run" and message.get("taps") is not None:
                run_tapped(impl, message)
                say({"op": "ran", "id": message["id"]})
            elif op == "run":
                spec = message["spec"]
                started = time.perf_counter()
                answer = impl.run(spec, message.get("forced"), message.get("decode", "eager"))
                compute_s = time.perf_counter() - started  # the factory's run, before the files are written
                write_record(message["out"], spec["id"], answer, env)
                say({"op": "ran", "id": message["id"], "compute_s": compute_s})
            elif op == "bye":
                say({"op": "bye"})
                return
            else:
                say({"op": "error", "id": None, "message": f"unknown op {op!r}: expected hello, load, run or bye"})
        except Exception as e:  # noqa: BLE001 - the implementation's own failure, answered as such
            traceback.print_exc(file=sys.stderr)
            said = f"{type(e).__name__}: {e}"
            if len(said) > MESSAGE_CHARS:
                said = f"{said[:MESSAGE_CHARS]} … [cut: {len(said)} characters]"
            say({"op": "error", "id": message.get("id"), "message": said})


def select_device():
    """MLX_PARITY_DEVICE (cpu or gpu): MLX's default device for the implementation, made so before
    it is imported (a module may make its streams on the default device when imported)."""
    wanted = os.environ.get("MLX_PARITY_DEVICE", "").strip().lower()
    if not wanted or importlib.util.find_spec("mlx") is None:
        return
    import mlx.core as mx

    device = mx.cpu if wanted == "cpu" else mx.gpu
    if not mx.is_available(device):
        sys.exit(f"MLX_PARITY_DEVICE={wanted}: this venv's MLX has no {wanted.upper()}")
    mx.set_default_device(device)


def main():
    if len(sys.argv) < 2 or ":" not in sys.argv[1]:
        sys.exit("usage: host.py package.module:factory [FOLDER...]")
    guard_stdout()
    select_device()
    sys.path[:0] = sys.argv[2:]
    module, _, name = sys.argv[1].partition(":")
    impl = getattr(importlib.import_module(module), name)()
    serve(impl, sys.stdin)


if __name__ == "__main__":
    main()
