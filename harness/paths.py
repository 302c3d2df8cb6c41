"""Where things live. The cache holds everything large or generated and stays out of git."""

from __future__ import annotations

from pathlib import Path

from harness import settings

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "fixtures" / "audio"  # audio fixtures (WAV) of speech and VAD scenarios


def cache_root() -> Path:
    """Root of the untracked cache (venvs, artifacts, golden blobs, locks).

    `MLX_PARITY_CACHE` moves it (tests use a temporary one); default `<repo>/.cache`.
    """
    return settings.read().cache


def profiles_dir() -> Path:
    return settings.read().profiles


def goldens_dir() -> Path:
    return settings.read().goldens


def reports_dir() -> Path:
    return settings.read().reports


def oracles_dir() -> Path:
    return REPO_ROOT / "oracles"


def shown(path: Path) -> str:
    """A path as messages show it: relative to the repository when inside it (goldens, profiles,
    reports moved elsewhere by MLX_PARITY_* stay absolute)."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
