"""external-2 F4: a plug-in's venv on its own Python. mlx-beam needs Python >= 3.12 and the plug-in
venv was made with the project's interpreter (pip's "Requires-Python" tail after 203 s, no hint);
now `interpreter:` in the profile's implementation (a version found on this machine, or a path)
makes its venv on that Python, and a Python this machine lacks is named before anything is built,
with the versions it has."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from harness.errors import OracleVersionError, ProfileError
from harness.oracle import plugin as venv
from tests.test_protocol import _judge, _profile

HERE = ".".join(platform.python_version_tuple()[:2])  # this interpreter's 3.x


def test_a_python_this_machine_lacks_is_named_with_the_ones_it_has() -> None:
    with pytest.raises(OracleVersionError) as caught:
        venv.find_interpreter("beam", "3.99")
    said = str(caught.value)
    assert said.startswith("implementation beam: interpreter '3.99': no such Python on this machine (found: ")
    assert platform.python_version() in said and "give its path as `interpreter:`" in said


def test_a_version_or_a_path_is_found_and_keys_the_venv() -> None:
    path, version = venv.find_interpreter("x", HERE)
    assert version.startswith(HERE + ".") and Path(path).is_file()
    assert venv.find_interpreter("x", sys.executable)[1] == platform.python_version()
    plain, digest = venv.plugin_pins("x", ["numpy==2.0"])
    assert plain == "numpy==2.0\n"  # without interpreter: the hash existing venvs were built under
    keyed, same = venv.plugin_pins("x", ["numpy==2.0"], (path, version))
    assert keyed == f"# python {version}\nnumpy==2.0\n" and same == digest  # this Python's venv, reused
    assert venv.plugin_pins("x", ["numpy==2.0"], ("/opt/py", "3.12.4"))[1] != digest  # another minor: its own


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("latest", "interpreter: expected a Python version such as '3.12' or an absolute path, got 'latest'"),
        ("python3.12", "interpreter: expected a Python version such as '3.12' or an absolute path"),
    ],
)
def test_an_interpreter_that_is_neither_version_nor_path_is_refused_at_load(isolated: Path, value, said) -> None:
    from harness.profile.load import load_profile

    impl = {"name": "replay", "python": "fake_factory:replay", "path": ["tests/protocol"], "requirements": ["numpy"]}
    _profile(isolated, impl | {"interpreter": value})
    with pytest.raises(ProfileError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_profile(isolated / "profiles" / "tiny.yaml")


@pytest.mark.slow
def test_the_venv_is_made_on_the_python_the_profile_names(isolated: Path) -> None:
    import numpy as np

    impl = {"name": "replay", "python": "fake_factory:replay", "path": ["tests/protocol"]}
    _profile(isolated, impl | {"requirements": [f"numpy=={np.__version__}"], "interpreter": HERE})
    results, runner = _judge(isolated)
    assert all(r.passed for r in results.values())
    assert runner.hello["environment"]["python"].startswith(HERE + ".")
    built = next((isolated / "cache" / "venvs").glob("plugin-*.requirements.txt")).read_text()
    assert built.startswith(f"# python {HERE}.")


@pytest.mark.slow
def test_a_build_that_fails_on_requires_python_says_to_name_an_interpreter(isolated: Path) -> None:
    """mlx-beam 0.1.0a11 itself (the trial's package: Python >= 3.12), from the package index."""
    from harness.errors import OracleError

    if sys.version_info >= (3, 12):
        pytest.skip("this interpreter is new enough for mlx-beam: nothing to refuse")
    with pytest.raises(OracleError) as caught:
        venv.ensure_plugin_env("mlx-beam", ["mlx-beam==0.1.0a11"], None)
    assert str(caught.value).endswith(
        "for a plug-in, name one with `interpreter:` under the profile's implementation (docs/profiles.md)"
    )
