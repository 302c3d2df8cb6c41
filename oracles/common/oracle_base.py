"""What the oracle scripts share: the one command line of every script (`--job JOB.json --out
DIR`, as harness/oracle/process.py runs them), and the environment block (versions, device,
BLAS) reported beside the goldens and timings.

Standard library only at import (mlx is imported inside `mlx_environment`); the scripts load
this file by path, since their venvs do not have this repository on sys.path.
"""

import argparse
import importlib.metadata
import json
import platform
from pathlib import Path


def parser(description=None, serve=False):
    """The command line of every oracle script: `--job` (what it is asked: a JSON object the
    harness wrote) and `--out` (an existing folder for what it answers). A benchmark worker
    also takes `--serve`: it then answers one JSON line on stdout per `run` line on stdin."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job", required=True, type=Path, help="what to do: a JSON object")
    parser.add_argument("--out", required=True, type=Path, help="where the results go: a folder")
    if serve:
        parser.add_argument("--serve", action="store_true", help="answer `run` lines on stdin (paired rounds)")
    return parser


def read_job(args):
    """(the job as a dict, the out folder, made if absent) of parsed `args`."""
    job = json.loads(args.job.read_text(encoding="utf-8"))
    if not isinstance(job, dict):
        raise SystemExit(f"--job {args.job}: expected a JSON object, got {type(job).__name__}")
    args.out.mkdir(parents=True, exist_ok=True)
    return job, args.out


def job_and_out(description=None):
    """Parse the command line: (job, out folder)."""
    return read_job(parser(description).parse_args())


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
