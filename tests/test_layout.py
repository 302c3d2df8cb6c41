"""The layout of harness/ (issue 16): one registry names the checks, and no import circles."""

from __future__ import annotations

import ast
from pathlib import Path

from harness.checks.context import NEEDS
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
        assert check.records and check.what, check.name
        assert check.run in ("free", "teacher_forced", "compiled", "session", "vad"), check.name
        assert check.judges in ("bits", "tokens", "tolerance"), check.name
        assert (check.compare is None) == (check.run in ("session", "vad")), check.name
        assert (check.judge_runs is not None) == (check.run == "session"), check.name
        assert set(check.needed) <= set(NEEDS) and len(set(check.needed)) == len(check.needed), check.name


# -- a registry row is the whole check (issue 32 part 2): nothing outside harness/checks/ ---------
# branches on a check's name: the session gathers what rows need, the profile asks rows where
# they apply.

CHECKS_DIR = HARNESS / "checks"
# A literal that is a check's name but means something else there, with what it means.
OTHER_MEANINGS = {"harness/tools/bench_kv_configs.py": "'streaming' is a KV cache configuration, not the VAD check"}


def _name_branches(source: str, where: str, names: set[str]) -> list[str]:
    """Comparisons (==, !=, in, not in) with a check's name as a literal operand."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            hits = [o.value for o in operands if isinstance(o, ast.Constant) and o.value in names]
            found += [f"{where}:{node.lineno}: compares with {h!r}" for h in hits]
    return found


def test_nothing_outside_the_checks_branches_on_a_check_name() -> None:
    stray = []
    for path in _modules().values():
        if not path.is_relative_to(CHECKS_DIR) and str(path.relative_to(REPO_ROOT)) not in OTHER_MEANINGS:
            stray += _name_branches(path.read_text(), str(path.relative_to(REPO_ROOT)), set(CHECKS))
    assert not stray, "say it in the check's registry row (needs, applies, wanted, judge):\n" + "\n".join(stray)


def test_the_name_branch_scan_finds_a_comparison() -> None:
    source = "def f(checks, c):\n    if 'writers' in checks or c == 'mel':\n        return 'writers'\n"
    assert _name_branches(source, "p.py", {"writers", "mel"}) == [
        "p.py:2: compares with 'writers'",
        "p.py:2: compares with 'mel'",
    ]


# Where an implementation's name is a literal that means something else, with what it means.
NOT_AN_IMPLEMENTATION = {
    ("harness/artifacts/convert/ct2_whisper.py", "whisper"): "the converted config's Hugging Face model_type",
    ("harness/artifacts/twins/whisper.py", "whisper"): "the twin config's Hugging Face model_type",
    ("harness/goldens/vad.py", "silero-vad"): "the oracle venv's silero-vad distribution",
    ("harness/oracle/descriptor.py", "silero-vad"): "the oracle's name",
}


def _implementation_literals(source: str, where: str, names: set[str]) -> list[tuple[str, str]]:
    """Every string literal that is an implementation's name, as (where:line, name)."""
    return [
        (f"{where}:{node.lineno}", node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_no_module_but_the_implementation_table_names_an_implementation() -> None:
    """Issue 33 part 1: an implementation is its package and a row of harness/implementations.py;
    what applies to it follows from what it produces (LLM, SPEECH or VAD records)."""
    from harness.implementations import IMPLEMENTATIONS

    table = HARNESS / "implementations.py"
    stray = []
    for path in _modules().values():
        where = str(path.relative_to(REPO_ROOT))
        if path != table:
            found = _implementation_literals(path.read_text(), where, set(IMPLEMENTATIONS))
            stray += [f"{at}: {name!r}" for at, name in found if (where, name) not in NOT_AN_IMPLEMENTATION]
    assert not stray, "say it in the implementation's row (harness/implementations.py):\n" + "\n".join(stray)


def test_the_implementation_scan_finds_a_name() -> None:
    source = "RUNNERS = {'whisper': 1}\nif impl == 'universal-llama':\n    pass\n"
    assert _implementation_literals(source, "p.py", {"whisper", "universal-llama"}) == [
        ("p.py:1", "whisper"),
        ("p.py:2", "universal-llama"),
    ]


def test_no_module_is_over_400_lines() -> None:
    """harness/, models/ and oracles/ alike (issue 32 part 5): split by what a module does."""
    paths = [*HARNESS.rglob("*.py"), *(REPO_ROOT / "models").rglob("*.py"), *(REPO_ROOT / "oracles").rglob("*.py")]
    long = {str(p.relative_to(REPO_ROOT)): n for p in paths if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by what they do: {long}"


def test_every_verb_of_python_m_harness_reaches_its_function() -> None:
    import importlib
    import subprocess
    import sys

    from harness.cli import build_parser
    from harness.cli.verbs import VERBS

    for verb in VERBS:
        module, function = verb.target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), verb.name
    _, subparsers = build_parser()
    assert list(subparsers) == [v.name for v in VERBS]
    out = subprocess.run(
        [sys.executable, "-m", "harness", "vad", "--help"], capture_output=True, text=True, cwd=REPO_ROOT, check=False
    )
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m harness vad"), out.stdout + out.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "harness", "--help"], capture_output=True, text=True, cwd=REPO_ROOT, check=False
    ).stdout
    for verb in VERBS:  # a worker verb is callable, never listed
        assert (f"    {verb.name} " in listed or f"    {verb.name}\n" in listed) != verb.hidden, verb.name


def test_every_model_option_means_a_profile_name() -> None:
    """`--model` is one option, said one way: every verb that takes it takes a profile name."""
    from harness.cli import build_parser

    _, subparsers = build_parser()
    takes = {name for name, p in subparsers.items() if any("--model" in a.option_strings for a in p._actions)}
    assert {"parity", "goldens", "quality", "signoff", "bench", "bench-kv", "mutants"} <= takes
    for name in takes:
        (action,) = [a for a in subparsers[name]._actions if "--model" in a.option_strings]
        assert action.dest == "model" and action.help.startswith("profile name"), (name, action.help)


# -- one command line (issue 32 part 4): arguments are parsed in harness/cli/ alone ---------------

CLI = HARNESS / "cli"
_PARSING = ("ArgumentParser", "add_argument", "add_parser", "add_subparsers", "parse_args", "parse_known_args")


def _argument_parsing(source: str, where: str) -> list[str]:
    """Where `source` builds or runs an argument parser, or reads sys.argv."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _PARSING:
                found.append(f"{where}:{node.lineno}: {name}()")
        elif isinstance(node, ast.Attribute) and node.attr == "argv":
            if isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{where}:{node.lineno}: sys.argv")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


def test_no_arguments_are_parsed_outside_the_cli() -> None:
    stray = []
    for path in [*_modules().values(), *sorted((REPO_ROOT / "models").rglob("*.py"))]:
        if not path.is_relative_to(CLI):
            stray += _argument_parsing(path.read_text(), str(path.relative_to(REPO_ROOT)))
    assert not stray, "declare a verb's arguments in harness/cli/verbs.py and take the parsed ones:\n" + "\n".join(
        stray
    )


def test_the_parsing_scan_finds_each_way_of_parsing() -> None:
    source = (
        "import argparse\nimport sys\n\n\n"
        "def f():\n    p = argparse.ArgumentParser()\n    p.add_argument('--x')\n"
        "    return p.parse_known_args(sys.argv[1:])\n"
    )
    assert _argument_parsing(source, "p.py") == [
        "p.py:6: ArgumentParser()",
        "p.py:7: add_argument()",
        "p.py:8: parse_known_args()",
        "p.py:8: sys.argv",
    ]


# -- the oracle seam (issue 32 part 1): harness/oracle/ alone starts an oracle's process ---------

SEAM = HARNESS / "oracle"
# The processes that are not an oracle's, each where it is started and why.
OTHER_PROCESSES = {
    "harness/goldens/lifecycle.py": "git: the harness commit recorded beside a golden",
    "harness/history/bisect.py": "git bisect in a worktree of its own; each step the harness's parity run",
    "harness/provenance.py": "sysctl: a Mac's chip and OS facts",
    "harness/portability.py": "uv pip compile: do the pins resolve on the other platforms",
    "harness/artifacts/wheels.py": "pip download: the pinned wheel an artifact is read from",
    "harness/signoff/cli.py": "make parity, once per model of the sign-off; sysctl",
    "harness/tools/bench_common.py": "a benchmark side in the project's own interpreter",
    "harness/tools/bench_paired.py": "benchmark workers in the project's own interpreter",
    "harness/mutate/session.py": "cosmic-ray in its own venv (make mutate), git ls-files, the unmutated run",
}
_PROCESS_MODULES = {"subprocess", "multiprocessing", "pty"}
_OS_STARTS = ("system", "popen", "fork", "forkpty", "exec", "spawn", "posix_spawn")


def _process_starts(path: Path) -> list[str]:
    """Where `path` can start a process (an import of subprocess & co., os.system/exec*/spawn*),
    and where it builds an oracle venv's command line itself (`<env>.command(...)`)."""
    found = []
    where = path.relative_to(REPO_ROOT)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names} & _PROCESS_MODULES
            found += [f"{where}:{node.lineno}: import {n}" for n in sorted(names)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _PROCESS_MODULES:
            found.append(f"{where}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "os" and node.func.attr.startswith(_OS_STARTS):
                found.append(f"{where}:{node.lineno}: os.{node.func.attr}()")
            elif node.func.attr == "command":
                found.append(f"{where}:{node.lineno}: an oracle venv's command line (.command())")
    return found


def test_no_process_is_started_outside_the_oracle_seam() -> None:
    stray = []
    for path in _modules().values():
        if path.is_relative_to(SEAM):
            continue
        starts = _process_starts(path)
        if str(path.relative_to(REPO_ROOT)) in OTHER_PROCESSES:
            starts = [s for s in starts if ".command()" in s]  # its own processes, never an oracle's
        stray += starts
    assert not stray, (
        "processes started outside harness/oracle/ (an oracle's script runs through OracleProcess; "
        "another process is listed in OTHER_PROCESSES with why):\n" + "\n".join(stray)
    )
    for name in OTHER_PROCESSES:  # the list names only modules that still start something
        assert _process_starts(REPO_ROOT / name), f"{name} starts no process: take it off OTHER_PROCESSES"


def test_the_process_scan_finds_each_way_of_starting_one() -> None:
    planted = REPO_ROOT / "harness" / "_planted_for_test.py"
    try:
        planted.write_text(
            "import os\nimport subprocess as sp\nfrom multiprocessing import Process\n\n\n"
            "def f(env):\n    os.system('true')\n    os.execv('/bin/true', [])\n    return env.command('x')\n"
        )
        assert _process_starts(planted) == [
            "harness/_planted_for_test.py:2: import subprocess",
            "harness/_planted_for_test.py:3: from multiprocessing import ...",
            "harness/_planted_for_test.py:7: os.system()",
            "harness/_planted_for_test.py:8: os.execv()",
            "harness/_planted_for_test.py:9: an oracle venv's command line (.command())",
        ]
    finally:
        planted.unlink()
