"""The SQLite store: runs, environments, measurements and per-device rows.

Schema changes only through `memtrack.store.migrations` (sqlite-utils), one function per change,
applied under an exclusive lock so that processes opening a new database at once do not race.
A run, or a whole batch of ingested runs, is written in one `BEGIN IMMEDIATE` transaction, so
a killed process or a full disk leaves no half run. The file stays a plain SQLite database
that `sqlite3` or Datasette can open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from memtrack import records
from memtrack.errors import RecordError, StoreError
from memtrack.records import Measurement, RunRecord, metrics, run_from_dict, to_dict
from memtrack.records.validate import check_run
from memtrack.store import migrations
from memtrack.store.rows import RUN_OWN, RUN_REPOSITORY, Batch, Prepared

BUSY_TIMEOUT_S = 30.0
MIN_FREE_BYTES = 4 * 2**20
"""Room a run needs where it is written: a database refuses a run before its first case
with less free (a run's rows, the write-ahead log, a checkpoint), as a JSON record does."""
VERDICT_COLUMNS = (
    "run_id",
    "case_id",
    "workload",
    "metric",
    "kind",
    "blocking",
    "provisional",
    "baseline_value",
    "spread",
    "factor",
    "floor",
    "threshold",
    "candidate_value",
    "delta",
    "delta_pct",
    "budget_bytes",
    "budget_reason",
    "baseline_runs",
    "message",
    "checked_at",
    "context",
    "accepted_reason",
    "component",
    "component_delta",
    "level_commit",
)
"""The columns of table `verdicts` that `memtrack check` writes and the dashboard reads:
each the verdict's field of the same name, but those in _CHECK_COLUMNS."""
_CHECK_COLUMNS = {"run_id", "checked_at"}
"""The columns of a verdict's row that are its check's: the run it is recorded against
(the candidate, or the shard run holding its case) and when it was checked."""
_VERDICT_FIELDS = tuple(c for c in VERDICT_COLUMNS if c not in _CHECK_COLUMNS)
_INSERT_VERDICT = (
    f"insert into verdicts ({', '.join(VERDICT_COLUMNS)}) "
    f"values ({', '.join(':' + c for c in VERDICT_COLUMNS)})"
)
_BATCH = 500
"""Records buffered before their rows are written with executemany (inside one transaction)."""
_LOOKUP = 64
"""Records whose run ids are looked up in the store by one query."""

MEASURED_RUN = (
    "and exists (select 1 from measurements x where x.run_id = runs.run_id and x.kind = 'measured')"
)
"""SQL: the run (of table `runs`, unaliased) measured something: it is not an estimate run."""


ALL_REPOSITORIES = "*"
"""`Store.repository` of a reader of every repository's runs (no identity is '*')."""


CHUNK = 500
"""Cases per query where a question is asked of each, in a list of values bound each."""


def of_repository(scope: str, runs: str = "r", mark: str = "?") -> str:
    """SQL: the run (of table `runs` as `runs` names it) is of the repository `scope` (a
    `Store.scope`), or of none recorded (a run recorded before repositories were, or
    outside any); `mark` is the placeholder its caller binds to `scope`. For every
    repository ('*') a condition that is true whatever the run (the planner drops it).
    Every read of a history goes through it: baselines, acceptances and a branch's or a
    commit's runs never cross repositories."""
    if scope == ALL_REPOSITORIES:
        return f"coalesce({mark}, '') = '*'"
    return f"coalesce({runs}.git_repository, '') in ('', {mark})"


class CheckedRun(Protocol):
    """What `Store.save_verdicts` records of a check (memtrack.judge.decide.CheckResult):
    the run it judged, when, and, per case, the run holding its figures (`case_runs`, else
    `run_id`), on which each verdict is recorded."""

    @property
    def run_id(self) -> str: ...

    @property
    def checked_at(self) -> str: ...

    @property
    def case_runs(self) -> Mapping[str, str]: ...


def verdict_row(verdict: Mapping[str, Any], run_id: str, checked_at: str) -> dict[str, Any]:
    """A verdict's row of table `verdicts` from its flat record (memtrack.report.check.flat):
    each column its value of that name (a flag as 0 or 1), and the check's own columns."""
    row = {c: verdict.get(c) for c in _VERDICT_FIELDS}
    row.update(run_id=run_id, checked_at=checked_at)
    return {c: int(v) if isinstance(v, bool) else v for c, v in row.items()}


last_path: Path | None = None
"""The database this process opened last: the CLI names it when an SQLite error escapes."""


def _selection(row: Any) -> tuple[str, ...]:
    """A run's selection, as stored (JSON text; NULL for the whole suite, or a row from
    before the migration that added it)."""
    keys = row.keys() if hasattr(row, "keys") else ()
    raw = row["selection"] if "selection" in keys else None
    return tuple(str(x) for x in json.loads(raw)) if raw else ()


def _unprefixed(cls: type, row: dict[str, Any], prefix: str, json_fields: set[str]) -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = row.get(prefix + f.name)
        if f.name in json_fields and isinstance(value, str):
            value = json.loads(value)
            value = tuple(value) if isinstance(value, list) else value
        kwargs[f.name] = value
    return cls(**kwargs)


_GIT_JSON = {"notes"}
_ENV_JSON = {"gpus", "torch_cuda_arch_list", "packages", "env_vars", "visible_uuids", "notes"}
_MEASUREMENT_JSON = {
    f.name
    for f in dataclasses.fields(Measurement)
    if str(f.type).startswith(("tuple", "dict")) and f.name not in ("devices", "ranks")
}
"""A measurement's lists and mappings, stored as JSON text (store.rows); NULL in rows from
before the migration that added the column."""
_MEASUREMENT_FIELDS = {
    f.name: f for f in dataclasses.fields(Measurement) if f.name in _MEASUREMENT_JSON
}


def _repository(run: RunRecord | Prepared) -> str | None:
    """The repository a run to write is of (its rows', for one read elsewhere)."""
    if isinstance(run, Prepared):
        return run.rows.run[RUN_REPOSITORY] if run.rows is not None else None
    return run.git.repository


def chunks(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    """`items` in lists of `n` (the last one shorter)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


# -- failures, in plain words --------------------------------------------------------------


def _out_of_space(path: Path, needs: int = 0) -> bool:
    """Whether a failed write at `path` ran out of room: a nearly full file system, or a file
    at the process's file size limit (RLIMIT_FSIZE; such writes fail with EFBIG), or one
    that was to grow to `needs` bytes past it (SQLite sizes a backup's copy at once)."""
    import resource
    import shutil

    try:
        if shutil.disk_usage(path.parent).free < 2**20:
            return True
    except OSError:
        pass
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return False
    if needs + 2**16 >= limit:
        return True
    for suffix in ("", "-wal", "-journal"):
        try:
            if Path(f"{path}{suffix}").stat().st_size + 2**16 >= limit:
                return True
        except OSError:
            pass
    return False


_OS_WORDS = {
    errno.ENOSPC: "disk full",
    errno.EFBIG: "disk full (file size limit reached)",
    errno.EDQUOT: "disk full (quota exceeded)",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
}


def describe_failure(exc: BaseException, path: Path | None, needs: int = 0) -> str:
    """An SQLite or OS error as one line in plain words, naming the file when known."""
    if isinstance(exc, OSError):
        where = exc.filename or path
        words = _OS_WORDS.get(exc.errno or 0, exc.strerror or str(exc))
        return f"{where}: {words}" if where else words
    text = str(exc)
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name == "SQLITE_FULL" or "database or disk is full" in text:
        words = "disk full"
    elif name.startswith("SQLITE_IOERR") or "disk I/O error" in text:
        words = "disk full" if path is not None and _out_of_space(path, needs) else text
        words += f" ({text})" if words != text else ""
    elif name.startswith("SQLITE_READONLY") or "readonly database" in text:
        words = f"read-only database, cannot write ({text})"
    elif name.startswith("SQLITE_CORRUPT") or "malformed" in text:
        words = f"corrupted database ({text}); restore it from a backup"
    elif name == "SQLITE_NOTADB" or "file is not a database" in text:
        words = f"not a SQLite database ({text})"
    elif name.startswith("SQLITE_BUSY") or "database is locked" in text:
        words = f"database is locked by another process ({text})"
    elif name.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        words = f"cannot open ({text}; check that the folder exists and is writable)"
    else:
        words = text
    return f"{path}: {words}" if path else words


def room_problem(path: Path) -> str | None:
    """Why a file at `path` cannot take a run (its file system has less than
    MIN_FREE_BYTES free, or the process's file size limit is that close), or None."""
    import resource
    import shutil

    from memtrack.units import format_size

    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return None  # the folder's own problem is found when it is written
    if free < MIN_FREE_BYTES:
        return (
            f"disk full ({format_size(free)} free; a run needs at least "
            f"{format_size(MIN_FREE_BYTES)})"
        )
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        if limit - size < MIN_FREE_BYTES:
            return (
                f"disk full (the file size limit, {format_size(limit)}, leaves less than "
                f"{format_size(MIN_FREE_BYTES)} for a run)"
            )
    return None


def _affinity(declared: str) -> str:
    """SQLite's type affinity of a declared column type (its documented rules, in order)."""
    t = (declared or "").upper()
    if "INT" in t:
        return "integer"
    if any(w in t for w in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if not t or "BLOB" in t:
        return "blob"
    if any(w in t for w in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


def _column_affinity(f: dataclasses.Field[Any]) -> str:
    hint = str(f.type)
    if hint.startswith(("tuple", "dict", "list", "str")):
        return "text"  # lists and mappings are stored as JSON text
    return "real" if hint.startswith("float") else "integer"  # int, bool


def expected_schema() -> dict[str, dict[str, str | None]]:
    """Table -> column -> affinity: what memtrack writes and reads, from the records it
    stores (None: any type)."""

    def of(cls: type, prefix: str = "", without: tuple[str, ...] = ()) -> dict[str, str | None]:
        return {
            prefix + f.name: _column_affinity(f)
            for f in dataclasses.fields(cls)
            if f.name not in without
        }

    own: dict[str, str | None] = {c: "text" for c in RUN_OWN}
    own["schema_version"] = "integer"
    return {
        "environments": {"env_id": "text", **of(records.Environment)},
        "runs": {**own, **of(records.GitInfo, "git_"), **of(records.CIInfo, "ci_")},
        "measurements": {
            "id": "integer",
            "run_id": "text",
            **{x.column: "integer" for x in metrics.DERIVED},
            **of(Measurement, without=("devices", "ranks")),
        },
        "device_measurements": {"measurement_id": "integer", **of(records.DeviceMeasurement)},
        "rank_measurements": {"measurement_id": "integer", **of(records.RankMeasurement)},
        "verdicts": dict.fromkeys(VERDICT_COLUMNS),
    }


_PYTHON_TYPES: dict[str | None, tuple[type, ...]] = {
    "integer": (int,),
    "real": (float, int),
    "text": (str,),
}


def _wrong_type(row: Mapping[str, Any], types: Mapping[str, str | None]) -> str | None:
    """The first column of a row whose value is not of its column's type (`types`: column
    -> affinity; a hand-edited or damaged database), in a few words; None when all are."""
    for column, value in row.items():
        affinity = types.get(column)
        wanted = _PYTHON_TYPES.get(affinity)
        if value is not None and wanted and not isinstance(value, wanted):
            return f"{column} holds {type(value).__name__} {str(value)[:40]!r}, not {affinity}"
    return None


def schema_problem(conn: sqlite3.Connection) -> str | None:
    """What is missing or of the wrong type in a memtrack database whose migrations are all
    recorded as applied (a dropped table or column, a table made anew with other types), in
    a few words; None when it is whole."""
    for table, columns in expected_schema().items():
        found = {r[1]: r[2] for r in conn.execute(f'pragma table_info("{table}")')}
        if not found:
            return f"table {table!r} is missing"
        for column, affinity in columns.items():
            if column not in found:
                return f"column {table}.{column} is missing"
            if affinity is not None and _affinity(found[column]) != affinity:
                return (
                    f"column {table}.{column} is of type {found[column] or 'none'}, "
                    f"expected {affinity}"
                )
    return None


def newer_schema(conn: sqlite3.Connection, path: Path) -> StoreError | None:
    """The error for a database that a newer memtrack migrated (migrations this one does
    not know), or None."""
    try:
        rows = conn.execute(
            "select name from _sqlite_migrations where migration_set = ?", [migrations.SET_NAME]
        ).fetchall()
    except sqlite3.OperationalError:  # no migrations table: not memtrack's, said elsewhere
        return None
    unknown = {r[0] for r in rows} - set(migrations.names())
    if not unknown:
        return None
    return StoreError(
        f"{path}: schema has migrations this memtrack does not know "
        f"({', '.join(sorted(unknown))}); upgrade memtrack to read it"
    )


def damaged(path: Path, problem: str) -> StoreError:
    """The error of a database found damaged, in one line naming it."""
    return StoreError(
        f"{path}: damaged database ({problem}); restore it from a backup "
        "(`memtrack backup` makes one) or rebuild it with `memtrack ingest`"
    )


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _unwritable_folder(path: Path) -> bool:
    """Whether SQLite cannot make a WAL database's -shm file beside `path` (a read-only file
    system, or a folder this user may not write: a runner's cache, a mounted artifact)
    while no write-ahead log holds pages the file lacks: then the file alone is the whole
    database, and reading it as immutable is safe."""
    folder = path.parent
    try:
        unwritable = bool(os.statvfs(folder).f_flag & os.ST_RDONLY) or not os.access(
            folder, os.W_OK
        )
        wal = path.with_name(path.name + "-wal")
        return unwritable and (not wal.exists() or wal.stat().st_size == 0)
    except OSError:
        return False


def import_sqlite_utils() -> Any:
    """sqlite-utils, imported only where migrations are applied. It imports pandas and numpy
    when they are installed (half a second and 70 MiB) for DataFrame and array inserts that
    migrations never make, so they are hidden from that one import unless already loaded."""
    import sys

    if "sqlite_utils" in sys.modules:
        import sqlite_utils

        return sqlite_utils
    hidden = [name for name in ("pandas", "numpy") if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # its import fails: ImportError
    try:
        import sqlite_utils
    finally:
        for name in hidden:
            del sys.modules[name]
    return sqlite_utils


def create_file(path: Path) -> bool:
    """Make `path` an empty file (SQLite's new database), and its folder; True when this
    call made it, False when it was there. Raises StoreError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        words = describe_failure(exc, None)
        raise StoreError(f"{path}: cannot create its folder ({words})") from None
    if path.is_dir():
        raise StoreError(f"{path}: is a directory, not a database")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileExistsError:
        return False
    except OSError:
        return False  # SQLite's open names what is wrong
    return True


class Store:
    """A memtrack database. Open it with `Store.open(path)`; read-only for viewers."""

    def __init__(self, conn: sqlite3.Connection, path: Path, readonly: bool):
        self.conn = conn
        self.path = path
        self.readonly = readonly
        self._identity: os.stat_result | None = None
        self.repository: str | None = ALL_REPOSITORIES
        """The repository whose history is read (`of_repository`), with the runs that
        record none; None: those only; ALL_REPOSITORIES (as opened): every run. The judge
        sets it to the candidate's; commands to the working tree's
        (`memtrack.machine.provenance.repository_identity`)."""

    @property
    def scope(self) -> str:
        """`repository` as `of_repository`'s placeholder takes it."""
        return self.repository or ""

    def in_repository(self, runs: str = "r", mark: str = "?") -> str:
        """`of_repository` of this store's scope: bind `mark` to `self.scope`."""
        return of_repository(self.scope, runs, mark)

    @classmethod
    def open(
        cls, path: Path, *, readonly: bool = False, create: bool = True, older: bool = False
    ) -> Store:
        """Open a memtrack database. Raises StoreError.

        Writable opens migrate the schema, and create the file when `create` (run, ingest);
        with `create=False` a file that is not yet a memtrack database is refused, never
        written. A foreign SQLite file is refused before anything in it changes. Read-only
        with `older` (the dashboard), a schema older than this memtrack (migrations still
        pending) is read as it is, its tables and columns unchecked; a newer or a foreign
        one is refused all the same.
        """
        global last_path
        path = Path(path)
        last_path = path
        try:
            conn = cls._connect(path, readonly=readonly, create=create)
        except sqlite3.Error as exc:
            raise StoreError(describe_failure(exc, path)) from None
        store = cls(conn, path, readonly)
        try:
            if not readonly:  # the file as opened: a write checks it is still the one there
                store._identity = os.stat(path)
            store._prepare(create=create, older=older)
        except BaseException:
            conn.close()
            raise
        return store

    @staticmethod
    def _connect(path: Path, *, readonly: bool, create: bool) -> sqlite3.Connection:
        if readonly or not create:
            if not path.is_file():
                raise StoreError(f"{path}: no such database (record a run with `memtrack run`)")
        if readonly:
            # A quoted file: URI, so '#' or '?' in a folder name stays part of the path.
            uri = path.resolve().as_uri()

            def reading(query: str) -> sqlite3.Connection:
                return sqlite3.connect(
                    f"{uri}?{query}",
                    uri=True,
                    timeout=BUSY_TIMEOUT_S,
                    isolation_level=None,
                    check_same_thread=False,
                )

            conn = reading("mode=ro")
            try:
                conn.execute("select count(*) from sqlite_master").fetchone()
            except sqlite3.OperationalError:
                if not _unwritable_folder(path.resolve()):
                    raise
                conn.close()
                conn = reading("mode=ro&immutable=1")
        else:
            create_file(path)
            conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("select count(*) from sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(describe_failure(exc, path)) from None
        return conn

    def _prepare(self, *, create: bool, older: bool = False) -> None:
        if self.readonly and older and self._read_as_it_is():
            return
        if self.readonly:
            self.check_schema()
            self._check_whole()
            return
        if not create and not self.applied_migrations():
            empty = self.path.stat().st_size == 0
            raise StoreError(
                f"{self.path}: {'an empty file' if empty else 'empty database'}, "
                "not a memtrack database (record a run with `memtrack run`)"
            )
        self.check_schema(allow_pending=True)  # refuses a foreign file before any change
        try:
            if set(migrations.names()) - self.applied_migrations():
                self._migrate()
            self._use_wal()
        except sqlite3.Error as exc:
            raise StoreError(describe_failure(exc, self.path)) from None
        self._check_whole()

    def _read_as_it_is(self) -> bool:
        """Whether a schema of this memtrack's or an older one's is read as it is (True),
        rather than checked whole: refuses a newer or a foreign schema as `check_schema`
        does, and leaves an empty file to it (False)."""
        self.check_schema(allow_pending=True)
        return bool(self.applied_migrations())

    def _use_wal(self) -> None:
        """Switch to write-ahead logging (kept in the file). Processes switching a new
        database at once deadlock on the upgrade of their read locks, and SQLite answers one
        of them SQLITE_BUSY at once, without waiting: so it is tried again here, up to the
        busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            try:
                self.conn.execute("PRAGMA journal_mode=wal")
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorname", "").startswith("SQLITE_BUSY")
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _check_whole(self) -> None:
        """Refuse, on opening, a database with a table or column gone or made anew with
        other types: found before the first case, not after an hour of measuring."""
        try:
            problem = schema_problem(self.conn)
        except sqlite3.Error as exc:
            raise StoreError(describe_failure(exc, self.path)) from None
        if problem:
            raise damaged(self.path, problem)

    def _migrate(self) -> None:
        """Apply pending migrations under an exclusive lock: processes that open a new
        database at once wait for the first one, then find nothing left to do."""
        sqlite_utils = import_sqlite_utils()
        self.conn.execute("BEGIN EXCLUSIVE")
        try:
            self.check_schema(allow_pending=True)
            if set(migrations.names()) - self.applied_migrations():
                migrations.migrations().apply(sqlite_utils.Database(self.conn))
            self.conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        # SQLite may already have rolled back (disk full): a second ROLLBACK would fail and
        # hide the first error.
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def applied_migrations(self) -> set[str]:
        has_table = self.conn.execute(
            "select 1 from sqlite_master where type = 'table' and name = '_sqlite_migrations'"
        ).fetchone()
        if not has_table:
            return set()
        rows = self.conn.execute(
            "select name from _sqlite_migrations where migration_set = ?", [migrations.SET_NAME]
        )
        return {r[0] for r in rows}

    def table_names(self) -> set[str]:
        rows = self.conn.execute("select name from sqlite_master where type = 'table'")
        return {r[0] for r in rows}

    def kept_columns(self, table: str) -> set[str]:
        """The columns of `table` a write names even where every row holds NULL: those with
        a default other than NULL, or NOT NULL."""
        return {
            r[1]
            for r in self.conn.execute(f"pragma table_info({table})")
            if r[4] is not None or r[3]
        }

    BOOKKEEPING: frozenset[str] = frozenset()
    """Tables of the engine's own bookkeeping that do not make a database memtrack's or
    foreign (a server's migrations table)."""

    def check_schema(self, *, allow_pending: bool = False) -> None:
        """Refuse a database that a newer memtrack migrated, or one that is not memtrack's."""
        known = set(migrations.names())
        applied = self.applied_migrations()
        unknown = applied - known
        if unknown:
            raise StoreError(
                f"{self.path}: schema has migrations this memtrack does not know "
                f"({', '.join(sorted(unknown))}); upgrade memtrack to read it"
            )
        tables = self.table_names() - self.BOOKKEEPING
        if not applied and "runs" in tables:
            raise StoreError(f"{self.path}: has a 'runs' table but no memtrack schema record")
        if not applied and tables:
            raise StoreError(
                f"{self.path}: not a memtrack database (it holds other tables: "
                f"{', '.join(sorted(tables)[:5])})"
            )
        if not allow_pending and known - applied:
            if not applied:
                raise StoreError(f"{self.path}: empty database (record a run with `memtrack run`)")
            raise StoreError(
                f"{self.path}: schema is older than this memtrack "
                f"(pending: {', '.join(sorted(known - applied))}); open it once with `memtrack run`"
            )

    def check_writable(self) -> None:
        """Refuse now, not after an hour of measuring, a database that cannot be written."""
        try:
            # BEGIN alone succeeds on a file SQLite opened read-only; a write, rolled back,
            # does not.
            self.conn.execute("BEGIN IMMEDIATE")
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            self.conn.execute(f"PRAGMA user_version = {int(version)}")
            self.conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            self._rollback()
            raise StoreError(describe_failure(exc, self.path)) from None
        self._check_same_file()
        # The write above is rolled back, so it needs no room: a full disk passes it.
        problem = room_problem(self.path)
        if problem:
            raise StoreError(f"{self.path}: {problem}")

    def _check_same_file(self) -> None:
        """The file at our path must still be the one we opened: were it deleted or replaced
        (by a workload, say), a write would land in a file nobody can see."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        except OSError as exc:  # its folder made a file, unreadable, a symbolic link loop
            raise StoreError(
                f"{describe_failure(exc, self.path)}: the database cannot be reached since "
                "memtrack opened it; nothing written to it"
            ) from None
        if self._identity is not None and (now is None or not _same_file(now, self._identity)):
            raise StoreError(
                f"{self.path}: the database file was deleted or replaced while "
                "memtrack had it open; nothing written to it"
            )

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------

    def has_run(self, run_id: str) -> bool:
        return (
            self.conn.execute("select 1 from runs where run_id = ?", [run_id]).fetchone()
            is not None
        )

    def write_run(self, run: RunRecord) -> bool:
        """Insert a run and its measurements in one transaction. False if already there.
        Every value is checked first, as an ingested record's is: what `get_run` would read
        as damage is refused (StoreError), and nothing is written."""
        try:
            check_run(run)
        except RecordError as exc:
            raise StoreError(f"{self.path}: {exc}; nothing written") from None
        return self.write_runs([run])[0] == 1

    def write_runs(self, runs: Iterable[RunRecord | Prepared]) -> tuple[int, int]:
        """Insert runs in one transaction: all or none. Returns (added, already present).

        A run id already stored with the same content is skipped; with other content it is
        refused (StoreError). An exception raised by `runs` itself (a bad file further on)
        rolls everything back. A run may come as its rows, made in another process
        (`memtrack.store.ingest`).
        """
        added = present = 0
        with self._writing():
            batch = Batch(self.conn, self.kept_columns, self.id_allocator())
            written: set[str] = set()  # by this call: a run twice is compared as stored
            for chunk in chunks(runs, _LOOKUP):
                # before looking: one writer of a repository at a time (in one order)
                repositories = {
                    _repository(run) or ""
                    for run in chunk
                    if not (isinstance(run, Prepared) and run.rows is None)
                }
                for repository in sorted(repositories):
                    self.claim(repository)
                stored = self._stored([run.run_id for run in chunk])
                for run in chunk:
                    if run.run_id in batch.run_ids:  # its rows are not written yet
                        batch.flush()
                    if run.run_id in stored or run.run_id in written:
                        if not isinstance(run, Prepared):
                            self._same_as_stored(run)
                        elif not run.same_as_stored:  # else compared by its reader
                            self._same_as_stored(run.record())
                        present += 1
                        continue
                    batch.add(run)
                    written.add(run.run_id)
                    added += 1
                    if len(batch.run_ids) >= _BATCH:
                        batch.flush()
            batch.flush()
        return added, present

    def id_allocator(self) -> Callable[[int], list[int]] | None:
        """Where a write's measurement ids come from: None, after the largest stored (a file
        has one writer at a time); a server's sequence (ServerStore)."""
        return None

    def claim(self, repository: str | None) -> None:
        """Hold `repository`'s lock until the write transaction ends: a file has one writer
        at a time already (a server's store locks each repository: ServerStore.claim)."""

    @contextlib.contextmanager
    def _writing(self, refused: str = "opened read-only") -> Iterator[None]:
        """One write transaction: refused on a read-only store (in the words `refused`) or a
        file deleted or replaced since it was opened (checked again before the commit);
        BEGIN IMMEDIATE, and rolled back whole on any error, an SQLite error said in one
        line."""
        if self.readonly:
            raise StoreError(f"{self.path}: {refused}")
        self._check_same_file()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            yield
            self._check_same_file()
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise StoreError(describe_failure(exc, self.path)) from None
        except BaseException:
            self._rollback()
            raise

    def save_verdicts(self, checked: CheckedRun, verdicts: Sequence[Mapping[str, Any]]) -> int:
        """Record a check's verdicts (flat records, each naming its case) in one transaction,
        replacing those recorded before about the runs it judged (the candidate, and the
        runs joined to it): each verdict on the run holding its case's figures. Returns how
        many were written."""
        rows = [
            verdict_row(v, checked.case_runs.get(v["case_id"], checked.run_id), checked.checked_at)
            for v in verdicts
        ]
        with self._writing("opened read-only, cannot record verdicts"):
            row = self.conn.execute(
                "select git_repository from runs where run_id = ?", [checked.run_id]
            ).fetchone()
            self.claim(row[0] if row else None)
            for run_id in sorted({checked.run_id, *checked.case_runs.values()}):
                self.conn.execute("delete from verdicts where run_id = ?", [run_id])
            self.conn.executemany(_INSERT_VERDICT, rows)
        return len(rows)

    def _stored(self, run_ids: list[str]) -> set[str]:
        """Those of `run_ids` already stored, by one query."""
        marks = ", ".join("?" for _ in run_ids)
        rows = self.conn.execute(f"select run_id from runs where run_id in ({marks})", run_ids)
        return {r[0] for r in rows}

    def holds(self, run: RunRecord) -> bool:
        """Whether `run` is stored with this very content."""
        # Compared as read, unchecked: a stored run that differs is refused either way.
        return self.has_run(run.run_id) and self._read_run(run.run_id, check=False) == run

    def _same_as_stored(self, run: RunRecord) -> None:
        if not self.holds(run):
            raise StoreError(
                f"{self.path}: run id {run.run_id!r} is already stored with "
                "different content; nothing written"
            )

    # -- reading ---------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Reads that belong together (a whole check), on one snapshot where the engine has
        a cost to do so: nothing here (SQLite answers each statement from the file, and a
        lazy cursor is lazy already); a server's read-only transaction (ServerStore)."""
        yield

    def lazy_rows(self, sql: str, params: Any) -> Iterator[Any]:
        """The rows of a query its caller stops reading early (a baseline walk), fetched as
        they are read: SQLite's cursor is lazy itself; a server's, inside `reading`, is a
        server-side cursor."""
        return iter(self.conn.execute(sql, params))

    # -- whole tables (`memtrack db copy`) -------------------------------------------------

    def column_names(self, table: str) -> list[str]:
        """The columns of `table`, in their order."""
        return [r[1] for r in self.conn.execute(f'pragma table_info("{table}")')]

    def count_rows(self, table: str) -> int:
        return int(self.conn.execute(f'select count(*) from "{table}"').fetchone()[0])

    def table_rows(
        self, table: str, columns: list[str], key: str, batch: int = 5000
    ) -> Iterator[tuple[Any, ...]]:
        """Every row of `table` (its `columns`), in `key` order, read `batch` at a time."""
        names = ", ".join(f'"{c}"' for c in columns)
        cur = self.conn.execute(f'select {names} from "{table}" order by "{key}"')
        while rows := cur.fetchmany(batch):
            yield from (tuple(r) for r in rows)

    def insert_tables(
        self, tables: Iterable[tuple[str, list[str], Iterable[tuple[Any, ...]]]]
    ) -> None:
        """Rows into tables, as they are (ids included), all in one transaction."""
        with self._writing():
            for table, columns, rows in tables:
                names = ", ".join(f'"{c}"' for c in columns)
                sql = f'insert into "{table}" ({names}) values ({", ".join("?" for _ in columns)})'
                for part in chunks(rows, 5000):
                    self.conn.executemany(sql, part)

    # -- reading ---------------------------------------------------------------------

    def find_run(self, text: str) -> RunRecord:
        """A run by id or unique id prefix, else the newest run of the branch `text` names,
        else the newest run of the commit `text` names (a SHA prefix; a measured run before
        an estimate run)."""
        return self.get_run(self.find_runs(text, limit=1)[0])

    def find_runs(self, text: str, *, limit: int = 20) -> list[str]:
        """The runs `text` names, as `find_run` chooses among them: a run by id or unique
        id prefix (that one), else a branch's runs newest first, else a commit's (its
        measured runs first). StoreError where it names none."""
        named = (
            text
            and self.conn.execute(
                "select 1 from runs where substr(run_id, 1, ?) = ? limit 1", [len(text), text]
            ).fetchone()
        )
        if not named:
            branch = self.conn.execute(
                f"select run_id from runs where git_branch = ? and {self.in_repository('runs')} "
                "order by started_at desc limit ?",
                [text, self.scope, limit],
            ).fetchall()
            if branch:  # a branch: its runs, newest first
                return [r[0] for r in branch]
        if named or not re.fullmatch(r"[0-9a-fA-F]{4,40}", text):
            return [self._run_id(text)]  # a run (or no run) by its id: _run_id says which
        commits = {
            r[0]
            for r in self.conn.execute(
                "select distinct git_commit from runs where substr(git_commit, 1, ?) = ? "
                f"and {self.in_repository('runs')} limit 2",
                [len(text), text.lower(), self.scope],
            )
        }
        if len(commits) > 1:
            raise StoreError(f"{self.path}: commit prefix {text!r} is ambiguous")
        ids = self.run_ids(commit=text, limit=limit, measured=True)
        if len(ids) < limit:  # then its estimate runs
            ids += [r for r in self.run_ids(commit=text, limit=limit) if r not in ids]
        if not ids:
            raise StoreError(f"{self.path}: no run or commit {text!r}")
        return ids[:limit]

    def get_run(self, run_id: str) -> RunRecord:
        """A whole run by id or unique id prefix (matched literally)."""
        return self._read_run(self._run_id(run_id))

    def _run_id(self, run_id: str) -> str:
        """The id of the run `run_id` names, an id or a unique id prefix; StoreError else."""
        if self.has_run(run_id):
            return run_id
        rows = self.conn.execute(
            "select run_id from runs where substr(run_id, 1, ?) = ? limit 2",
            [len(run_id), run_id],
        ).fetchall()
        if not rows or not run_id:
            raise StoreError(f"{self.path}: no run {run_id!r}")
        if len(rows) > 1:
            raise StoreError(f"{self.path}: run id prefix {run_id!r} is ambiguous")
        return str(rows[0][0])

    def _read_run(self, run_id: str, *, check: bool = True) -> RunRecord:
        """A stored run, every value checked (with `check`) as a record from elsewhere is:
        a value of the wrong type (a damaged or hand-edited database) is a StoreError naming
        the database, the run and the field, not a failure somewhere later."""
        try:
            run = self._build_run(run_id)
            return run_from_dict(to_dict(run), where=f"run {run_id}") if check else run
        except RecordError as exc:
            raise damaged(self.path, str(exc)) from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise damaged(
                self.path, f"run {run_id}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
            ) from None

    def _build_run(self, run_id: str) -> RunRecord:
        row = dict(self.conn.execute("select * from runs where run_id = ?", [run_id]).fetchone())
        env = self.get_environment(row["env_id"])
        if env is None:  # a foreign key of the run: only a damaged database lacks it
            raise KeyError(f"environment {row['env_id']!r} of the run is missing")
        git = _unprefixed(records.GitInfo, row, "git_", _GIT_JSON)
        git = dataclasses.replace(
            git, dirty=None if git.dirty is None else bool(git.dirty), shallow=bool(git.shallow)
        )
        measurements = tuple(self._measurements(row["run_id"]))
        return RunRecord(
            run_id=row["run_id"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            git=git,
            ci=_unprefixed(records.CIInfo, row, "ci_", set()),
            environment=env,
            suite_hash=row["suite_hash"],
            config_path=row["config_path"],
            measurements=measurements,
            shard=row["shard"],
            selection=_selection(row),
            schema_version=row["schema_version"],
        )

    def sites(self, run_id: str, case_id: str) -> tuple[records.Site, ...]:
        """Where a run's case had its peak's memory allocated (none recorded: empty)."""
        row = self.conn.execute(
            "select sites from measurements where run_id = ? and case_id = ?", [run_id, case_id]
        ).fetchone()
        if row is None or not row["sites"]:
            return ()
        return tuple(records.site_of(s) for s in json.loads(row["sites"]))

    def get_environment(self, env_id: str | None) -> records.Environment | None:
        row = self.conn.execute("select * from environments where env_id = ?", [env_id]).fetchone()
        if row is None:
            return None
        env = _unprefixed(records.Environment, dict(row), "", _ENV_JSON)
        available = None if env.cuda_available is None else bool(env.cuda_available)
        return dataclasses.replace(  # rows recorded before a column existed hold NULL
            env,
            gpus=tuple(records.GpuInfo(**g) for g in env.gpus),
            cuda_available=available,
            visible_uuids=env.visible_uuids or (),
            notes=env.notes or (),
        )

    def _measurements(self, run_id: str) -> Iterator[Measurement]:
        rows = self.conn.execute(
            "select * from measurements where run_id = ? order by id", [run_id]
        ).fetchall()
        # each per-measurement table read once for the whole run: a query per measurement
        # was a round trip each on a server (200 of a 50-case check's 420)
        devices = self._by_measurement(
            "device_measurements", run_id, 'order by d.measurement_id, d."index"'
        )
        all_ranks = self._by_measurement(
            "rank_measurements", run_id, "order by d.measurement_id, d.rank"
        )
        for r in rows:
            row = dict(r)
            devs, ranks = devices.get(row["id"], []), all_ranks.get(row["id"], [])
            row["devices"] = row["ranks"] = None
            m = _unprefixed(Measurement, row, "", _MEASUREMENT_JSON)
            yield dataclasses.replace(
                m,
                devices=tuple(
                    _unprefixed(records.DeviceMeasurement, dict(d), "", set()) for d in devs
                ),
                ranks=tuple(
                    _unprefixed(records.RankMeasurement, dict(r), "", set()) for r in ranks
                ),
                sites=tuple(records.site_of(s) for s in m.sites or ()),
                **{  # NULL in rows from before the column's migration
                    name: {} if str(f.type).startswith("dict") else ()
                    for name, f in _MEASUREMENT_FIELDS.items()
                    if getattr(m, name) is None and name != "sites"
                },
            )

    def _by_measurement(self, table: str, run_id: str, order: str) -> dict[int, list[Any]]:
        """The rows of a per-measurement `table` (devices, ranks) of a run's measurements,
        by measurement id, in `order`."""
        found: dict[int, list[Any]] = {}
        for d in self.conn.execute(
            f"select d.* from {table} d where d.measurement_id in "
            f"(select id from measurements where run_id = ?) {order}",
            [run_id],
        ):
            found.setdefault(d["measurement_id"], []).append(d)
        return found

    def run_ids(
        self, *, commit: str | None = None, limit: int = 50, measured: bool = False
    ) -> list[str]:
        """Run ids, newest first; only those of `commit` (a SHA prefix) when given; with
        `measured`, only runs that measured something (not estimate runs)."""
        if commit:
            only = MEASURED_RUN if measured else ""
            rows = self.conn.execute(
                f"select run_id from runs where substr(git_commit, 1, ?) = ? {only} "
                f"and {self.in_repository('runs')} order by started_at desc limit ?",
                [len(commit), commit.lower(), self.scope, limit],
            )
        else:
            rows = self.conn.execute(
                f"select run_id from runs where {self.in_repository('runs')} "
                "order by started_at desc limit ?",
                [self.scope, limit],
            )
        return [r[0] for r in rows]

    def history(
        self, pattern: str, *, limit: int = 50, branch: str | None = None
    ) -> list[dict[str, Any]]:
        """Measurements whose case id is `pattern` or starts with `pattern[`, newest first."""
        sql = (
            "select m.*, r.started_at, r.git_commit, r.git_branch, r.git_subject, r.git_dirty, "
            "r.fingerprint from measurements m join runs r on r.run_id = m.run_id "
            "where (m.case_id = :p or substr(m.case_id, 1, :n1) = :p || '[') "
            "and m.kind = 'measured' "  # an estimate is no point of a series
            f"and {self.in_repository('r', ':repo')} "
        )
        if branch:
            sql += "and r.git_branch = :b "
        sql += "order by r.started_at desc, m.id desc limit :n"
        params = {
            "p": pattern,
            "n1": len(pattern) + 1,
            "b": branch,
            "n": limit,
            "repo": self.scope,
        }
        rows = [dict(r) for r in self.conn.execute(sql, params).fetchall()]
        schema = expected_schema()
        types = {**schema["runs"], **schema["measurements"]}
        for row in rows:  # shown as they are: a value of the wrong type is named, as damage
            problem = _wrong_type(row, types)
            if problem:
                raise damaged(self.path, f"run {row['run_id']}: {problem}")
        return rows

    def latest_estimates(
        self, case_ids: Iterable[str], commit: str | None = None, *, exact: bool = False
    ) -> dict[str, dict[str, Any]]:
        """Per case id, its estimate (`memtrack estimate`) of `commit` if there is one, else
        its newest (with `exact`, only those of `commit`): run_id, git_commit, started_at,
        peak_allocated_bytes, and the kernel scratch included in it and the measured run it
        came from (scratch_bytes, scratch_run_id: None where the estimate excludes scratch).
        Cases never estimated (successfully) are left out."""
        conn, case_ids = self.conn, list(case_ids)
        ok = "kind = 'estimate' and status = 'ok' and peak_allocated_bytes is not null"
        # of one commit's runs (`exact`), whichever they estimated; else the cases that
        # were ever estimated (one query per CHUNK cases)
        wanted = set(case_ids) if exact else set()
        for chunk in [] if exact else chunks(case_ids, CHUNK):
            wanted |= {
                r[0]
                for r in conn.execute(
                    f"select distinct case_id from measurements where {ok} "
                    f"and case_id in ({', '.join('?' for _ in chunk)})",
                    chunk,
                )
            }
        out: dict[str, dict[str, Any]] = {}
        if not wanted:
            return out
        # Estimate runs in the order of preference, walked until every case has its estimate:
        # a run estimates a whole suite, so the first one or two answer every case, however
        # many estimates are stored (a lookup per case would join all of each case's).
        if exact:  # the commit's runs (an index lookup), each asked whether it estimated
            runs = conn.execute(
                "select run_id, git_commit, started_at from runs where git_commit = ? "
                "and exists (select 1 from measurements m where m.run_id = runs.run_id "
                f"and m.kind = 'estimate') and {self.in_repository('runs')} "
                "order by started_at desc",
                [commit, self.scope],
            )
        else:
            runs = conn.execute(
                "select run_id, git_commit, started_at from runs where run_id in "
                "(select run_id from measurements where kind = 'estimate') "
                f"and {self.in_repository('runs')} "
                "order by case when git_commit = ? then 1 else 0 end desc, started_at desc",
                [self.scope, commit],
            )

        def rank(run: sqlite3.Row) -> tuple[bool, str]:  # that order, to group its ties
            return commit is not None and run[1] == commit, run[2]

        for _, tied in itertools.groupby(runs, key=rank):
            found: dict[str, tuple[int, dict[str, Any]]] = {}
            for run_id, git_commit, started_at in tied:
                for case, peak, mid, scratch, scratch_run in conn.execute(
                    "select case_id, peak_allocated_bytes, id, scratch_bytes, scratch_run_id "
                    f"from measurements where run_id = ? and {ok}",
                    [run_id],
                ):
                    if scratch is not None and not (
                        type(scratch) is int and type(peak) is int and 0 <= scratch <= peak
                    ):
                        raise damaged(self.path, f"run {run_id}: {case}: scratch_bytes {scratch!r}")
                    # of runs started at one time, the one written last
                    if case in wanted and case not in out and mid > found.get(case, (0,))[0]:
                        found[case] = (
                            mid,
                            {
                                "run_id": run_id,
                                "git_commit": git_commit,
                                "started_at": started_at,
                                "peak_allocated_bytes": peak,
                                "scratch_bytes": scratch,
                                "scratch_run_id": scratch_run,
                            },
                        )
            out.update((case, row) for case, (_, row) in found.items())
            if len(out) == len(wanted):
                break
        return {case: out[case] for case in case_ids if case in out}

    def latest_measured(
        self, case_id: str, device: str, gpu: str | None = None
    ) -> dict[str, Any] | None:
        """The newest measured figure (status ok) of `case_id` on `device` ('cpu', or 'cuda'
        on a GPU named `gpu`, as its devices or else its run's environment name it): run_id,
        git_commit, git_dirty, started_at, peak_allocated_bytes, unattributed_bytes. None
        where there is none."""
        rows = self.conn.execute(
            "select m.id, m.run_id, r.git_commit, r.git_dirty, r.started_at, "
            "m.peak_allocated_bytes, m.unattributed_bytes, e.gpus from measurements m "
            "join runs r on r.run_id = m.run_id left join environments e on e.env_id = r.env_id "
            "where m.case_id = ? and m.kind = 'measured' and m.status = 'ok' and m.device = ? "
            f"and m.peak_allocated_bytes is not null and {self.in_repository()} "
            "order by r.started_at desc, m.id desc",
            [case_id, device, self.scope],
        )
        for row in rows:
            if device == "cuda" and gpu not in self._gpu_names(row["id"], row["gpus"]):
                continue
            out = {k: row[k] for k in row.keys() if k not in ("id", "gpus")}
            for key in ("peak_allocated_bytes", "unattributed_bytes"):
                value = out[key]
                if value is not None and (type(value) is not int or value < 0):
                    raise damaged(self.path, f"run {out['run_id']}: {key} {value!r}")
            return out
        return None

    def _gpu_names(self, measurement_id: int, gpus: Any) -> set[str]:
        """The names of the GPUs a measurement ran on: its devices', else its environment's."""
        names = {
            r[0]
            for r in self.conn.execute(
                "select name from device_measurements where measurement_id = ?", [measurement_id]
            )
            if isinstance(r[0], str)
        }
        if names:
            return names
        try:
            listed = json.loads(gpus) if isinstance(gpus, str) else []
        except ValueError:
            return set()
        if not isinstance(listed, list):
            return set()
        return {g["name"] for g in listed if isinstance(g, dict) and isinstance(g.get("name"), str)}

    def case_params(self, case_ids: Iterable[str]) -> dict[str, tuple[str, dict[str, Any]]]:
        """Each measured case's workload and params, as its newest row holds them; a case
        never measured, or whose params do not read as an object, is left out."""
        out: dict[str, tuple[str, dict[str, Any]]] = {}
        for case in case_ids:
            row = self.conn.execute(
                "select m.workload, m.params from measurements m join runs r "
                "on r.run_id = m.run_id where m.case_id = ? and m.kind = 'measured' "
                f"and {self.in_repository()} order by m.id desc limit 1",
                [case, self.scope],
            ).fetchone()
            try:
                params = json.loads(row["params"]) if row else None
            except (TypeError, ValueError):
                continue
            if isinstance(params, dict):
                out[case] = (str(row["workload"]), params)
        return out

    def durations(
        self, fingerprint: str, case_ids: Iterable[str], n: int
    ) -> dict[str, list[float]]:
        """The whole-case wall times (`duration_s`) of each case's `n` newest ok measured runs
        on the environment `fingerprint`, newest first; a case with none is left out."""
        out: dict[str, list[float]] = {}
        for part in chunks(sorted(set(case_ids)), _LOOKUP):
            rows = self.conn.execute(
                "select m.case_id, m.duration_s from measurements m "
                "join runs r on r.run_id = m.run_id where r.fingerprint = ? "
                "and m.kind = 'measured' and m.status = 'ok' and m.duration_s is not null "
                f"and m.case_id in ({', '.join('?' * len(part))}) and {self.in_repository()} "
                "order by r.started_at desc, m.id desc",
                [fingerprint, *part, self.scope],
            )
            for case, value in rows:
                kept = out.setdefault(case, [])
                if len(kept) < n and isinstance(value, (int, float)):
                    kept.append(float(value))
        return out

    def case_ids(self) -> list[str]:
        """The case ids recorded in this store's scope (`repository`): another repository's
        names are never suggested, nor matched."""
        sql = (
            "select distinct m.case_id from measurements m join runs r on r.run_id = m.run_id "
            f"where {self.in_repository()} order by 1"
        )
        return [r[0] for r in self.conn.execute(sql, [self.scope])]

    def nearest_cases(self, name: str, n: int = 3) -> list[str]:
        """Recorded case ids and workload names that read most like `name`."""
        import difflib

        names: set[str] = set()
        for case in self.case_ids():
            names.update((case, case.partition("[")[0]))
        return difflib.get_close_matches(name, sorted(names), n=n, cutoff=0.5)
