"""Module taps for any implementation (issue 46 part 3): a Python factory maps the oracle's module
names to its own modules (`info["taps"]`, docs/protocol.md), plugins/host.py taps them on a
teacher-forced run and hands over the outputs of the call that made the failing row, and the
session localizes a plug-in's failure as it does an in-tree one's. Proved on chuk-lazarus
(examples/lazarus): its FAIL names its hand-written RMSNorm, which took a by-hand script in the
external trial (../shared/reviews/external-2.md)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from harness.checks.localize import TappedOutputs, first_divergence
from harness.oracle.plugin import HOST
from harness.paths import REPO_ROOT
from tests.conftest import parity_env


def _host():
    spec = importlib.util.spec_from_file_location("plugin_host", HOST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Block(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.norm = nn.RMSNorm(8)
        self.proj = nn.Linear(8, 8)
        self.scale = scale

    def __call__(self, x):
        return (x + self.proj(self.norm(x)) * self.scale, None)  # (output, cache), as attention layers return


class _Tiny(nn.Module):
    """A model in its own layout: blocks under `blocks`, the head under `head`."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        mx.random.seed(3)
        self.embed = nn.Embedding(16, 8)
        self.blocks = [_Block(scale), _Block(scale)]
        self.final = nn.RMSNorm(8)
        self.head = nn.Linear(8, 16)

    def __call__(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h, _ = block(h)
        return self.head(self.final(h))


TAPS = {
    "model.layers.{i}": "blocks.{i}",  # a block before its parts: the parts are tapped on the block itself
    "model.layers.{i}.input_layernorm": "blocks.{i}.norm",
    "model.embed_tokens": "embed",
    "model.norm": "final",
    "logits": "head",
}


class _Impl:
    info = {"taps": TAPS}

    def __init__(self, scale: float = 1.0):
        self.model = _Tiny(scale)

    def run(self, spec, forced, decode):  # the prompt in one call, then one call per forced token
        rows, ids = [], [1, 2, 3]
        for n in range(spec["n_tokens"]):
            rows.append(self.model(mx.array([ids]))[0, -1])
            ids = ids + [forced["tokens"][n]]
        return {"logits": np.array(mx.stack(rows))}


def _tapped(impl, row: int, out: Path) -> dict[str, np.ndarray]:
    from harness.runners.process import read_module_outputs

    out.mkdir()
    message = {"spec": {"n_tokens": 4}, "forced": {"tokens": [4, 5, 6, 7]}, "taps": {"row": row}, "out": str(out)}
    _host().run_tapped(impl, message)
    return read_module_outputs(out, "tiny")


def test_the_host_answers_the_modules_of_the_call_that_made_the_row(tmp_path: Path) -> None:
    impl = _Impl()
    blocks = [b for b in impl.model.blocks]
    found = _tapped(impl, 2, tmp_path / "r2")
    assert list(found) == [
        "model.embed_tokens",
        "model.layers.0.input_layernorm",
        "model.layers.0",
        "model.layers.1.input_layernorm",
        "model.layers.1",
        "model.norm",
    ]  # the call's execution order, the logits left out
    assert impl.model.blocks == blocks and "norm" not in vars(blocks[0])  # every tap removed
    # Row 2's call saw the prompt and two forced tokens: its last position is token 5's.
    h = impl.model.embed(mx.array([[1, 2, 3, 4, 5]]))
    assert np.array_equal(found["model.embed_tokens"], np.array(h[0, -1]))
    assert not np.array_equal(found["model.embed_tokens"], _tapped(impl, 1, tmp_path / "r1")["model.embed_tokens"])


def test_a_perturbed_module_is_named_first_and_untapped_ones_are_said(tmp_path: Path) -> None:
    good = _tapped(_Impl(), 0, tmp_path / "good")
    bad = TappedOutputs(_tapped(_Impl(scale=1.001), 0, tmp_path / "bad"))
    oracle = {"model.embed_tokens": good["model.embed_tokens"], "model.layers.0.self_attn": good["model.layers.0"]}
    oracle |= {k: v for k, v in good.items() if k != "model.embed_tokens"}
    where = first_divergence(oracle, bad, 0)
    assert where.module == "model.layers.0" and where.modules_compared == 3
    assert "not tapped by the implementation: model.layers.0.self_attn" in where.note
    failed = first_divergence(oracle, TappedOutputs(failed="refused 'run': boom"), 0)
    assert failed.explain() == "first diverging module: unavailable (its module taps failed: refused 'run': boom)"


def test_a_correspondence_that_names_no_module_is_refused(tmp_path: Path) -> None:
    host = _host()
    with pytest.raises(ValueError, match=r"taps: 'layers.\{i\}.norm' names no module of the model"):
        host.ModuleTaps(_Tiny(), {"model.layers.{i}.input_layernorm": "layers.{i}.norm", "logits": "head"})
    with pytest.raises(ValueError, match="taps: no 'logits' entry"):
        host.ModuleTaps(_Tiny(), {"model.norm": "final"})
    impl = _Impl()
    impl.info = {"taps": TAPS}
    with pytest.raises(ValueError, match="taps: forced runs only"):
        host.run_tapped(impl, {"spec": {"n_tokens": 2}, "forced": None, "taps": {"row": 0}, "out": str(tmp_path)})


@pytest.mark.slow
@pytest.mark.xdist_group("llama-spm-mini")
def test_chuk_lazarus_s_fail_names_its_rmsnorm(tmp_path: Path) -> None:
    """Its plain scenarios fail every logits gate by 1-2 ULPs; the localization, through its
    adapter's taps, names the first layer's input norm (its hand-written RMSNorm)."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "harness", "parity", "--model", "llama-spm-mini-lazarus", "--report", str(report)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=parity_env(),
        timeout=1200,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {(r["scenario"], r["check"]): r for r in json.loads(report.read_text())["results"]}
    for scenario in ("plain", "plain-long"):
        for check in ("prefill_logits", "decode_logits", "teacher_forced_logits"):
            row = rows[(scenario, check)]
            assert row["outcome"] == "failed", row["summary"]
            assert row["details"]["localization"]["module"] == "model.layers.0.input_layernorm", row["summary"]
            assert row["details"]["localization"]["max_ulp"] <= 2
        assert rows[(scenario, "greedy_tokens")]["outcome"] == "passed"
    assert re.search(r"module\s+model\.layers\.0\.input_layernorm \(\d+/128 differ, max ULP [12]\)", out.stdout)
    # chat's prompt has a double BOS: its logits rows are said to be compared on different inputs.
    assert rows[("chat", "prompt_identity")]["outcome"] == "failed"
    assert rows[("chat", "prefill_logits")]["details"]["inputs_differ"] == "prompt_ids"
    assert "inputs_differ" not in rows[("plain", "prefill_logits")]["details"]
