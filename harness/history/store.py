"""The results store: every parity run (and sign-off, quality run) appended to one SQLite file.

The standard library's `sqlite3`, not SQLAlchemy: one file, two tables and a handful of
queries need no ORM or engine, the project venv needs no new pin, and the oracle-side
scripts could read it with nothing installed. Its schema is versioned by a `migrations`
table (each applied step with its time); opening an older file applies the missing steps in
one transaction, a newer one is refused. Default path `<cache>/history.sqlite`
(`MLX_PARITY_HISTORY` moves it). Each run stores, per model, the hashes of the profile file,
golden manifests and implementation it ran with (`identities`, and each result's `identity`):
`history` calls a flip flaky only among runs of one identity.

Nothing is ever lost or overwritten: a run is one transaction (WAL, so readers never block a
writer, and a busy timeout, so two runs or xdist's controller and another run append both);
a file that is not a SQLite database (truncated, overwritten), fails SQLite's quick check, or
was written by a newer schema is named in a HarnessError and left exactly as it is. So is a
path the store cannot be at (a directory, a path under a regular file, an unwritable or
read-only place): every failure to open, lock or write it is a HistoryError naming the path, never
an OSError from the middle of a run (the parity run's report is still written, exit 3).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from harness.errors import HarnessError

MAGIC = b"SQLite format 3\x00"


def store_path() -> Path:
    """`MLX_PARITY_HISTORY`, else `<cache>/history.sqlite`."""
    from harness import settings
    from harness.paths import cache_root

    return settings.read().history or cache_root() / "history.sqlite"


BUSY_SECONDS = 60.0

# Each step's SQL, in order; the schema version is the number of steps applied.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,             -- parity | signoff | quality
        started TEXT NOT NULL,
        finished TEXT NOT NULL,
        commit_sha TEXT,
        dirty INTEGER,                  -- 1: the checkout had uncommitted changes
        device_key TEXT,
        harness_version TEXT,
        versions TEXT,                  -- JSON: mlx, python, platform, ...
        pins TEXT,                      -- JSON: per model, its oracles' pins hashes
        verdict TEXT NOT NULL,
        wall_seconds REAL,
        models TEXT NOT NULL,           -- JSON list
        report_path TEXT
    );
    CREATE TABLE results (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        model TEXT NOT NULL,
        scenario TEXT NOT NULL,
        check_name TEXT NOT NULL,
        tier TEXT,
        oracle TEXT,
        outcome TEXT NOT NULL,          -- passed | failed | error
        first_bad_step INTEGER,
        max_ulp INTEGER,
        module TEXT,                    -- the first diverging module, when localized
        seconds REAL,
        summary TEXT
    );
    CREATE INDEX results_by_check ON results (model, check_name, scenario);
    """,
    # What each model of a run was checked against (issue 51 M5): runs.identities, JSON: per
    # model the hashes of its profile file, golden manifests and implementation, and their
    # `key`; results.identity, the key of the result's model. `history` pairs only runs of one
    # key; rows older than this step have none (NULL: unknown), paired with nothing.
    """
    ALTER TABLE runs ADD COLUMN identities TEXT;
    ALTER TABLE results ADD COLUMN identity TEXT;
    """,
    # Each result's figures (issue 46 part 5, harness/history/regress.py), JSON: the per-step
    # rows that differ, the differing elements, the largest |Δ|, the first bad step; NULL where
    # the check records none. A failing check is compared with its previous run's.
    """
    ALTER TABLE results ADD COLUMN figures TEXT;
    """,
)


class HistoryError(HarnessError):
    pass


def _is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def _not_a_place(path: Path, e: OSError, doing: str, why: str | None = None) -> HistoryError:
    """The store cannot be at `path`: what failed and why, and what to do."""
    why = why or e.strerror or str(e) or type(e).__name__
    return HistoryError(
        f"results store {path}: cannot {doing}: {why}; "
        "point MLX_PARITY_HISTORY (or --db) at a file in a writable folder"
    )


@contextmanager
def connect(path: Path, write: bool) -> Iterator[sqlite3.Connection]:
    """The store at `path`, checked (and, to write, made or migrated); never altered when bad.
    Writers take `<path>.lock` first: one that finds the file half made by another (its header
    not written yet) would otherwise call it corrupt."""
    try:
        a_directory = path.is_dir()
    except OSError as e:
        raise _not_a_place(path, e, "read it") from e
    if a_directory:
        raise HistoryError(
            f"results store {path}: a directory, not a file; point MLX_PARITY_HISTORY (or --db) at a file, "
            f"e.g. {path / 'history.sqlite'}"
        )
    if not write:
        with _connect(path, write) as conn:
            yield conn
        return
    lock_path = str(path) + ".lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file" if blocker else None
        raise _not_a_place(path, e, f"make its folder {path.parent}", why) from e
    try:  # made here, so that a place no file can be made in fails now: filelock retries that until its timeout
        os.close(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as e:
        raise _not_a_place(path, e, f"make its lock {lock_path}") from e
    lock = FileLock(lock_path, timeout=BUSY_SECONDS)
    try:
        lock.acquire()
    except Timeout as e:
        raise HistoryError(
            f"results store {path}: its lock {lock_path} stayed taken for {BUSY_SECONDS:.0f} s (another run "
            "writing, or a stale lock on a network file system); nothing written"
        ) from e
    except OSError as e:
        raise _not_a_place(path, e, f"take its lock {lock_path}") from e
    try:
        with _connect(path, write) as conn:
            yield conn
    finally:
        lock.release()


@contextmanager
def _connect(path: Path, write: bool) -> Iterator[sqlite3.Connection]:
    try:
        fresh = not path.exists() or path.stat().st_size == 0
        known = fresh or _is_sqlite(path)
    except OSError as e:
        raise _not_a_place(path, e, "read it") from e
    if not known:
        raise HistoryError(
            f"results store {path}: not a SQLite database (truncated or overwritten?); left untouched: "
            "move it away to start a new one, or point MLX_PARITY_HISTORY elsewhere"
        )
    if fresh and not write:
        raise HistoryError(f"results store {path}: no runs recorded yet (a `make parity` writes it)")
    try:
        conn = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
    except sqlite3.Error as e:
        raise HistoryError(f"results store {path}: cannot open it: {e}") from e
    with closing(conn):
        try:
            if not fresh:
                check = conn.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise HistoryError(f"results store {path}: SQLite's quick check says {check!r}; left untouched")
            _migrate(conn, path, write)
            yield conn
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"results store {path}: {e}; left untouched") from e


def _version(conn: sqlite3.Connection) -> int:
    known = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'migrations'").fetchone()
    return conn.execute("SELECT COUNT(*) FROM migrations").fetchone()[0] if known else 0


def _migrate(conn: sqlite3.Connection, path: Path, write: bool) -> None:
    """`_migrate_once`, again while another process holds the file being made (changing the
    journal mode does not wait on SQLite's busy handler: it answers "locked" at once)."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            return _migrate_once(conn, path, write)
        except sqlite3.OperationalError as e:
            if not any(w in str(e) for w in ("locked", "busy")) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _migrate_once(conn: sqlite3.Connection, path: Path, write: bool) -> None:
    version = _version(conn)
    if version > len(MIGRATIONS):
        raise HistoryError(
            f"results store {path}: schema version {version} is newer than this harness's "
            f"{len(MIGRATIONS)}; left untouched (use the newer harness, or another MLX_PARITY_HISTORY)"
        )
    if version == len(MIGRATIONS):
        return
    if not write:
        raise HistoryError(f"results store {path}: schema version {version} is older; a `make parity` migrates it")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _version(conn) == 0:  # still (another writer may have migrated it meanwhile)
            conn.execute("CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, applied TEXT)")
        for step in range(_version(conn), len(MIGRATIONS)):
            for statement in _statements(MIGRATIONS[step]):
                conn.execute(statement)
            conn.execute("INSERT INTO migrations VALUES (?, datetime('now'))", (step + 1,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip() and not s.strip().startswith("--")]


def checkout_state() -> tuple[str | None, bool | None]:
    """(commit, whether tracked files have uncommitted changes); None where git cannot say."""
    from harness.goldens.lifecycle import harness_commit

    commit = harness_commit()
    if commit.startswith("unknown"):
        return None, None
    return commit.removesuffix("+dirty"), commit.endswith("+dirty")


def record(path: Path, kind: str, report: dict[str, Any], report_path: Path | None) -> int:
    """Append one run and its results in one transaction; the run's id."""
    context = report.get("context", {})
    device = context.get("device", {})
    commit, dirty = checkout_state()
    run = (
        kind,
        report.get("started"),
        report.get("finished"),
        commit or context.get("harness_commit"),
        None if dirty is None else int(dirty),
        device.get("key") or device.get("device_key"),
        report.get("harness_version"),
        json.dumps({k: device.get(k) for k in ("mlx", "python", "platform", "backend", "blas") if k in device}),
        json.dumps(_pins(context)),
        report.get("verdict"),
        report.get("timing", {}).get("wall_seconds"),
        json.dumps(context.get("models", [])),
        str(report_path) if report_path else None,
    )
    identities = _identities(context)
    run = (*run, json.dumps(identities))
    with connect(path, write=True) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            cursor = conn.execute(f"INSERT INTO runs VALUES (NULL, {', '.join('?' * len(run))})", run)
            run_id = int(cursor.lastrowid or 0)
            conn.executemany(
                "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (*_result_row(run_id, r), (identities.get(r["model"]) or {}).get("key"), _figures(r))
                    for r in report.get("results", [])
                ],
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return run_id


def _figures(row: dict[str, Any]) -> str | None:
    from harness.history.figures import figures

    found = figures(row)
    return json.dumps(found) if found is not None else None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def _profile_hash(model: str) -> str | None:
    """The sha256 of the bytes of the profile file `model` is read from now (MLX_PARITY_PROFILES
    included): the run appending itself reads the profile it ran. None where there is none."""
    from harness.profile.load import available_profiles
    from harness.profile.vad import available_vad_profiles

    try:
        path = available_profiles().get(model) or available_vad_profiles().get(model)
        return _sha256(path.read_bytes()) if path is not None else None
    except (HarnessError, OSError):
        return None


def _goldens_hash(goldens: Any) -> str | None:
    """The sha256 of the golden manifests a model's run used (the report's provenance names
    each, MLX_PARITY_GOLDENS included): per scenario its manifest's bytes, or what the report
    says of it where the file cannot be read (none yet, or an error)."""
    if not isinstance(goldens, dict):
        return None
    from harness.paths import REPO_ROOT

    parts = {}
    for scenario, entry in sorted(goldens.items()):
        manifest = entry.get("manifest") if isinstance(entry, dict) else None
        try:
            parts[scenario] = _sha256((REPO_ROOT / manifest).read_bytes()) if isinstance(manifest, str) else None
        except OSError:
            parts[scenario] = None
        if parts[scenario] is None:
            parts[scenario] = {"unread": entry}
    return _sha256(_canonical(parts))


def _identities(context: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """Per model of the run: the hashes of its profile file, its golden manifests and its
    implementation (the report's `provenance.implementation`: in-tree by name, or a plug-in's
    command and pins), and `key`, the hash of the three, which `history` pairs runs by; `key`
    is None (unknown, paired with nothing) where any part cannot be known."""
    provenance = context.get("provenance")
    models = context.get("models")
    if not isinstance(provenance, dict) or not isinstance(models, list):
        return {}
    out: dict[str, dict[str, str | None]] = {}
    for model in models:
        if not isinstance(model, str):
            continue
        facts = provenance.get(model)
        known = isinstance(facts, dict) and "error" not in facts  # else its profile or artifact failed to load
        parts = {
            "profile": _profile_hash(model),
            "goldens": _goldens_hash(facts.get("goldens")) if known else None,
            "implementation": _sha256(_canonical(facts.get("implementation"))) if known else None,
        }
        known = all(parts.values())
        out[model] = parts | {"key": _sha256(_canonical(parts)) if known else None}
    return out


def _pins(context: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for model, facts in (context.get("provenance") or {}).items():
        if isinstance(facts, dict):
            out[model] = {k: v for k, v in facts.items() if "pins" in k or k == "oracles"}
    return out


def _result_row(run_id: int, r: dict[str, Any]) -> tuple:
    details = r.get("details") or {}
    diff = details.get("first_step_diff") or details.get("first_diff") or {}
    where = details.get("localization") or {}
    return (
        run_id,
        r["model"],
        r["scenario"],
        r["check"],
        r.get("tier"),
        r.get("oracle"),
        r["outcome"],
        r.get("first_bad_step"),
        diff.get("max_ulp") if isinstance(diff, dict) else None,
        where.get("module") if isinstance(where, dict) else None,
        r.get("seconds"),
        r.get("summary"),
    )
