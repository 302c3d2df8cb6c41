"""A reference implementation of the harness's implementation protocol (version 1), wrapping mlx-lm.

Written from docs/protocol.md and docs/records.md alone: it imports nothing from this repository.
It speaks one JSON object per line on stdin/stdout, logs to stderr, and produces `llm` records for
`plain` and `chat` scenarios with mlx-lm's own `load` and `generate_step` (greedy, eager decode).

    python examples/stdio-client/client.py        # then talk to it: see README.md
"""

import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

PROTOCOL = 1
RECORDS_VERSION = 1
# The spec keys this client runs; any other key with a value changes the run (turns, batch, draft,
# composition, stop, response, forced_prefix, the KV cache options, ...) and is refused.
RUNS = {"id", "kind", "prompt", "messages", "n_tokens", "prefill_step_size", "template_kwargs"}
# What each request must carry (docs/protocol.md).
NEEDS = {"hello": ("protocol", "records_version"), "load": ("model_dir",), "run": ("id", "spec", "out")}
MESSAGE_CHARS = 10_000  # of an error's message: a line is at most 1 MiB (docs/protocol.md)


def log(*args):
    print("stdio-client:", *args, file=sys.stderr, flush=True)


class Refused(Exception):
    """A request this client cannot serve: answered as an `error`, and the client keeps serving."""


class LogitsTap:
    """The model, with the raw last-position logits of every call kept (before any logits processor).

    generate_step calls the model for each prefill chunk, then once per token, then once more (a
    look-ahead for a token it never yields). Attribute access goes to the wrapped model.
    """

    def __init__(self, model):
        self.model = model
        self.rows = []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.rows.append(out[:, -1, :])
        return out

    def __getattr__(self, name):
        return getattr(self.model, name)


def force(tokens):
    """A logits processor choosing `tokens[i]` at the i-th sampling step (teacher forcing).

    generate_step applies it to the logits of every sampling call, in order: the last prefill call
    first, then one per token, then the look-ahead call (left alone). The tap has already kept the
    raw row, so only the choice changes: every id but the forced one becomes -inf.
    """
    step = 0

    def processor(_history, logits):
        nonlocal step
        step += 1
        if step > len(tokens):
            return logits
        token = tokens[step - 1]
        if not 0 <= token < logits.shape[-1]:  # never a silent stand-in (argmax of all -inf is 0)
            raise Refused(f"forced token {token} at step {step - 1}: expected an id in [0, {logits.shape[-1]})")
        # 0 for the forced id, not its logit: forcing holds even where the model gave it -inf or nan.
        return mx.where(mx.arange(logits.shape[-1]) == tokens[step - 1], mx.zeros_like(logits), -mx.inf)

    return processor


def encode(tokenizer, spec):
    """(rendered_prompt, prompt_ids) as mlx-lm's generate builds them."""
    if spec["kind"] == "plain":
        if not isinstance(spec.get("prompt"), str):
            raise Refused("a plain scenario needs a string `prompt`")
        return None, tokenizer.encode(spec["prompt"], add_special_tokens=True)
    if not isinstance(spec.get("messages"), list):
        raise Refused("a chat scenario needs a list of `messages`")
    rendered = tokenizer.apply_chat_template(
        spec["messages"], tokenize=False, add_generation_prompt=True, **(spec.get("template_kwargs") or {})
    )
    # The template already wrote the special tokens (BOS and the like): do not add them twice.
    return rendered, tokenizer.encode(rendered, add_special_tokens=False)


def stream_text(tokenizer, tokens):
    """docs/records.md `stream_text` for one segment: mlx-lm's streaming detokenizer, one piece per token.

    A fresh stream; after each token the segment it hands out, the last one read after finalize()
    (which flushes text held back, e.g. an incomplete multi-byte character). No EOS stops it here.
    """
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    pieces = []
    for i, token in enumerate(tokens):
        detokenizer.add_token(token)
        if i == len(tokens) - 1:
            detokenizer.finalize()
        pieces.append(detokenizer.last_segment)
    return [{"pieces": pieces, "decoded": tokenizer.decode(tokens)}]


class Client:
    def __init__(self):
        self.greeted = False
        self.model = self.tokenizer = None
        self.environment = {
            "mlx": version("mlx"),
            "device": str(mx.default_device()),
            "mlx-lm": version("mlx-lm"),
        }

    def hello(self, request):
        if request.get("protocol") != PROTOCOL or request.get("records_version") != RECORDS_VERSION:
            raise Refused(f"this client speaks protocol {PROTOCOL} and writes records version {RECORDS_VERSION}")
        self.greeted = True
        log("work dir", request.get("work_dir"))
        return {
            "op": "hello",
            "protocol": PROTOCOL,
            "records_version": RECORDS_VERSION,
            "produces": "llm",
            "name": "stdio-client",
            "version": "1.0",
            "environment": self.environment,
            "decodes": ["eager"],
            "taps": False,
        }

    def load(self, request):
        self.model, self.tokenizer = load(str(request["model_dir"]))
        log("loaded", request["model_dir"])
        return {"op": "loaded"}

    def run(self, request):
        spec, forced, out = request["spec"], request.get("forced"), Path(request["out"])
        if self.model is None:
            raise Refused("no model loaded (send `load` first)")
        if request.get("decode", "eager") != "eager":
            raise Refused(f"this client has the eager decode only, not {request['decode']!r}")
        for key, value in spec.items():
            if key not in RUNS and value is not None:
                raise Refused(f"this client runs plain and chat scenarios only: {key}")
        if spec.get("kind") not in ("plain", "chat"):
            raise Refused(f"this client runs plain and chat scenarios only: kind {spec.get('kind')!r}")
        n = spec["n_tokens"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise Refused(f"n_tokens: expected an int >= 1, got {n!r}")
        rendered, prompt_ids = encode(self.tokenizer, spec)

        processors = None
        if forced is not None:
            if len(forced["tokens"]) != n:
                raise Refused(f"forced has {len(forced['tokens'])} tokens, the scenario {n}")
            bad = [t for t in forced["tokens"] if not isinstance(t, int) or isinstance(t, bool) or t < 0]
            if bad:
                raise Refused(f"forced tokens: expected token ids (ints >= 0), got {bad[0]!r}")
            processors = [force(forced["tokens"])]
        started = time.perf_counter()
        tap = LogitsTap(self.model)
        steps = generate_step(
            mx.array(prompt_ids),
            tap,
            max_tokens=n,
            prefill_step_size=spec["prefill_step_size"],
            prompt_cache=make_prompt_cache(self.model),
            logits_processors=processors,
        )
        tokens = [int(token) for token, _logprobs in steps]  # greedy: generate_step's default sampler
        # generate_step prefills all but the prompt's last token in chunks of prefill_step_size (no
        # sampling), then makes n+1 sampling calls: the prompt's last token (row 0, token 0), one fed
        # each token i-1 (row i), and the look-ahead, dropped. So the rows are the calls -(n+1)..-2.
        rows = tap.rows[-(n + 1) : -1]
        logits = np.array(mx.concatenate(rows, axis=0).astype(mx.float32))
        if len(tokens) != n or logits.shape[0] != n:
            raise RuntimeError(f"expected {n} tokens and rows, got {len(tokens)} tokens, {logits.shape[0]} rows")
        compute_s = time.perf_counter() - started  # the decode loop, up to the logits in host memory

        meta = {
            "rendered_prompt": rendered,
            "prompt_ids": [int(i) for i in prompt_ids],
            "tokens": tokens,
            "eos_ids": sorted(int(i) for i in self.tokenizer.eos_token_ids),
            "stream_text": stream_text(self.tokenizer, tokens),
        }
        result = {"records_version": RECORDS_VERSION, "scenarios": {spec["id"]: meta}, "environment": self.environment}
        np.save(out / f"{spec['id']}.logits.npy", logits, allow_pickle=False)
        # result.json last, and atomically: once it is there, the record is complete.
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, out / "result.json")
        log("ran", spec["id"], "forced" if forced is not None else "free", f"{n} tokens")
        return {"op": "ran", "id": request["id"], "compute_s": compute_s}


def serve(stdin, stdout):
    client = Client()
    while line := stdin.readline():
        request_id = None
        try:
            try:
                request = json.loads(line)
            except json.JSONDecodeError as e:
                raise Refused(f"not a JSON line: {e}") from None
            if not isinstance(request, dict) or "op" not in request:
                raise Refused("expected a JSON object with an `op`")
            request_id, op = request.get("id"), request["op"]
            missing = [key for key in NEEDS.get(op, ()) if key not in request]
            if missing:
                raise Refused(f"a {op!r} request needs {', '.join(missing)}")
            if op == "bye":
                answer = {"op": "bye"}
            elif op == "hello":
                answer = client.hello(request)
            elif op not in ("load", "run"):
                raise Refused(f"unknown op {op!r}")
            elif not client.greeted:
                raise Refused(f"`hello` comes first, got {op!r}")
            else:
                answer = getattr(client, op)(request)
        except Exception as e:  # every failure is an answer; the process stays up
            message = str(e) if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
            log("error:", message)
            if len(message) > MESSAGE_CHARS:
                message = f"{message[:MESSAGE_CHARS]} … [cut: {len(message)} characters]"
            answer = {"op": "error", "id": request_id, "message": message}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
        if answer["op"] == "bye":
            return 0
    log("stdin closed without `bye`")
    return 1


if __name__ == "__main__":
    # The protocol owns stdout: keep a private handle on it and point fd 1 (and sys.stdout) at
    # stderr, so that a stray print from mlx-lm or transformers can never corrupt the stream.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    sys.exit(serve(sys.stdin, protocol_out))
