"""`--dist loadgroup` keeps an xdist_group on one worker, as `make test` and `make parity -n`
assume: a scenario's checks share one in-tree run, a model's gate tests one model load.

pytest 9.2 with pytest-xdist 3.8 broke this silently (pytest-dev/pytest-xdist#1386): every
test still passed, spread over the workers, with each worker repeating the in-tree runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.pytest_plugin import ungrouped

TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.xdist_group("one")
    @pytest.mark.parametrize("i", range(6))
    def test_grouped(i):
        pass

    @pytest.mark.parametrize("i", range(6))
    def test_free(i):
        pass
    """
)


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_groups.py").write_text(TESTS)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ran = re.findall(r"\[(gw\d)\].*PASSED test_groups\.py::(test_\w+)\[(\d)\]", out.stdout)
    assert len(ran) == 12, out.stdout[-2000:]
    grouped = {worker for worker, test, _ in ran if test == "test_grouped"}
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}:\n{out.stdout[-2000:]}"


class _Item:
    def __init__(self, nodeid: str, *groups: str):
        self.nodeid = nodeid
        self.groups = groups

    def iter_markers(self, name: str):
        assert name == "xdist_group"
        return [pytest.mark.xdist_group(g).mark for g in self.groups]


def test_a_worker_whose_groups_were_dropped_is_named() -> None:
    """The parity plugin refuses to run (pytest.UsageError on the worker) when the suffix is missing."""
    items = [_Item("a.yaml::s::mel@m:s", "m:s"), _Item("t.py::x"), _Item("a.yaml::s::encoder_output", "m:s")]
    assert ungrouped(items) == ["a.yaml::s::encoder_output"]
    assert ungrouped([_Item("t.py::y@a_b", "b", "a")]) == []
