"""Where things live. The cache holds everything large or generated and stays out of git."""

from __future__ import annotations

from pathlib import Path

from harness.settings import directory

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "fixtures" / "audio"  # audio fixtures (WAV) of speech and VAD scenarios


def cache_root() -> Path:
    """Root of the untracked cache (venvs, artifacts, golden blobs, locks).

    `MLX_PARITY_CACHE` moves it (tests use a temporary one); default `<repo>/.cache`.
    """
    return directory("MLX_PARITY_CACHE", REPO_ROOT / ".cache")


def profiles_dir() -> Path:
    return directory("MLX_PARITY_PROFILES", REPO_ROOT / "profiles")


def goldens_dir() -> Path:
    return directory("MLX_PARITY_GOLDENS", REPO_ROOT / "goldens")


def reports_dir() -> Path:
    return directory("MLX_PARITY_REPORTS", REPO_ROOT / "reports")


def oracles_dir() -> Path:
    return REPO_ROOT / "oracles"
