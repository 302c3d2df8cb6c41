"""Every environment variable the harness reads, in one table, read into one typed `Settings`.

No other module of the harness reads `os.environ` (tests/test_layout.py): it asks `read()` for
the typed settings, or `environment()` for the copy a child process inherits. The reference in
docs/settings.md is generated from the table (`python -m harness settings --write`; a test keeps
the two equal).

A flag is on or off: 1/true/yes/on or 0/false/no/off (any case); unset or empty is its
default. Anything else is an error naming the variable, never "on" by accident
(`MLX_PARITY_OVERLAP=banana`). A directory setting that is set but empty is an error too: an
empty path is the current directory, and `MLX_PARITY_GOLDENS=` once wrote goldens into the
repository root.

`read()` reads the environment once per distinct set of values: a run reads it once, and a test
that changes a variable (monkeypatch) gets settings that follow it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")
REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE = REPO_ROOT / "docs" / "settings.md"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")


@dataclass(frozen=True)
class Setting:
    """One environment variable: its `Settings` field, kind, default and what it does."""

    name: str
    field: str
    kind: str  # flag | directory | path | text | choice | present
    default: object
    doc: str
    ours: bool = True  # an MLX_PARITY_* variable, or one the harness honours from its tools


SETTINGS = (
    Setting("MLX_PARITY_QUIET", "quiet", "flag", False, "silence the live progress lines on stderr"),
    Setting(
        "MLX_PARITY_LOCALIZE",
        "localize",
        "flag",
        True,
        "localize a failing logits row to its first diverging module (one more run of each side)",
    ),
    Setting(
        "MLX_PARITY_OVERLAP",
        "overlap",
        "flag",
        True,
        "generate absent goldens with the oracle while the in-tree side runs (where a second core or a GPU is free)",
    ),
    Setting(
        "MLX_PARITY_REQUIRE_REAL",
        "require_real",
        "flag",
        False,
        "refuse a profile's deterministic twin: the real artifact is required",
    ),
    Setting(
        "MLX_PARITY_DEVICE",
        "device",
        "choice",
        "",
        "the MLX device every side computes on: cpu or gpu (`make parity DEVICE=cpu`); unset: MLX's default "
        "(the GPU where there is one). The CPU keys its own goldens (docs/ci.md: a hosted macOS runner's CPU)",
    ),
    Setting("MLX_PARITY_CACHE", "cache", "directory", "<repo>/.cache", "venvs, artifacts, golden blobs, work folders"),
    Setting("MLX_PARITY_PROFILES", "profiles", "directory", "<repo>/profiles", "where the model profiles are read"),
    Setting("MLX_PARITY_GOLDENS", "goldens", "directory", "<repo>/goldens", "golden manifests, read and written"),
    Setting("MLX_PARITY_REPORTS", "reports", "directory", "<repo>/reports", "where parity and sign-off reports go"),
    Setting(
        "MLX_PARITY_HISTORY",
        "history",
        "path",
        None,
        "the results store every parity run appends to (SQLite; docs/history.md); unset: <cache>/history.sqlite",
    ),
    Setting(
        "MLX_PARITY_COVERAGE",
        "coverage",
        "path",
        None,
        "record branch coverage into this folder: a parity run's of models/ (parity/), make test's of the judges "
        "(tests/); `python -m harness coverage` reports it (docs/coverage.md); unset: nothing recorded",
    ),
    Setting(
        "MLX_PARITY_ORACLE_PYTHON",
        "oracle_python",
        "path",
        None,
        "a prepared interpreter for every oracle instead of the venvs built from the pins (machines with no "
        "package index, as the lent GPU machine); its installed versions then key the goldens",
    ),
    Setting(
        "MLX_PARITY_ORACLE_PYTHONPATH",
        "oracle_pythonpath",
        "text",
        "",
        "the PYTHONPATH that interpreter runs with",
    ),
    Setting(
        "HF_HUB_OFFLINE",
        "hub_offline",
        "flag",
        False,
        "resolve hub artifacts from the local Hugging Face cache only (huggingface_hub's own variable)",
        ours=False,
    ),
    Setting(
        "PIP_INDEX_URL",
        "pip_index_url",
        "text",
        "",
        "the package index; `python -m harness portability` hands it to uv as UV_INDEX_URL",
        ours=False,
    ),
    Setting(
        "CI",
        "ci",
        "text",
        "",
        "set to true/1/yes by CI services: progress as plain lines instead of the live bar",
        ours=False,
    ),
    Setting(
        "PYTEST_XDIST_WORKER",
        "xdist_worker",
        "text",
        "",
        "set by pytest-xdist in its workers: no full-vector regeneration ahead there (docs/benchmarks.md)",
        ours=False,
    ),
    *(
        Setting(
            name,
            "proxy",
            "present",
            False,
            "a proxy is in use: the harness does not probe the hub's host directly before a download",
            ours=False,
        )
        for name in PROXY_VARIABLES
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}


class SettingError(HarnessError):
    """An environment variable holds a value the harness cannot act on."""


@dataclass(frozen=True)
class Settings:
    """The environment as the harness reads it, typed and checked."""

    quiet: bool
    localize: bool
    overlap: bool
    require_real: bool
    device: str
    cache: Path
    profiles: Path
    goldens: Path
    reports: Path
    history: Path | None
    coverage: Path | None
    oracle_python: Path | None
    oracle_pythonpath: str
    hub_offline: bool
    pip_index_url: str
    ci: str
    xdist_worker: str
    proxy: bool


def _flag(setting: Setting, value: str | None) -> bool:
    value = (value or "").strip()
    if value == "":
        return bool(setting.default)
    if value.lower() in ON:
        return True
    if value.lower() in OFF:
        return False
    raise SettingError(
        f"{setting.name}={value!r}: expected one of {'/'.join(ON)} (on) or {'/'.join(OFF)} (off), or unset "
        f"for the default ({'on' if setting.default else 'off'})"
    )


def _directory(setting: Setting, value: str | None) -> Path:
    default = REPO_ROOT / str(setting.default).removeprefix("<repo>/")
    if value is None:
        return default.resolve()
    if not value.strip():
        raise SettingError(f"{setting.name} is set but empty: unset it for the default {default}, or name a directory")
    return Path(value).expanduser().resolve()


def _path(setting: Setting, value: str | None) -> Path | None:
    if not value:
        return None  # unset (or empty): the default
    if not value.strip():
        raise SettingError(
            f"{setting.name} is set but blank ({value!r}): unset it for the default, or name a path "
            "(spaces would name a file in the current directory)"
        )
    return Path(value).expanduser()


CHOICES = {"MLX_PARITY_DEVICE": ("cpu", "gpu")}


def _choice(setting: Setting, value: str | None) -> str:
    value = (value or "").strip().lower()
    if value and value not in CHOICES[setting.name]:
        raise SettingError(
            f"{setting.name}={value!r}: expected one of {', '.join(CHOICES[setting.name])}, or unset for the default"
        )
    return value


def _hub_offline(value: str | None) -> bool:
    # huggingface_hub's own reading: anything but unset, empty or 0 is offline (no error: not ours).
    return (value or "").strip() not in ("", "0")


@functools.lru_cache(maxsize=16)
def _parse(values: tuple[str | None, ...]) -> Settings:
    fields: dict[str, object] = {}
    for setting, value in zip(SETTINGS, values, strict=True):
        if setting.kind == "flag":
            parsed = _hub_offline(value) if setting.name == "HF_HUB_OFFLINE" else _flag(setting, value)
        elif setting.kind == "directory":
            parsed = _directory(setting, value)
        elif setting.kind == "path":
            parsed = _path(setting, value)
        elif setting.kind == "choice":
            parsed = _choice(setting, value)
        elif setting.kind == "present":
            parsed = bool(value) or bool(fields.get(setting.field))
        else:
            parsed = value if value is not None else setting.default
        fields[setting.field] = parsed
    return Settings(**fields)


def read() -> Settings:
    """The settings for the environment as it is now (a bad value raises `SettingError`)."""
    return _parse(tuple(os.environ.get(s.name) for s in SETTINGS))


def check_all() -> None:
    """Every setting read once, so a bad value stops a run before it starts."""
    read()


def environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process to inherit (and amend)."""
    return dict(os.environ)


def set_default(name: str, value: str) -> None:
    """Set a known variable for this process and its children unless the user already set it."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not a setting of the harness")
    os.environ.setdefault(name, value)


def reference_markdown() -> str:
    """docs/settings.md, generated from the table."""
    lines = [
        "# Environment settings",
        "",
        "Generated from `harness/settings.py` by `python -m harness settings --write`; a test keeps this page",
        "equal to the table, and no other module of the harness reads the environment.",
        "",
        "Flags take 1/true/yes/on or 0/false/no/off (any case); unset or empty means the default, anything",
        "else stops every verb before it starts with an error naming the variable. A directory that is set",
        "but empty is an error too (it would mean the current directory), and so is a path set to nothing",
        "but spaces (it would name a file of spaces there); an empty path means unset.",
        "",
        "| Variable | Kind | Default | What it does |",
        "|---|---|---|---|",
    ]
    seen_proxy = False
    for s in SETTINGS:
        if s.kind == "present":
            if seen_proxy:
                continue
            seen_proxy = True
            names = ", ".join(f"`{p.name}`" for p in SETTINGS if p.kind == "present")
            lines.append(f"| {names} | set or not | unset | {s.doc} |")
            continue
        if s.kind == "flag":
            default = "on" if s.default else "off"
        elif s.default in (None, ""):
            default = "unset"
        else:
            default = f"`{s.default}`"
        lines.append(f"| `{s.name}` | {s.kind} | {default} | {s.doc} |")
    lines += [
        "",
        "Variables not starting with `MLX_PARITY_` belong to other tools; the harness reads them only",
        "for what the table says.",
        "",
    ]
    return "\n".join(lines)
