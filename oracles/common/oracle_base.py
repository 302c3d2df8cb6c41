"""What the oracle scripts share: a command line of required paths, and the environment block
(versions, device, BLAS) reported beside the goldens and timings.

Standard library only at import (mlx is imported inside `mlx_environment`); the scripts load
this file by path, since their venvs do not have this repository on sys.path.
"""

import argparse
import importlib.metadata
import platform
from pathlib import Path


def path_parser(*flags):
    """An argument parser where each of `flags` (e.g. "--spec") is a required path."""
    parser = argparse.ArgumentParser()
    for flag in flags:
        parser.add_argument(flag, required=True, type=Path)
    return parser


def loaded_libraries():
    """The BLAS libraries this process has mapped (from /proc/self/maps; [] where there is none)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "blas" in line.lower()})
    except OSError:
        return []


def versions(*dists, missing_ok=False):
    """{distribution: installed version}; a missing one raises, or is None with `missing_ok`."""
    out = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if not missing_ok:
                raise
            out[dist] = None
    return out


def mlx_environment(*dists, missing_ok=False):
    """The versions of `dists`, then MLX's default device, the Python version and the mapped BLAS."""
    import mlx.core as mx

    return {
        **versions(*dists, missing_ok=missing_ok),
        "device": str(mx.default_device()),
        "python": platform.python_version(),
        "blas_libraries": loaded_libraries(),
    }
