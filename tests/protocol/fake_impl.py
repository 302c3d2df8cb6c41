"""A protocol implementation for tests/test_protocol.py, written from docs/protocol.md: it replays
tests/fakes.py FakeOracle's seeded records (so the gates pass), or breaks the protocol one way,
named by its first argument. Runs with the project's interpreter; imports only numpy."""

import json
import os
import subprocess
import sys
import time

import numpy as np

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
# the mlx a hello names: another than the project's, or none (then the result names the project's: L1)
HELLO_MLX = {"other-mlx": "0.1.0", "mlx-null-hello": None}
MLX = sys.argv[2] if len(sys.argv) > 2 else None  # the project's mlx version, passed by the test


def _row(logits, value):
    out = logits.copy()
    out[min(1, len(out) - 1), 3] = value
    return out


# Hostile probe 2's record attacks (its fakeplug.py FAKE_MODE), each on what this fake replays: the
# harness must refuse the record or fail a check; none may pass (tests/test_protocol.py).
HOSTILE = {
    "nan": lambda lg, m: (_row(lg, np.nan), m),
    "nan_all": lambda lg, m: (np.full_like(lg, np.nan), m),
    "inf": lambda lg, m: (_row(lg, np.inf), m),
    "neginf_row": lambda lg, m: (np.where(np.arange(len(lg))[:, None] == len(lg) - 1, -np.inf, lg), m),
    "shape_1d": lambda lg, m: (lg.reshape(-1), m),
    "shape_3d": lambda lg, m: (lg[None], m),
    "f64": lambda lg, m: (lg.astype(np.float64), m),
    "f16": lambda lg, m: (lg.astype(np.float16), m),
    "i32": lambda lg, m: (lg.astype(np.int32), m),
    "bf16view": lambda lg, m: (lg.view(np.uint32), m),
    "bigendian": lambda lg, m: (lg.astype(">f4"), m),
    "tokens_shift": lambda lg, m: (lg, m | {"tokens": m["tokens"][1:] + m["tokens"][:1]}),
    "eos_lie": lambda lg, m: (lg, m | {"eos_ids": [1, 2, 3]}),
    "prompt_ids_lie": lambda lg, m: (lg, m | {"prompt_ids": m["prompt_ids"][:-1]}),
    "nan_meta": lambda lg, m: (lg, m | {"tokens": [float("nan")] + m["tokens"][1:]}),
    "float_tokens": lambda lg, m: (lg, m | {"tokens": [float(t) + 0.4 for t in m["tokens"]]}),
    "bool_tokens": lambda lg, m: (lg, m | {"tokens": [True] * len(m["tokens"])}),
    "neg_tokens": lambda lg, m: (lg, m | {"tokens": [-t - 1 for t in m["tokens"]]}),
    "big_tokens": lambda lg, m: (lg, m | {"tokens": [t + 16 for t in m["tokens"]]}),
    "few_steps": lambda lg, m: (lg[:-1], m | {"tokens": m["tokens"][:-1]}),
    "many_steps": lambda lg, m: (np.concatenate([lg, lg[-1:]]), m | {"tokens": m["tokens"] + m["tokens"][-1:]}),
}
HOSTILE_FILES = ("other_scenario", "pickle", "symlink_npy", "extra_scenario")  # attacks on the files


def say(message):
    sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    sys.stdout.flush()


def record(spec, forced):
    rng = np.random.default_rng(len(spec["id"]))
    logits = rng.standard_normal((spec["n_tokens"], 16)).astype(np.float32)
    if MODE == "perturbed":  # one ulp in one logit of the last row
        logits.view(np.uint32)[-1, 3] += 1
    if MODE == "wrong-shape":  # 8 columns, its tokens among them: the shape, not an id, is what is wrong
        logits = logits[:, :8]
    tokens = forced["tokens"] if forced is not None else [int(t) for t in logits.argmax(axis=1)]
    if MODE == "wrong-shape":
        tokens = [t % 8 for t in tokens]
    return logits, {"rendered_prompt": None, "prompt_ids": [1, 2], "tokens": tokens, "eos_ids": [0]}


def main():
    if MODE == "exit-at-start":
        print("cannot start: no model runtime here", file=sys.stderr)
        sys.exit(7)
    for line in sys.stdin:
        message = json.loads(line)
        op = message["op"]
        if op == "hello":
            if MODE == "garbage-hello":
                say("Loading weights... done")
                continue
            hello = {
                "op": "hello",
                "protocol": 2 if MODE == "protocol-2" else 1,
                "records_version": 1,
                "produces": "llm",
                "name": "fake",
                "version": "0",
                "environment": {"mlx": HELLO_MLX.get(MODE, MLX), "device": "Device(cpu, 0)"},
                "decodes": ["eager"],
            } | ({"serves": ["free"]} if MODE == "serves-free" else {})  # declares free runs only
            say(hello)
        elif op == "load":
            say({"op": "ran"} if MODE == "wrong-answer" else {"op": "loaded"})
        elif op == "run":
            spec = message["spec"]
            if MODE == "crash-at-run":
                print("Segmentation fault (pretend)", file=sys.stderr)
                os._exit(139)
            if MODE == "hang-at-run":
                time.sleep(3600)
            if MODE == "hang-with-a-child-at-run":  # a child holding its stdout outlives it (P50)
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
                print(f"child {child.pid}", file=sys.stderr, flush=True)
                time.sleep(3600)
            if MODE == "huge-stderr-at-run":  # 50 lines of 1 MiB on stderr, then exit 5 (P51)
                for _ in range(50):
                    sys.stderr.write("y" * (1 << 20) + "\n")
                sys.stderr.flush()
                os._exit(5)
            if MODE == "huge-stdout-at-run":  # a 50 MiB line with no newline, then a hang (P52)
                for _ in range(50):
                    sys.stdout.write("x" * (1 << 20))
                sys.stdout.flush()
                time.sleep(3600)
            if MODE == "refuse-at-length":  # a refusal with a 500 kB message
                say({"op": "error", "id": message["id"], "message": "why " * 125_000})
                continue
            if MODE == "refuse-forced" and message["forced"] is not None:  # declares nothing, refuses forcing
                say({"op": "error", "id": message["id"], "message": "cannot be fed tokens: free runs only"})
                continue
            if MODE == "refuse-run":
                say({"op": "error", "id": message["id"], "message": "no such scenario kind here"})
                continue
            started = time.perf_counter()
            logits, meta = record(spec, message["forced"])
            compute_s = time.perf_counter() - started
            if MODE == "bad-field":
                meta["prompt_ids"] = "1 2"
            logits, meta = HOSTILE.get(MODE, lambda lg, m: (lg, m))(logits, meta)
            out, sid = message["out"], "chat" if MODE == "other_scenario" else spec["id"]
            if MODE == "pickle":  # an object array: never loaded (allow_pickle=False)
                np.save(os.path.join(out, f"{sid}.logits.npy"), np.array([logits, None], object), allow_pickle=True)
            elif MODE == "symlink_npy":  # the logits file a link to another file
                os.symlink("/etc/hostname", os.path.join(out, f"{sid}.logits.npy"))
            else:
                np.save(os.path.join(out, f"{sid}.logits.npy"), logits, allow_pickle=False)
            result = {"records_version": 1, "scenarios": {sid: meta}, "environment": {"mlx": MLX}}
            if MODE == "extra_scenario":  # a record the run did not ask for, beside its own
                result["scenarios"]["intruder"] = meta
            with open(os.path.join(out, "result.json"), "w") as f:
                json.dump(result, f)
            ran = {"op": "ran", "id": "someone-else" if MODE == "wrong-id" else message["id"]}
            say(ran | ({"compute_s": compute_s} if MODE == "ok" else {}))  # optional: only "ok" reports it
        elif op == "bye":
            say({"op": "bye"})
            return


if __name__ == "__main__":
    main()
