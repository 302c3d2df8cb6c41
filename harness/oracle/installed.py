"""Installed distributions checked against their own RECORD (issue 51 part 2, integrity end to end).

A venv's `.complete` marker says it was built; it does not say its files are still what pip
installed. Each distribution whose code decides a verdict (mlx and its backend wheel, mlx-lm,
mlx-whisper, mlx-optiq, openai-whisper and torch, a plug-in's pinned packages) is hashed file by file
against the sha256 its `.dist-info/RECORD` lists, once a process, before the venv is used: a
golden is never written, and a PASS never given, by an interpreter whose library was edited or
corrupted in the cache. Standard library only, and the harness's errors.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import os
import re
from collections.abc import Iterable
from pathlib import Path

from harness.errors import HarnessError

# The distributions whose code computes or decides what the gates compare.
VERIFIED = ("mlx", "mlx-cpu", "mlx-metal", "mlx-cuda", "mlx-lm", "mlx-whisper", "mlx-optiq", "openai-whisper", "torch")


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def site_packages(root: Path) -> Path | None:
    """A venv's site-packages folder (POSIX or Windows layout), or None."""
    found = sorted(root.glob("lib/python*/site-packages")) + sorted(root.glob("Lib/site-packages"))
    return found[0] if found else None


def record_mismatches(site: Path, names: Iterable[str]) -> list[str]:
    """Every file of the named distributions installed in `site` that is missing or does not
    hash to its RECORD's digest, one line each naming the file and the distribution."""
    wanted = {_name(n) for n in names}
    problems = []
    for info in sorted(site.glob("*.dist-info")):
        dist = info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        if _name(dist) not in wanted:
            continue
        record = info / "RECORD"
        try:
            rows = list(csv.reader(record.read_text(encoding="utf-8").splitlines()))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            problems.append(f"{record}: unreadable ({e})")
            continue
        for row in rows:
            if len(row) < 2 or "=" not in row[1]:
                continue  # RECORD itself, and files pip lists without a hash (.pyc)
            algorithm, _, digest = row[1].partition("=")
            path = Path(os.path.normpath(site / row[0]))
            try:
                data = path.read_bytes()
            except OSError:
                problems.append(f"{path}: missing (listed in {dist}'s RECORD)")
                continue
            try:
                actual = base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode()
            except ValueError:
                problems.append(f"{record}: unknown hash {algorithm!r} for {row[0]}")
                continue
            if actual != digest:
                problems.append(f"{path}: {algorithm} {actual} is not the {digest} {dist}'s RECORD lists")
    return problems


_VERIFIED_HERE: set[Path] = set()  # venvs whose files this process hashed and found as installed


def altered(root: Path, names: tuple[str, ...]) -> list[str]:
    """The files of `names` in the venv at `root` that do not hash to their RECORDs; hashed once
    a process (a file edited while a run uses it is that run's own doing)."""
    site = site_packages(root)
    if root in _VERIFIED_HERE or site is None:
        return []
    wrong = record_mismatches(site, names)
    if not wrong:
        _VERIFIED_HERE.add(root)
    return wrong


def check_interpreter() -> None:
    """This interpreter's own libraries (the in-tree implementations compute with its mlx) must
    hash to their RECORDs before any verdict, else an error naming the file."""
    try:
        site = Path(str(importlib.metadata.distribution("mlx").locate_file("")))
    except importlib.metadata.PackageNotFoundError:
        return  # no mlx here: nothing in-tree can run, and the runs say so
    wrong = record_mismatches(site, VERIFIED)
    if wrong:
        raise HarnessError(
            f"this interpreter's libraries were altered after install ({len(wrong)} files): {wrong[0]}; "
            "rebuild the venv (make venv, or remove .venv and run make again)"
        )
