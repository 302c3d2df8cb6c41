"""The layout of harness/ (issue 16): one registry names the checks, and no import circles."""

from __future__ import annotations

import ast
from pathlib import Path

from harness.checks.registry import CHECKS
from harness.paths import REPO_ROOT

HARNESS = REPO_ROOT / "harness"
REGISTRY = HARNESS / "checks" / "registry.py"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(HARNESS.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The harness modules `name` imports, at module level or inside functions."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def test_harness_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(trail[trail.index(nxt) :] + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def _stray_lists(path: Path) -> list[str]:
    """Literal lists, tuples, sets and dicts holding two or more check names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        names = [i.value for i in items if isinstance(i, ast.Constant) and i.value in CHECKS]
        if len(names) >= 2:
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {names}")
    return found


def test_check_names_are_listed_only_in_the_registry() -> None:
    stray = [line for path in _modules().values() if path != REGISTRY for line in _stray_lists(path)]
    assert not stray, "check names listed outside harness/checks/registry.py:\n" + "\n".join(stray)


def test_the_stray_list_scan_finds_a_list_of_check_names(tmp_path: Path) -> None:
    planted = REPO_ROOT / "harness" / "_planted_for_test.py"
    try:
        planted.write_text('GATES = ("decode_logits", "greedy_tokens")\nONE = "decode_logits"\n')
        assert _stray_lists(planted) == [f"harness/_planted_for_test.py:1: {['decode_logits', 'greedy_tokens']}"]
    finally:
        planted.unlink()


def test_every_check_applies_somewhere_and_says_how_it_is_judged() -> None:
    for check in CHECKS.values():
        assert check.implementations and check.what, check.name
        assert check.run in ("free", "teacher_forced", "compiled", "session", "vad"), check.name
        assert check.judges in ("bits", "tokens", "tolerance"), check.name
        assert (check.judge is None) == (check.run in ("session", "vad")), check.name


def test_no_harness_module_is_over_400_lines() -> None:
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert not long, f"split these by what they do: {long}"


def test_every_verb_of_python_m_harness_reaches_its_tool() -> None:
    import importlib
    import subprocess
    import sys

    from harness.__main__ import TOOLS

    for verb, (module, _) in TOOLS.items():
        assert callable(importlib.import_module(module).main), verb
    out = subprocess.run(
        [sys.executable, "-m", "harness", "vad", "--help"], capture_output=True, text=True, cwd=REPO_ROOT, check=False
    )
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m harness vad"), out.stdout + out.stderr
