"""Options more than one verb takes, written once: every verb that names a profile says it the
same way (`--model`), every one that writes a file or folder says `--out`, and so on."""

from __future__ import annotations

import argparse
from pathlib import Path


def model(
    parser: argparse.ArgumentParser,
    *,
    many: bool = False,
    required: bool = False,
    default: str | None = None,
    what: str = "",
) -> None:
    """`--model NAME`: a profile name (`python -m harness list` names them); `many`: repeatable."""
    if what:
        parser.add_argument("--model", required=required, help=f"profile name: {what}")
    elif many:
        what = "profile name (repeatable)" + ("" if required else "; default: all")
        parser.add_argument("--model", action="append", default=None if required else [], required=required, help=what)
    elif default is not None:
        parser.add_argument("--model", default=default, help="profile name (default %(default)s)")
    else:
        parser.add_argument("--model", required=required, help="profile name")


def out(parser: argparse.ArgumentParser, what: str = "JSON output (default: a new file under reports/)") -> None:
    parser.add_argument("--out", type=Path, help=what)


def workers(parser: argparse.ArgumentParser, what: str = "pytest-xdist workers (e.g. auto)") -> None:
    parser.add_argument("-n", "--workers", help=what)


def rounds(parser: argparse.ArgumentParser, default: int, what: str = "paired rounds") -> None:
    parser.add_argument("--rounds", type=int, default=default, help=f"{what} (default %(default)s)")
    parser.add_argument("--repeats", type=int, dest="rounds", help="the old name of --rounds")


def steps(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument("--steps", type=int, default=default, help="greedy decode steps per timed run")


def worker(parser: argparse.ArgumentParser, job: str) -> None:
    """A benchmark worker's pair: the model folder and its job file (the parent writes both)."""
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--job", type=Path, required=True, help=job)
