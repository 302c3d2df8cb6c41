"""A fake oracle and artifact for session/store tests that must not build real venvs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.artifacts.resolve import ResolvedArtifact
from harness.provenance import device_facts
from harness.records import ScenarioRecord
from harness.session import ParitySession


class FakeOracle:
    """Deterministic 'oracle': seeded logits; appends one line per run to a counter file."""

    counter: Path | None = None
    delay: float = 0.0
    with_arrays: bool = False  # records carry a named tensor too (as Whisper's mel and encoder output)

    def __init__(self, oracle: str):
        self.oracle = oracle

    def run(self, model_dir: Path, specs: list[dict[str, Any]]):
        if FakeOracle.counter is not None:
            with open(FakeOracle.counter, "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(FakeOracle.delay)
        return {"mlx": device_facts().mlx, "device": "Device(cpu, 0)"}, self.records(specs), {}

    @staticmethod
    def records(specs: list[dict[str, Any]]) -> dict[str, ScenarioRecord]:
        """What `run` returns for `specs`, without its counter or delay (a fake in-tree side replays it)."""
        records = {}
        for spec in specs:
            rng = np.random.default_rng(len(spec["id"]))
            logits = rng.standard_normal((spec["n_tokens"], 16)).astype(np.float32)
            records[spec["id"]] = ScenarioRecord(
                scenario_id=spec["id"],
                rendered_prompt=None,
                prompt_ids=[1, 2],
                tokens=[int(t) for t in logits.argmax(axis=1)],
                logits=logits,
                eos_ids=[0],
                arrays={"encoder": rng.standard_normal((3, 5)).astype(np.float32)} if FakeOracle.with_arrays else {},
            )
        return records


def fake_session(model_dir: Path, weights_hash: str = "w0") -> ParitySession:
    session = ParitySession(oracle_runner=FakeOracle)
    artifact = ResolvedArtifact(
        model_dir=model_dir,
        identity={"source": "fake"},
        weight_hashes={"model.safetensors": weights_hash},
        tokenizer_hash="t0",
    )
    session.artifacts.resolved["tiny"] = artifact
    session.artifacts.verified_in_full.add(
        "tiny"
    )  # a fake artifact has no files to read in full (tests/test_bitrot.py)
    return session


class FakeSessionPlugin:
    """A pytest plugin that gives a parity run the fake session, `runner` as profile tiny's in-tree side."""

    def __init__(self, root: Path, runner: Any):
        self.root, self.runner = root, runner

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        from harness.pytest_items import _SESSION_KEY

        session = fake_session(self.root)
        session._runners["tiny"] = self.runner
        config.stash[_SESSION_KEY] = session
