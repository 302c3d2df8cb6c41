"""A Python implementation for plugins/host.py in tests/test_protocol.py: FakeOracle's
seeded records through the factory API (docs/protocol.md), no protocol code of its own."""

import importlib.metadata
import sys

import numpy as np


class Replay:
    info = {"name": "replay", "version": "1", "produces": "llm"}

    def __init__(self, fail_on: str | None = None, fail_with: str = ""):
        self.fail_on, self.fail_with = fail_on, fail_with
        self.info = dict(Replay.info, environment={"mlx": _mlx(), "device": "Device(cpu, 0)", "prefix": sys.prefix})

    def load(self, model_dir: str) -> None:
        self.model_dir = model_dir

    def run(self, spec: dict, forced: dict | None, decode: str) -> dict:
        if spec["id"] == self.fail_on:
            raise RuntimeError(self.fail_with or f"cannot run {spec['id']}")
        logits = np.random.default_rng(len(spec["id"])).standard_normal((spec["n_tokens"], 16)).astype(np.float32)
        tokens = forced["tokens"] if forced is not None else [int(t) for t in logits.argmax(axis=1)]
        return {"rendered_prompt": None, "prompt_ids": [1, 2], "tokens": tokens, "eos_ids": [0], "logits": logits}


def _mlx():
    try:
        return importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        return None


def replay() -> Replay:
    return Replay()


def failing_chat() -> Replay:
    return Replay(fail_on="chat")


def failing_chat_at_length() -> Replay:
    return Replay(fail_on="chat", fail_with="no " * 700_000)  # 2.1 MB: over a protocol line's cap


class Chatty(Replay):
    """Prints on stdout as packages do (chuk-lazarus's verbose `from_pretrained`), by `print` and
    by a C-level write to fd 1: the host must keep both off the protocol."""

    def load(self, model_dir: str) -> None:
        print(f"Loading {model_dir} ...")
        import os

        os.write(1, b"fd 1: weights mapped\n")
        super().load(model_dir)

    def run(self, spec: dict, forced: dict | None, decode: str) -> dict:
        print(f"running {spec['id']}", flush=True)
        return super().run(spec, forced, decode)


def chatty() -> Chatty:
    return Chatty()


class FreeOnly(Replay):
    """Declares free runs only in its `info` (as examples/dspark/adapter.py), and refuses forcing."""

    def __init__(self):
        super().__init__()
        self.info = dict(self.info, serves=["free"])

    def run(self, spec: dict, forced: dict | None, decode: str) -> dict:
        if forced is not None:
            raise ValueError("free runs only")
        return super().run(spec, forced, decode)


def free_only() -> FreeOnly:
    return FreeOnly()
