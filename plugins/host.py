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
  check needing a run it does not serve is refused there, before `load`;
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
                        "taps": False,
                    }
                    | {key: list(info[key]) for key in ("serves", "fields") if key in info}
                )
            elif op == "load":
                impl.load(message["model_dir"])
                say({"op": "loaded"})
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
