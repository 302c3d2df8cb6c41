"""Divergence localization's bookkeeping (harness/checks/localize.py), without an oracle venv: a
module the in-tree model lacks is the first divergence, named as such; a diagnose server that died
is closed and replaced by a new one, which answers the request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.checks import localize
from harness.checks.localize import first_divergence, oracle_module_outputs


def test_a_module_the_in_tree_model_lacks_is_the_first_divergence() -> None:
    """The oracle taps embed then norm; in-tree has embed only: norm is named, after one agreeing module."""
    embed = np.arange(4, dtype=np.float32)
    found = first_divergence({"embed": embed, "norm": embed + 1}, {"embed": embed.copy()}, row=3)
    assert (found.row, found.module, found.diff, found.modules_compared) == (3, "norm", None, 1)
    assert found.explain() == "first diverging module: norm (the in-tree model has no module of that name)"
    agreeing = first_divergence({"embed": embed}, {"embed": embed.copy()}, row=3)
    assert agreeing.module is None and agreeing.modules_compared == 1


class _Server:
    """A stand-in DiagnoseServer: alive or not, recording closes and requests."""

    made: list[_Server] = []

    def __init__(self, oracle: str, model_dir: Path, alive: bool = True):
        self.server = type("Process", (), {"alive": alive})()
        self.closed, self.asked = False, []
        _Server.made.append(self)

    def outputs(self, spec: dict, row: int) -> dict[str, np.ndarray]:
        self.asked.append((spec["id"], row))
        return {"embed": np.zeros(2, np.float32)}

    def close(self) -> None:
        self.closed = True


def test_a_dead_diagnose_server_is_replaced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cached server's process died: it is closed, a new one is started and asked instead."""
    monkeypatch.setattr(_Server, "made", [])
    dead = _Server("mlx-lm", tmp_path, alive=False)
    servers = {("mlx-lm", str(tmp_path)): dead}
    monkeypatch.setattr(localize, "_SERVERS", servers)
    monkeypatch.setattr(localize, "DiagnoseServer", _Server)
    out = oracle_module_outputs("mlx-lm", tmp_path, {"id": "plain"}, 2)
    assert list(out) == ["embed"]
    assert dead.closed and dead.asked == []
    (_, fresh) = _Server.made
    assert servers == {("mlx-lm", str(tmp_path)): fresh} and fresh.asked == [("plain", 2)]
    again = oracle_module_outputs("mlx-lm", tmp_path, {"id": "plain"}, 4)  # alive: kept, no third server
    assert list(again) == ["embed"] and len(_Server.made) == 2 and fresh.asked == [("plain", 2), ("plain", 4)]
