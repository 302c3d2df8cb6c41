"""The sign-off directory: four files, written whole or not at all, never over an earlier one.

`<out>/signoff-<harness version>-<device key>/` holds index.html, summary.md, report.json
and junit.xml. The files are rendered into a hidden temporary directory beside the target
and the directory is renamed into place. When the name is taken (an earlier sign-off of the
same version on the same device), the new one gets the smallest free numeric suffix:
`signoff-…-2`, `signoff-…-3`, …: every sign-off stays, and the suffix orders them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from harness.signoff.model import ParityReport, ReportError

SIGNOFF_FILES = ("index.html", "summary.md", "report.json", "junit.xml")


def signoff_name(harness_version: str, device_key: str) -> str:
    return f"signoff-{harness_version}-{device_key}"


def write_signoff_dir(out: Path, name: str, files: dict[str, bytes]) -> Path:
    """Write `files` into a new directory `out/name[-N]`; returns the directory written."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=out))
    try:
        for filename, data in files.items():
            (staging / filename).write_bytes(data)
            os.chmod(staging / filename, 0o644)
        os.chmod(staging, 0o755)
        for n in range(1, 10_000):
            target = out / (name if n == 1 else f"{name}-{n}")
            if target.exists():
                continue
            try:
                # rename() onto an existing non-empty directory fails (ENOTEMPTY/EEXIST), so a
                # sign-off that appeared meanwhile is never replaced: try the next suffix.
                staging.rename(target)
                return target
            except OSError:
                if not target.exists():
                    raise
        raise FileExistsError(f"{out}: no free name for {name}")
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def find_previous(out: Path, device_key: str, exclude: Path | None = None) -> Path | None:
    """The newest other sign-off's report.json for the same device under `out` (None if none).

    Newest by the time its sign-off was rendered (recorded in report.json), so copies and
    restored CI caches order correctly whatever their file times. `exclude` is the report
    being re-rendered (`--from-report` of a sign-off's own report.json): not its own previous.
    """
    candidates: list[tuple[str, Path]] = []
    for path in out.glob("signoff-*/report.json"):
        if exclude is not None and path.resolve() == exclude.resolve():
            continue
        try:
            data = json.loads(path.read_text())
            signoff = data.get("signoff") or {}
            key = data.get("context", {}).get("device", {}).get("key")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue  # a half-deleted or foreign folder is not a previous sign-off
        if key == device_key and signoff.get("generated"):
            candidates.append((str(signoff["generated"]), path))
    return max(candidates)[1] if candidates else None


def load_previous(path: Path) -> ParityReport:
    """A previous sign-off's report.json, a sign-off directory, or a plain parity report."""
    if path.is_dir():
        path = path / "report.json"
    if not path.exists():
        raise ReportError(f"{path}: no previous report there")
    return ParityReport.load(path)
