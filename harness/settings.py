"""The harness's `MLX_PARITY_*` environment settings, read and checked in one place.

A flag is on or off: 1/true/yes/on or 0/false/no/off (any case); unset or empty is its
default. Anything else is an error naming the variable, never "on" by accident
(`MLX_PARITY_OVERLAP=banana`). A directory setting that is set but empty is an error too: an
empty path is the current directory, and `MLX_PARITY_GOLDENS=` once wrote goldens into the
repository root.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.errors import HarnessError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

# Every flag the harness reads, with its default and what it does (checked all at once at start).
FLAGS = {
    "MLX_PARITY_QUIET": (False, "silence live progress on stderr"),
    "MLX_PARITY_LOCALIZE": (True, "localize a failing logits row to its first diverging module"),
    "MLX_PARITY_OVERLAP": (True, "generate absent goldens beside the in-tree side"),
    "MLX_PARITY_REQUIRE_REAL": (False, "refuse a profile's twin: the real artifact is required"),
}
DIRECTORIES = ("MLX_PARITY_CACHE", "MLX_PARITY_PROFILES", "MLX_PARITY_GOLDENS", "MLX_PARITY_REPORTS")


class SettingError(HarnessError):
    """An MLX_PARITY_* variable holds a value the harness cannot act on."""


def flag(name: str) -> bool:
    default, _ = FLAGS[name]
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    if value.lower() in ON:
        return True
    if value.lower() in OFF:
        return False
    raise SettingError(
        f"{name}={value!r}: expected one of {'/'.join(ON)} (on) or {'/'.join(OFF)} (off), or unset "
        f"for the default ({'on' if default else 'off'})"
    )


def directory(name: str, default: Path) -> Path:
    assert name in DIRECTORIES
    value = os.environ.get(name)
    if value is None:
        return default.resolve()
    if not value.strip():
        raise SettingError(f"{name} is set but empty: unset it for the default {default}, or name a directory")
    return Path(value).expanduser().resolve()


def check_all() -> None:
    """Every setting read once, so a bad value stops a run before it starts."""
    for name in FLAGS:
        flag(name)
    for name in DIRECTORIES:
        directory(name, Path("."))
