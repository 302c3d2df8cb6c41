"""Atomic writes: a reader sees the old file or the new one, never half of one.

JSON is written strict (RFC 8259): a non-finite float, which has no JSON number, is written as
the string "NaN", "Infinity" or "-Infinity" (as reports write it, harness/report.py), the
spelling `float()` reads back as the same float (CompactLogits.from_json reads a golden's top-k
values and logsumexp so). Files written before hold bare `-Infinity` tokens, which Python's json
still reads as -inf.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; goldens and reports are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _nonfinite_as_text(value: Any) -> Any:
    """`value` with every non-finite float written as a string ("NaN", "Infinity", "-Infinity")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {_nonfinite_as_text(k) if isinstance(k, float) else k: _nonfinite_as_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nonfinite_as_text(v) for v in value]
    return value


def strict_json_dumps(obj: Any) -> str:
    """JSON text (indented, sorted keys, a final newline) without bare NaN / Infinity: finite
    data gives the very bytes json.dumps gives; non-finite floats become strings."""
    try:
        text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False)
    except ValueError as e:
        if "Out of range float values" not in str(e):
            raise
        text = json.dumps(_nonfinite_as_text(obj), indent=2, sort_keys=True, allow_nan=False)
    return text + "\n"


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, strict_json_dumps(obj).encode())


def atomic_create_json(path: Path, obj: Any) -> None:
    """Write a new file; refuse to replace an existing one (reports are never clobbered)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = strict_json_dumps(obj).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.link(tmp, path)  # fails with FileExistsError instead of overwriting
    finally:
        Path(tmp).unlink(missing_ok=True)
