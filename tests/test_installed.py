"""Installed distributions hashed against their own RECORD (issue 51 part 2): a venv whose mlx
(or mlx-lm, or a plug-in's package) was altered after it was built is built again, a build that
still does not hash is refused, and this interpreter's own mlx is checked before a parity run."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from pathlib import Path

import pytest

from harness.errors import HarnessError, OracleError
from harness.oracle import installed
from harness.oracle.installed import record_mismatches


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install(site: Path, dist: str, version: str, files: dict[str, bytes]) -> None:
    """A distribution as pip leaves it: its files and a dist-info whose RECORD hashes them."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    rows = []
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
        rows.append(f"{name},sha256={_digest(data)},{len(data)}")
    rows.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    root = tmp_path / "venv"
    site = root / "lib" / "python3.11" / "site-packages"
    _install(site, "mlx", "0.32.4", {"mlx/core.so": b"\x7fELF" + b"\x00" * 64, "mlx/__init__.py": b""})
    _install(site, "mlx-lm", "0.32.2", {"mlx_lm/generate.py": b"def generate(): ...\n"})
    _install(site, "six", "1.17.0", {"six.py": b"# six\n"})
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / ".complete").write_text("x\n")
    return root


def test_files_as_installed_pass_and_an_altered_or_missing_one_is_named(venv: Path) -> None:
    site = installed.site_packages(venv)
    assert record_mismatches(site, installed.VERIFIED) == []
    (site / "mlx_lm" / "generate.py").write_text("def generate(): return 0\n")
    (site / "mlx" / "core.so").unlink()
    (site / "six.py").write_text("# edited, but six decides nothing\n")
    wrong = record_mismatches(site, installed.VERIFIED)
    assert len(wrong) == 2
    assert any("mlx/core.so: missing (listed in mlx's RECORD)" in w for w in wrong)
    assert any("mlx_lm/generate.py: sha256" in w and "mlx_lm's RECORD" in w for w in wrong)


def test_an_altered_venv_is_built_again_and_a_build_that_still_differs_is_refused(
    venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.oracle import venvs
    from harness.oracle.venvs import OracleEnv, Pins

    monkeypatch.setenv("MLX_PARITY_CACHE", str(venv.parent / "cache"))
    monkeypatch.setattr(installed, "_VERIFIED_HERE", set())
    site = installed.site_packages(venv)
    good = (site / "mlx_lm" / "generate.py").read_bytes()
    (site / "mlx_lm" / "generate.py").write_bytes(good + b"# tampered\n")
    builds = []

    def rebuild(env, pins, what="oracle venv") -> None:  # what pip would put back
        builds.append(env.root)
        (site / "mlx_lm" / "generate.py").write_bytes(good)
        (env.root / ".complete").write_text("x\n")

    monkeypatch.setattr(venvs, "_build", rebuild)
    env = OracleEnv(name="probe", root=venv, pins_hash="x", pins="")
    assert venvs.ensure_built(env, lambda: None, Pins(venv / "pins.txt")) is env and builds == [venv]

    monkeypatch.setattr(installed, "_VERIFIED_HERE", set())
    (site / "mlx" / "core.so").write_bytes(b"corrupt")
    monkeypatch.setattr(venvs, "_build", lambda env, pins, what="oracle venv": None)  # a build that fixes nothing
    with pytest.raises(OracleError, match=r"just built, yet .*mlx/core\.so: sha256 .* refused"):
        venvs.ensure_built(env, lambda: None, Pins(venv / "pins.txt"))
    assert not (venv / ".complete").exists()


def test_this_interpreters_altered_mlx_stops_a_parity_run(venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from harness.oracle.installed import check_interpreter

    site = installed.site_packages(venv)

    class Dist:
        def locate_file(self, name: str) -> str:
            return os.path.join(site, name)

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    check_interpreter()  # as installed
    (site / "mlx" / "__init__.py").write_text("import os\n")
    with pytest.raises(HarnessError, match=r"this interpreter's libraries were altered .*mlx/__init__\.py"):
        check_interpreter()
