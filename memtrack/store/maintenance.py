"""Keeping the database safe: a consistent backup, and an export to JSON run records.

The database on a CI runner is the only copy of the history unless it is backed up. Two
ways, both safe while `memtrack run` or `memtrack ingest` writes:

- `backup`: SQLite's online backup API copies every page inside one read transaction, so
  the copy is a snapshot of one moment even while a writer commits (WAL lets a reader and a
  writer run side by side). The copy is a single self-contained file (rollback journal, not
  WAL), checked with `PRAGMA quick_check`.
- `export_runs`: every run as a portable JSON record, `<run_id>.json`; `memtrack ingest`
  merges them back by run id, so a database can be rebuilt on any machine and version.

And moving a history between engines (`memtrack db copy`): every table copied as it is into
an empty database, an SQLite file or a server's, then compared row for row.
"""

from __future__ import annotations

import itertools
import os
import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from memtrack.errors import ConfigError, StoreError
from memtrack.records import write_json
from memtrack.store.database import (
    BUSY_TIMEOUT_S,
    Store,
    damaged,
    describe_failure,
    newer_schema,
    schema_problem,
)
from memtrack.units import parse_time

_SAFE_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class BackupResult:
    """What `backup` wrote."""

    path: Path
    runs: int
    """Runs in the copy."""
    size_bytes: int


def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def backup_path(db: Path, dest: Path) -> Path:
    """`dest` itself, or a new `dest/<db stem>-<UTC time>[-N].db` when `dest` is a directory."""
    if not dest.is_dir():
        return dest
    stem = f"{db.stem}-{_utc_stamp()}"
    path, n = dest / f"{stem}.db", 1
    while path.exists():  # several backups within one second
        path, n = dest / f"{stem}-{n}.db", n + 1
    return path


def backup(db: Path, dest: Path, *, overwrite: bool = False) -> BackupResult:
    """Copy the live database `db` to `dest` as one consistent snapshot. Raises StoreError."""
    db = Path(db)
    target = backup_path(db, Path(dest))
    if not db.is_file():
        raise StoreError(f"{db}: no such database")
    if target.resolve() == db.resolve():
        raise StoreError(f"{target}: is the database itself")
    if target.exists() and not overwrite:
        raise StoreError(f"{target}: already exists (choose another name, or overwrite it)")
    if not target.parent.is_dir():
        raise StoreError(f"{target.parent}: no such directory")
    # Read-only, so a backup can never change the live file; the busy timeout waits out a
    # writer's checkpoint instead of failing. A quoted URI: '#' or '?' in a folder name is
    # part of the path.
    source = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    leftovers = [tmp, *(tmp.with_name(tmp.name + s) for s in ("-journal", "-wal", "-shm"))]
    try:
        try:
            tables = {r[0] for r in source.execute("select name from sqlite_master")}
        except sqlite3.DatabaseError as exc:
            raise StoreError(describe_failure(exc, db)) from None
        if "runs" not in tables:
            raise StoreError(f"{db}: not a memtrack database (no 'runs' table)")
        newer = newer_schema(source, db)
        if newer is not None:  # this memtrack could not check the copy: none is made
            raise newer
        tmp.unlink(missing_ok=True)
        copy = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            # pages=-1: all pages in one step, inside one read transaction: a snapshot.
            source.backup(copy, pages=-1)
            copy.execute("PRAGMA journal_mode=delete")  # one file, no -wal/-shm beside it
            check = copy.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StoreError(f"{target}: the copy failed its integrity check ({check})")
            # quick_check passes a database with a table dropped: a backup of it would be
            # taken for a good one, and the last good backup rotated away.
            problem = schema_problem(copy)
            if problem:
                raise StoreError(f"{damaged(db, problem)}; no copy made")
            runs = copy.execute("select count(*) from runs").fetchone()[0]
        except sqlite3.Error as exc:
            # Which side failed: a read error names the database, a write error the copy.
            failed = db if "malformed" in str(exc) or "not a database" in str(exc) else tmp
            size = sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())
            words = describe_failure(exc, failed, size if failed == tmp else 0)
            words = words.replace(str(tmp), str(target))
            raise StoreError(f"{words}; no copy left behind") from None
        finally:
            copy.close()
        tmp.replace(target)
    finally:
        source.close()
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
    return BackupResult(path=target, runs=runs, size_bytes=target.stat().st_size)


def parse_since(value: str) -> datetime:
    """A date or an ISO 8601 time; without a zone it is UTC. Raises ConfigError."""
    moment = parse_time(value)
    if moment is None:
        raise ConfigError(
            f"--since: {value!r} is not a date or time (e.g. 2026-01-31 or 2026-01-31T12:00)"
        )
    return moment


def export_runs(store: Store, directory: Path, *, since: datetime | None = None) -> list[Path]:
    """Write each run (started at or after `since`) as `directory/<run_id>.json`, oldest first.

    Rewriting a file that is already there writes the same record again, so an export into
    the same directory is incremental in effect and always complete.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise StoreError(f"{directory}: is not a directory")
    rows = store.conn.execute("select run_id, started_at from runs order by started_at, run_id")
    selected = []
    for run_id, started_at in rows.fetchall():
        if since is not None:
            moment = parse_time(started_at)
            if moment is None or moment < since:
                continue
        if not _SAFE_RUN_ID.match(run_id):
            raise StoreError(f"{store.path}: run id {run_id!r} cannot be a file name")
        selected.append(run_id)
    written = []
    if not directory.parent.is_dir():  # the export's own folder is made, never its parents
        raise StoreError(f"{directory.parent}: no such directory")
    directory.mkdir(exist_ok=True)
    for run_id in selected:
        path = directory / f"{run_id}.json"
        write_json(store.get_run(run_id), path)
        written.append(path)
    return written


# -- moving a history ----------------------------------------------------------------------

COPIED_TABLES = (
    ("environments", "env_id"),
    ("runs", "run_id"),
    ("measurements", "id"),
    ("device_measurements", "id"),
    ("rank_measurements", "id"),
    ("verdicts", "id"),
)
"""The tables of a history, in the order their rows are copied (each after those it names),
each with its key, by which both sides are read in one order."""


@dataclass(frozen=True)
class CopyResult:
    """What `copy_history` copied: the rows of each table, equal on both sides."""

    rows: dict[str, int]


def copy_history(src: Store, dst: Store, *, batch: int = 5000) -> CopyResult:
    """Copy every row of every table of `src`'s history into `dst`, an empty memtrack
    database of the same schema (an SQLite file or a server's, either way), in one
    transaction, then verify row for row: each table read from both sides in key order, every
    row equal, value for value. The rows keep their ids and times: the copy is the same
    history, not a history recorded again. StoreError for a destination that holds runs
    already (runs are merged by `memtrack export` and `memtrack ingest`), or where the
    verification finds a difference (the copy is then left as it is, and says where)."""
    held = [table for table, _ in COPIED_TABLES if dst.count_rows(table)]
    if held:
        raise StoreError(
            f"{dst.path}: holds a history already ({', '.join(held)}); `memtrack db copy` "
            "fills an empty database (merge runs with `memtrack export` and `memtrack ingest`)"
        )
    plan = []
    for table, key in COPIED_TABLES:
        columns = src.column_names(table)
        missing = [c for c in columns if c not in set(dst.column_names(table))]
        if missing:
            raise StoreError(f"{dst.path}: table {table} lacks columns {', '.join(missing)}")
        plan.append((table, key, columns))
    with src.reading():  # one snapshot of a server's history, however many write meanwhile
        dst.insert_tables(
            (table, columns, src.table_rows(table, columns, key, batch))
            for table, key, columns in plan
        )
        return CopyResult(_verified(src, dst, plan, batch))


def _verified(src: Store, dst: Store, plan: list[tuple[str, str, list[str]]], batch: int) -> dict:
    """Each table of `plan` read from both sides in key order, row for row: its rows counted;
    StoreError at the first difference."""
    counts = {}
    for table, key, columns in plan:
        n = 0
        theirs = dst.table_rows(table, columns, key, batch)
        for n, (a, b) in enumerate(
            itertools.zip_longest(src.table_rows(table, columns, key, batch), theirs), 1
        ):
            if a != b:
                raise StoreError(
                    f"{dst.path}: table {table}, row {n} in {key} order differs from the "
                    f"source's ({_first_difference(columns, a, b)})"
                )
        counts[table] = n
    return counts


def copy_history_to_file(src: Store, target: Path, needs: int = 0) -> CopyResult:
    """`copy_history` into a new SQLite file at `target`: made beside it under a name of its
    own, one file (no -wal beside it), and moved into place only once whole and verified, so
    that a failure (a full disk, an interrupt) leaves nothing at `target`. `needs`: the bytes
    the copy may take, for naming a full disk. StoreError."""
    from memtrack.store.opening import open_store

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    leftovers = [tmp, *(tmp.with_name(tmp.name + s) for s in ("-journal", "-wal", "-shm"))]
    try:
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
        try:
            with open_store(tmp) as copy:
                done = copy_history(src, copy)
            one = sqlite3.connect(tmp, isolation_level=None)
            try:
                one.execute("PRAGMA journal_mode=delete")  # one file, no -wal/-shm beside it
            finally:
                one.close()
        except (sqlite3.Error, OSError, StoreError) as exc:
            # the store's own words lack what the copy needs: its cause, described again
            cause = exc.__context__ if isinstance(exc, StoreError) else exc
            if isinstance(cause, (sqlite3.Error, OSError)):
                words = describe_failure(cause, tmp, needs)
            else:
                words = str(exc)
            words = words.replace(str(tmp), str(target))
            raise StoreError(f"{words}; nothing left at {target}") from None
        tmp.replace(target)
    finally:
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
    return done


def backup_server(src: Store, dest: Path, *, overwrite: bool = False) -> BackupResult:
    """A server's history as an SQLite file at `dest` (or `dest/memtrack-<UTC time>.db`):
    one snapshot of it, copied and verified row for row (`copy_history_to_file`) into a file
    of its own beside the target, which replaces the target only once whole. StoreError."""
    target = backup_path(Path("memtrack.db"), Path(dest))
    if target.exists() and not overwrite:
        raise StoreError(f"{target}: already exists (choose another name, or overwrite it)")
    if not target.parent.is_dir():
        raise StoreError(f"{target.parent}: no such directory")
    done = copy_history_to_file(src, target)
    return BackupResult(path=target, runs=done.rows["runs"], size_bytes=target.stat().st_size)


def _first_difference(columns: list[str], a: tuple | None, b: tuple | None) -> str:
    if a is None or b is None:
        return "one side has more rows"
    for column, x, y in zip(columns, a, b, strict=True):
        if x != y:
            return f"{column}: {str(x)[:40]!r} != {str(y)[:40]!r}"
    return "?"
