"""Divergence localization: which module first computes different bits, on the failing step.

When a logits gate fails at row s, both sides re-run the scenario with module taps
(oracles/common/module_taps.py, one file for both sides) armed on the model call that
predicts row s: the oracle as it made the golden (its own generator's functions, in its
venv, via oracles/<oracle>/diagnose.py), the in-tree side teacher-forced with the golden's
tokens, so both calls see the same inputs. Outputs are compared module by module in the
oracle's execution order (embedding, then per block: input norm, attention, post-attention
norm, MLP, the block; the final norm); the first that differs is named with its statistics.

If every module agrees at that call, the divergence is not in the model graph of that call
(cache conversion, logits processing, what was fed) and the report says so.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from harness.checks.compare import VectorDiff, diff_vectors
from harness.errors import HarnessError
from harness.oracle.descriptor import descriptor
from harness.oracle.process import OracleServer
from harness.paths import oracles_dir
from harness.progress import progress
from harness.records import ScenarioRecord


@dataclass
class Localization:
    row: int
    module: str | None  # None: every tapped module agrees at that call
    diff: VectorDiff | None
    modules_compared: int
    note: str = ""

    def explain(self) -> str:
        if self.module is None and not self.modules_compared:
            return f"first diverging module: unavailable{self.note}"
        if self.module is None:
            return (
                f"all {self.modules_compared} module outputs of that step's model call are bit-identical: "
                f"the divergence is outside the model graph of that call{self.note}"
            )
        return f"first diverging module: {self.module} ({self.diff.explain() if self.diff else self.note})"

    def as_dict(self) -> dict[str, Any]:
        stats = {}
        if self.diff is not None and not self.diff.shape_mismatch:
            names = ("n_differing", "n_elements", "max_abs_diff", "max_rel_diff", "max_ulp")
            stats = {name: getattr(self.diff, name) for name in names}
        return {
            "row": self.row,
            "module": self.module,
            "modules_compared": self.modules_compared,
            "explanation": self.explain(),
        } | stats


def module_taps() -> ModuleType:
    """The one tap implementation, loaded by path (it is oracle-side code too)."""
    path = oracles_dir() / "common" / "module_taps.py"
    spec = importlib.util.spec_from_file_location("module_taps", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def can_localize(spec: dict[str, Any], oracle: str) -> bool:
    """Single-segment language-model scenarios (no draft model) against an oracle with a diagnose script."""
    single = all(spec.get(k) is None for k in ("turns", "batch", "composition", "audio", "draft"))
    return single and "diagnose.py" in descriptor(oracle).scripts


def oracle_module_outputs(oracle: str, model_dir: Path, spec: dict[str, Any], row: int) -> dict[str, np.ndarray]:
    """The oracle's module outputs on `row`'s call, from its diagnose server for this model
    (started on first use: the model is loaded once for every localization of the run)."""
    key = (oracle, str(model_dir))
    if key in _SERVERS and not _SERVERS[key].server.alive:
        _SERVERS.pop(key).close()  # it died (its log said why, in the request that failed): a new one
    if key not in _SERVERS:
        _SERVERS[key] = DiagnoseServer(oracle, model_dir)
    return _SERVERS[key].outputs(spec, row)


def oracle_module_outputs_beside(oracle: str, model_dir: Path, spec: dict[str, Any], row: int) -> Future:
    """`oracle_module_outputs` on the one diagnose thread, which lives as long as the process:
    a server's process dies with the thread that started it (Linux's parent-death signal is
    per thread), so it is never started from a thread that ends."""
    return _THREAD.submit(oracle_module_outputs, oracle, model_dir, spec, row)


def close_servers(model_dir: Path | None = None) -> None:
    """End the diagnose servers (of one model, or all)."""
    for key in [k for k in _SERVERS if model_dir is None or k[1] == str(model_dir)]:
        _SERVERS.pop(key).close()


class DiagnoseServer:
    """`diagnose.py --serve` in the oracle's venv: one request line per localization."""

    def __init__(self, oracle: str, model_dir: Path):
        self.oracle, self.requests = oracle, 0
        with progress.task(f"oracle {oracle}: loading the model for localization"):
            self.server = OracleServer(oracle, "diagnose.py", {"model_dir": str(model_dir)})

    def outputs(self, spec: dict[str, Any], row: int) -> dict[str, np.ndarray]:
        self.requests += 1
        out = self.server.work / f"request-{self.requests}"
        out.mkdir()
        with progress.task(f"oracle {self.oracle}: module outputs of {spec['id']} row {row}"):
            self.server.ask({"scenario": spec, "row": row, "out": str(out)}, f"tapping {spec['id']} row {row}")
        order = json.loads((out / "modules.json").read_text())["order"]
        with np.load(out / "modules.npz") as data:
            return {name: data[name] for name in order}

    def close(self) -> None:
        self.server.close()


_SERVERS: dict[tuple[str, str], DiagnoseServer] = {}
_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagnose")
atexit.register(close_servers)


class TappedOutputs(dict):
    """A plug-in's module outputs (docs/protocol.md, taps): the modules it maps, maybe not all."""

    partial = True

    def __init__(self, *args: Any, failed: str = "") -> None:
        super().__init__(*args)
        self.failed = failed


def localizes(profile: Any, runner: Any) -> bool:
    """In-tree implementations are tapped here; a plug-in when its hello says it taps."""
    return bool(profile.under_test.localizes or getattr(runner, "taps", False))


def module_outputs(runner: Any, spec: dict[str, Any], golden: ScenarioRecord, row: int) -> dict[str, np.ndarray]:
    """The implementation's module outputs on `row`'s call: a plug-in's over the protocol, else tapped here."""
    if not hasattr(runner, "module_outputs"):
        return intree_module_outputs(runner, spec, golden, row)
    try:
        return TappedOutputs(runner.module_outputs(spec, golden, row))
    except HarnessError as e:  # the check keeps its verdict; the localization says why it has none
        return TappedOutputs(failed=str(e))


def intree_module_outputs(runner: Any, spec: dict[str, Any], golden: ScenarioRecord, row: int) -> dict[str, np.ndarray]:
    taps_module = module_taps()
    target = taps_module.prefill_calls(len(golden.prompt_ids), spec["prefill_step_size"]) + row
    taps = taps_module.ModuleTaps(runner.model, target)
    try:
        runner.run(spec, forced=golden)
    finally:
        taps.remove()
    return taps.outputs()


def first_divergence(oracle: dict[str, np.ndarray], intree: dict[str, np.ndarray], row: int) -> Localization:
    """The first of the oracle's modules, in its order, whose output differs; a plug-in's taps may
    leave modules out (compared: those it maps, the rest named in the note)."""
    if getattr(intree, "failed", ""):
        return Localization(row, None, None, 0, note=f" (its module taps failed: {intree.failed})")
    partial, compared, skipped = getattr(intree, "partial", False), 0, []
    for name, expected in oracle.items():
        if name not in intree and partial:
            skipped.append(name)
            continue
        if name not in intree:
            return Localization(row, name, None, compared, note="the in-tree model has no module of that name")
        compared += 1
        diff = diff_vectors(expected, intree[name])
        if not diff.equal:
            return Localization(row, name, diff, compared, note=_untapped(skipped))
    extra = [k for k in intree if k not in oracle]
    note = f"; in-tree has modules the oracle lacks: {extra[:3]}" if extra else ""
    if partial and not compared:
        return Localization(
            row, None, None, 0, note=f"; none of its tapped modules is one of the oracle's: {extra[:3]}"
        )
    return Localization(row, None, None, compared, note=note + _untapped(skipped))


def _untapped(skipped: list[str]) -> str:
    return (
        f"; not tapped by the implementation: {', '.join(skipped[:3])}{' …' if len(skipped) > 3 else ''}"
        if skipped
        else ""
    )
