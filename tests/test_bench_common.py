"""harness.tools.bench_common.write_result: a benchmark's JSON may be kept under docs/, so it
holds no path of the machine that ran it, and a failed write leaves an earlier file whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from harness.tools.bench_common import write_result


def test_the_record_names_libraries_and_checkout_paths_without_this_machine(tmp_path: Path) -> None:
    venv_lib = f"{REPO_ROOT}/.cache/venvs/mlx-lm-0123/lib/python3.11/site-packages/mlx_cpu.libs/libblas.so.3"
    result = {
        "cells": [{"environment": {"blas_libraries": [venv_lib, "/usr/lib/libopenblas.so.0"]}}],
        "plot": f"{REPO_ROOT}/docs/img/kv-memory.png",
        "note": "a sentence that only mentions /usr/lib",
    }
    out = write_result(result, "kv-test", tmp_path / "r.json")
    text = out.read_text()
    assert str(REPO_ROOT) not in text
    back = json.loads(text)
    assert back["cells"][0]["environment"]["blas_libraries"] == ["libblas.so.3", "libopenblas.so.0"]
    assert back["plot"] == "docs/img/kv-memory.png"
    assert back["note"] == result["note"]


def test_a_result_that_cannot_be_written_leaves_the_earlier_file(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text('{"earlier": true}\n')
    with pytest.raises(TypeError):
        write_result({"bad": object()}, "kv-test", out)
    assert json.loads(out.read_text()) == {"earlier": True}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
