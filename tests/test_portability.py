"""Every pin file resolves where the users are (harness/portability.py), and nothing in the
repository names a path that exists only on one machine."""

from __future__ import annotations

import re
import subprocess

import pytest

from harness.paths import REPO_ROOT
from harness.portability import PLATFORMS, PinFile, Platform, PortabilityError, check, pin_files, resolve

pytestmark = pytest.mark.xdist_group("portability")  # one worker: uv's cache is shared


@pytest.mark.parametrize("platform", PLATFORMS, ids=lambda p: p.uv)
@pytest.mark.parametrize("pins", pin_files(), ids=lambda p: p.label)
def test_pins_resolve_on_every_supported_platform(pins: PinFile, platform: Platform) -> None:
    result = check(pins, platform)
    assert result.resolved, f"{pins.label}: nothing resolved for {platform.name}"
    assert not result.problems(), result.problems()
    if not result.complete:
        pytest.skip(result.note)  # what was checkable passed above; the rest is said, not passed


def _variant(pins: PinFile, old: str, new: str) -> str:
    text = pins.path.read_text()
    assert old in text
    return text.replace(old, new)


def test_a_platform_specific_torch_pin_fails_and_names_the_platform() -> None:
    """The pin this project once had: a `+cpu` local version exists on no macOS index, and
    restricting torch to Linux leaves the macOS venv without it."""
    vad = PinFile(REPO_ROOT / "oracles" / "silero-vad" / "requirements.txt", False)
    macos = next(p for p in PLATFORMS if not p.is_linux)
    text = _variant(vad, "torch==2.13.0\n", "torch==2.13.0+cpu\n")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("--extra-index-url"))
    with pytest.raises(PortabilityError, match=r"silero-vad/requirements.txt does not resolve for macOS 14 arm64"):
        resolve(vad, macos, text=text)
    whisper = PinFile(REPO_ROOT / "oracles" / "openai-whisper" / "requirements.txt", False)
    text = _variant(whisper, "torch==2.13.0\n", 'torch==2.13.0; sys_platform == "linux"\n')
    text = "\n".join(line for line in text.splitlines() if not line.startswith("--extra-index-url"))
    from harness.portability import Resolution

    result = Resolution(whisper, macos, resolve(whisper, macos, text=text))
    assert result.problems() == ["oracles/openai-whisper/requirements.txt installs no torch on macOS 14 arm64"]


@pytest.mark.parametrize(
    "platform",
    [
        Platform("macOS 13 arm64", "aarch64-apple-darwin", (("MACOSX_DEPLOYMENT_TARGET", "13.0"),)),
        Platform("linux x86_64 (glibc >= 2.17)", "x86_64-manylinux_2_17"),
    ],
    ids=lambda p: p.name,
)
def test_a_pin_above_the_platform_floor_fails_with_the_platform_named(platform: Platform) -> None:
    project = PinFile(REPO_ROOT / "requirements.txt", False)
    with pytest.raises(PortabilityError, match=rf"requirements.txt does not resolve for {re.escape(platform.name)}"):
        resolve(project, platform)


# Paths that exist on one machine only: a local wheel folder or index, a home or temporary
# directory, this checkout's own location. GPU-machine scripts and their run records are
# about that one machine and may name its paths.
# (Written in pieces so that this file itself holds none of them.)
MACHINE_PATHS = "|".join(
    [
        "--find" + "-links +/",
        "file:" + "///",
        "/opt/wheels",
        "/opt/pypi",
        "/home/[a-z]",
        "/root/",
        "/work/main",
        "/tmp/[a-z]",
    ]
)
# The twins' tokenizer corpus is text ("a path such as /home/user/notes.txt"), not a path used.
ALLOWED = (
    ":!tools/",
    ":!docs/gpu-runs/",
    ":!docs/gpu.md",
    ":!docs/compiled-decode.md",
    ":!tests/test_portability.py",
    ":!harness/artifacts/twins/corpus.py",
)


def test_no_machine_specific_path_in_tracked_files() -> None:
    out = subprocess.run(
        ["git", "grep", "-n", "-I", "-E", "-e", MACHINE_PATHS, "--", *ALLOWED],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    if out.returncode not in (0, 1) and "not a git repository" in out.stderr:
        pytest.skip("not a git checkout: no tracked files to check")
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout == "", "machine-specific paths in tracked files:\n" + out.stdout[:3000]
