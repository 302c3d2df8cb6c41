"""What an oracle script runs, file by file: part of what its goldens and measurements depend
on, hashed into their provenance beside the script itself."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from types import ModuleType

from harness.oracle.descriptor import VARIANT
from harness.paths import oracles_dir


def common_sources(oracle: str, script: str = "generate.py") -> dict[str, Path]:
    """The oracles/common modules an oracle's script (generate.py; quality.py for the quality
    measurements) loads (by `import name` or `importlib.import_module("name")`; they load none
    themselves): part of what its goldens depend on, hashed into their provenance beside it."""
    common = {p.stem: p for p in sorted((oracles_dir() / "common").glob("*.py"))}
    names = set()
    for node in ast.walk(ast.parse((oracles_dir() / oracle.partition(VARIANT)[0] / script).read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            if isinstance(node.args[0], ast.Constant):
                names.add(node.args[0].value)
    return {name: common[name] for name in sorted(names & set(common))}


def script_sources(oracle: str, script: str) -> dict[str, Path]:
    """Every file `script` of `oracle` runs: itself, the sibling scripts it loads by path (a
    string constant naming one, e.g. quality.py running generate.py's functions), and the
    oracles/common modules each of those loads. Keyed by path relative to oracles/."""
    folder = oracles_dir() / oracle.partition(VARIANT)[0]  # a variant runs its row's scripts
    scripts = {script}
    for node in ast.walk(ast.parse((folder / script).read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py"):
            if (folder / node.value).is_file():
                scripts.add(node.value)
    out = {f"{oracle}/{name}": folder / name for name in sorted(scripts)}
    for name in sorted(scripts):
        out |= {f"common/{m}.py": path for m, path in common_sources(oracle, name).items()}
    return out


@functools.cache
def load_common(name: str) -> ModuleType:
    """An oracles/common module loaded into this process by file path, for the benchmark
    helpers both sides of a paired benchmark must measure with alike (kv_bench, bench_timing:
    standard library and mlx only). Not for a module a generator loads: goldens come from the
    oracle's venv, never from this process."""
    path = oracles_dir() / "common" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"oracles_common_{name}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(f"oracles/common/{name}.py: no such module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
