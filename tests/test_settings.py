"""One settings object (issue 32 part 4): every environment variable in one table, read into
typed settings, the docs generated from the table, and no other module reading the environment."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import settings
from harness.paths import REPO_ROOT

HARNESS = REPO_ROOT / "harness"


def _environment_reads(source: str, where: str) -> list[str]:
    """Where `source` touches the process environment: os.environ, os.getenv/putenv/unsetenv,
    or names imported from os that do."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"):
                found.append(f"{where}:{node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {a.name for a in node.names} & {"environ", "getenv", "putenv", "unsetenv"}
            found += [f"{where}:{node.lineno}: from os import {n}" for n in sorted(names)]
    return sorted(found, key=lambda f: int(f.split(":")[1]))


def test_no_module_but_settings_reads_the_environment() -> None:
    stray = []
    for path in sorted(HARNESS.rglob("*.py")) + sorted((REPO_ROOT / "models").rglob("*.py")):
        if path == HARNESS / "settings.py":
            continue
        stray += _environment_reads(path.read_text(), str(path.relative_to(REPO_ROOT)))
    assert not stray, "read the environment through harness.settings (read() or environment()):\n" + "\n".join(stray)


def test_the_environment_scan_finds_each_way_of_reading_it() -> None:
    source = (
        "import os\nfrom os import getenv\n\n\n"
        "def f():\n    a = os.environ.get('X')\n    b = os.getenv('Y')\n    os.putenv('Z', '1')\n    return a, b\n"
    )
    assert _environment_reads(source, "p.py") == [
        "p.py:2: from os import getenv",
        "p.py:6: os.environ",
        "p.py:7: os.getenv",
        "p.py:8: os.putenv",
    ]


def test_the_reference_in_the_docs_is_generated_from_the_table() -> None:
    assert settings.REFERENCE.read_text(encoding="utf-8") == settings.reference_markdown(), (
        "docs/settings.md differs from harness/settings.py: run `python -m harness settings --write`"
    )


def test_every_mlx_parity_variable_named_anywhere_is_in_the_table() -> None:
    """A variable the docs, the Makefile, the workflows or the harness name is a setting (the
    test-only MLX_PARITY_TEST_FAULTS of tests/fault_plugin.py apart)."""
    named = set()
    places = [
        *HARNESS.rglob("*.py"),
        *(REPO_ROOT / "docs").glob("*.md"),
        REPO_ROOT / "README.md",
        REPO_ROOT / "Makefile",
    ]
    places += [*(REPO_ROOT / ".github" / "workflows").glob("*.yml"), REPO_ROOT / ".ci" / "run"]
    for path in places:
        named |= set(re.findall(r"MLX_PARITY_[A-Z_]*[A-Z]", path.read_text(encoding="utf-8")))
    assert named - {"MLX_PARITY_TEST_FAULTS"} <= set(settings.BY_NAME), sorted(named - set(settings.BY_NAME))
    ours = {s.name for s in settings.SETTINGS if s.ours}
    assert ours == {n for n in settings.BY_NAME if n.startswith("MLX_PARITY_")}
    assert len({s.field for s in settings.SETTINGS}) == len(settings.SETTINGS) - len(settings.PROXY_VARIABLES) + 1


def test_settings_are_typed_and_follow_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for s in settings.SETTINGS:
        monkeypatch.delenv(s.name, raising=False)
    first = settings.read()
    assert first.localize is True and first.quiet is False and first.oracle_python is None and not first.proxy
    assert first.cache == (REPO_ROOT / ".cache").resolve() and first.goldens == (REPO_ROOT / "goldens").resolve()
    assert settings.read() is first  # the same environment is read once
    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path))
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "OFF")
    monkeypatch.setenv("MLX_PARITY_ORACLE_PYTHON", "/opt/py/bin/python")
    monkeypatch.setenv("https_proxy", "http://proxy:3128")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    now = settings.read()
    assert now.cache == tmp_path.resolve() and now.localize is False and now.proxy and now.hub_offline
    assert now.oracle_python == Path("/opt/py/bin/python")
    monkeypatch.setenv("MLX_PARITY_REPORTS", "  ")
    with pytest.raises(settings.SettingError, match="MLX_PARITY_REPORTS is set but empty"):
        settings.read()


def test_set_default_refuses_a_name_the_table_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_PARITY_LOCALIZE", "")  # so that monkeypatch restores what set_default writes
    monkeypatch.delenv("MLX_PARITY_LOCALIZE")
    settings.set_default("MLX_PARITY_LOCALIZE", "0")
    assert settings.read().localize is False
    settings.set_default("MLX_PARITY_LOCALIZE", "1")  # already set: the user's value stays
    assert settings.read().localize is False
    with pytest.raises(KeyError, match="MLX_PARITY_LOCALISE is not a setting"):
        settings.set_default("MLX_PARITY_LOCALISE", "0")


def test_the_settings_verb_prints_the_reference() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness", "settings"], capture_output=True, text=True, cwd=REPO_ROOT, check=False
    )
    assert out.returncode == 0 and out.stdout == settings.reference_markdown(), out.stderr


@pytest.mark.parametrize("value", ["  ", "\t", " \n "])
def test_m4_l13_s13_a_blank_path_setting_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """M4 / L13 (S13): MLX_PARITY_HISTORY='  ' is refused like a blank directory setting, not taken
    as a file named by spaces in the current directory; empty still means unset."""
    for s in settings.SETTINGS:
        monkeypatch.delenv(s.name, raising=False)
    monkeypatch.setenv("MLX_PARITY_HISTORY", value)
    with pytest.raises(settings.SettingError, match="MLX_PARITY_HISTORY is set but blank"):
        settings.read()
    monkeypatch.setenv("MLX_PARITY_HISTORY", "")
    assert settings.read().history is None
    monkeypatch.setenv("MLX_PARITY_HISTORY", value)
    out = subprocess.run(
        [sys.executable, "-m", "harness", "history"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith("error: MLX_PARITY_HISTORY is set but blank"), out.stderr
