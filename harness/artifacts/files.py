"""Integrity of directories made here: each file's sha256, recorded when it was made and
checked on every use (a corrupt file is said and made again, never trusted)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock

from harness.errors import ArtifactError
from harness.fileio import atomic_write_json
from harness.paths import cache_root
from harness.progress import progress


def sha256_stream(f: BinaryIO) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 22), b""):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


FILES_RECORD = ".files.json"  # relative path -> sha256 of every (non-dot) file, written last


def _listed_files(directory: Path) -> list[str]:
    out = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):
            out.append(rel.as_posix())
    return out


def record_files(directory: Path) -> None:
    """Write the sha256 of every file of a freshly made directory (before it is renamed into place)."""
    record = {name: sha256_file(directory / name) for name in _listed_files(directory)}
    (directory / FILES_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


@contextlib.contextmanager
def building_dir(target: Path, marker: str) -> Iterator[Path]:
    """A temporary directory beside `target` to build into; when the block ends without an
    error its files are recorded, `.complete` gets `marker` and it replaces `target` atomically;
    on an error it is removed and `target` is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        record_files(tmp)
        (tmp / ".complete").write_text(marker + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _index_path(directory: Path) -> Path:
    return cache_root() / "verified" / (hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:24] + ".json")


def _hash_with_index(directory: Path, names: list[str], full: bool = False) -> dict[str, str | None]:
    """sha256 of each file, read again only when its size or mtime changed since the last
    check (the index lives in the cache, never in the directory); None for a missing file.
    `full` reads every file whatever the index says: bit rot keeps size and mtime, so only a
    full read sees it (before goldens are made, and when a gate fails). The index then keeps
    what was read, so a cheap check after a full one sees the rot too."""
    index_path = _index_path(directory)
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    out: dict[str, str | None] = {}
    fresh = {}
    for name in names:
        path = directory / name
        try:
            st = path.stat()  # follows an HF snapshot's symlink to its blob
        except OSError:
            out[name] = None
            continue
        seen = index.get(name) if isinstance(index, dict) else None
        if not full and isinstance(seen, list) and seen[:2] == [st.st_size, st.st_mtime_ns]:
            out[name] = seen[2]
        else:
            out[name] = sha256_file(path)
        fresh[name] = [st.st_size, st.st_mtime_ns, out[name]]
    if fresh != index:
        try:
            atomic_write_json(index_path, fresh)
        except OSError:
            pass  # an unwritable index costs a re-hash next time, nothing else
    return out


def check_files(directory: Path, full: bool = False) -> list[str]:
    """What is wrong with a directory made here, against its own record; [] when intact.
    Cheap by default (a file whose size and mtime are as last hashed is not read); `full`
    reads every file."""
    try:
        record = json.loads((directory / FILES_RECORD).read_text())
    except FileNotFoundError:
        return [f"no {FILES_RECORD} (made by an older harness, or never finished)"]
    except (OSError, ValueError) as e:
        return [f"unreadable {FILES_RECORD}: {e}"]
    actual = _hash_with_index(directory, sorted(record), full=full)
    problems = [
        f"{n}: missing" if actual[n] is None else f"{n}: sha256 {actual[n][:12]}… is not the recorded {record[n][:12]}…"
        for n in sorted(record)
        if actual[n] != record[n]
    ]
    extra = sorted(set(_listed_files(directory)) - set(record))
    return problems + [f"{n}: not in the record" for n in extra]


def file_hashes(directory: Path) -> dict[str, str]:
    """The recorded hashes of a directory made here, after check_files found it intact."""
    problems = check_files(directory)
    if problems:
        raise ArtifactError(f"artifact {directory} is corrupt: {'; '.join(problems[:5])}")
    return json.loads((directory / FILES_RECORD).read_text())


def intact(marker_dir: Path, files_dir: Path, what: str, mend: str, quiet: bool = False) -> bool:
    """A finished directory made here whose files still match their record. A corrupt one is
    said once and made again by the caller, never trusted."""
    if not (marker_dir / ".complete").exists():
        return False
    problems = check_files(files_dir)
    if problems and not quiet:
        progress.say(f"{what} in {files_dir} does not match its record ({'; '.join(problems[:3])}): {mend}")
    return not problems


def build_once(marker_dir: Path, files_dir: Path, what: str, lock: str, build: Callable[[], None]) -> None:
    """A cache directory made once: nothing to do when it is intact; else, under the lock
    `lock` (checked again there: another process may have just made it), `build()` makes it."""
    if intact(marker_dir, files_dir, what, "making it again"):
        return
    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"{lock}.lock")):
        if not intact(marker_dir, files_dir, what, "making it again", quiet=True):
            build()
