"""The history on a PostgreSQL server: the same schema, the same SQL, the same verdicts as
the embedded SQLite file, for teams whose runners and repositories share one database.

Three pieces, each small:

- `Connection` gives a psycopg 3 connection the few methods of `sqlite3.Connection` the
  store calls (`execute`, `executemany`, `in_transaction`), rows read by name or index as
  `sqlite3.Row`s are, and each statement translated once (cached) from the store's SQLite
  dialect: `?` and `:name` placeholders, `INSERT OR IGNORE`, `IS ?`, `CROSS JOIN ... ON`.
  The store's SQL is written once, in `memtrack.store`; nothing else holds SQL.
- `schema_statements` derives the server's tables and indexes from the migrations
  themselves: they are applied to an in-memory SQLite database and its tables written as
  PostgreSQL DDL (text in the "C" collation, so ordering and prefix ranges compare bytes as
  SQLite does). One set of migrations for both engines; a step not yet applied on a server
  adds what it added in SQLite (tables, columns, indexes).
- `ServerStore` is `Store` with the file's concerns replaced by the server's: every write
  transaction takes one advisory lock first, so concurrent runners write one after another
  as they do into the file (ids never collide, a retried ingest finds its runs and adds
  nothing); migrations take it too.

psycopg is imported only when a server URL is opened.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from memtrack.errors import ConfigError, StoreError, TransientStoreError
from memtrack.store import migrations
from memtrack.store.database import BUSY_TIMEOUT_S, Store, damaged, expected_schema
from memtrack.store.url import ServerUrl

T = TypeVar("T")

LOCK_KEY = 0x6D656D74
"""'memt': the advisory lock of the whole database. Every writer holds it shared; a migration
holds it alone."""
REPOSITORY_LOCKS = 0x6D656D72
"""'memr': the advisory locks of repositories (with the repository's hash): a writer of a
repository's runs or verdicts holds its repository's, so that writers of one repository go
one after another, as into a file, and another repository's never wait for them."""
MEASUREMENT_IDS = "pg_get_serial_sequence('measurements', 'id')"
"""The sequence a server's measurement ids come from: writers of different repositories
write at once, so no id may be read off the largest stored."""
MIGRATIONS_TABLE = "memtrack_migrations"
CONNECT_TIMEOUT_S = 10
_TOKENS = re.compile(
    r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|::|\?|:[A-Za-z_]\w*|%|[^'\"?:%-]+|.", re.S
)


# -- the dialect ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """An SQL statement of the store, as PostgreSQL (psycopg's placeholders) reads it. String
    literals, quoted names and comments are kept as they are (a '%' in them doubled, as
    psycopg reads every '%'); the rewrites apply to the rest only."""
    kept: list[str] = []
    out = []
    for token in _TOKENS.findall(sql):
        if token.startswith(("'", '"', "--")):
            kept.append(token.replace("%", "%%"))
            out.append(f"\x00{len(kept) - 1}\x00")
        elif token == "?":
            out.append("%s")
        elif token.startswith(":") and len(token) > 1 and token != "::":
            out.append(f"%({token[1:]})s")
        elif token == "%":
            out.append("%%")
        else:
            out.append(token)
    text = "".join(out)
    text = re.sub(r"\[(\w+)\]", r'"\1"', text)  # sqlite-utils' quoting
    if re.match(r"\s*insert\s+or\s+ignore\s+", text, re.I):
        text = re.sub(r"^\s*insert\s+or\s+ignore\s+", "insert ", text, flags=re.I)
        text = re.sub(r"\s*;?\s*\Z", " on conflict do nothing", text, count=1)
    text = re.sub(r"\bis\s+(?=%)", "is not distinct from ", text, flags=re.I)
    # SQLite's planner hint (a unary + keeps an index out of a condition) is no operator of
    # PostgreSQL's on text
    text = re.sub(r"(?<=[\s(])\+(?=\w+\.\w+)", "", text)
    text = re.sub(
        r"\bcross\s+join\s+(\w+(?:\s+(?:as\s+)?\w+)?)\s+on\b", r"join \1 on", text, flags=re.I
    )
    return re.sub("\x00(\\d+)\x00", lambda m: kept[int(m.group(1))], text)


class Row:
    """A row read by column name or by index, as `sqlite3.Row` (the first of two columns of
    one name answers that name)."""

    __slots__ = ("_names", "_values")

    def __init__(self, values: Sequence[Any], names: dict[str, int]):
        self._values = values
        self._names = names

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self._values[self._names[key]]
        return self._values[key]

    def keys(self) -> list[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Row) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._names, self._values, strict=False))!r})"


def _row_factory(cursor: Any) -> Any:
    names: dict[str, int] = {}
    for i, column in enumerate(cursor.description or ()):
        names.setdefault(column.name, i)
    return lambda values: Row(values, names)


class Connection:
    """A psycopg connection (autocommit; the store says BEGIN and COMMIT itself) with the
    calls of `sqlite3.Connection` the store makes."""

    def __init__(self, raw: Any):
        self.raw = raw
        self._catalog: dict[str, list[tuple[str, str, bool]]] | None = None

    def catalog(self) -> dict[str, list[tuple[str, str, bool]]]:
        """Each table of the schema -> its columns in order: (name, type, whether a write
        names it even where NULL: a default, NOT NULL or an identity). One query of
        pg_catalog, kept until `forget_catalog` (information_schema's views take ~5 ms a
        table)."""
        if self._catalog is None:
            rows = self.raw.execute(
                "select c.relname, a.attname, format_type(a.atttypid, a.atttypmod), "
                "a.attnotnull or a.atthasdef or a.attidentity <> '' "
                "from pg_attribute a join pg_class c on c.oid = a.attrelid "
                "join pg_namespace n on n.oid = c.relnamespace "
                "where n.nspname = current_schema() and c.relkind in ('r', 'p') "
                "and a.attnum > 0 and not a.attisdropped order by c.relname, a.attnum"
            ).fetchall()
            catalog: dict[str, list[tuple[str, str, bool]]] = {}
            for table, column, kind, kept in rows:
                catalog.setdefault(table, []).append((column, kind, bool(kept)))
            self._catalog = catalog
        return self._catalog

    def forget_catalog(self) -> None:
        self._catalog = None

    def execute(self, sql: str, params: Any = ()) -> Any:
        verb = sql.strip().upper()
        if verb in ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE"):
            # the database's lock (alone for a migration), waited for as long as SQLite waits
            # out another writer; each repository's is taken as its rows are (`claim`)
            cur = self.raw.execute("begin")
            cur.execute(f"set local lock_timeout = '{int(BUSY_TIMEOUT_S * 1000)}ms'")
            shared = "" if verb == "BEGIN EXCLUSIVE" else "_shared"
            cur.execute(f"select pg_advisory_xact_lock{shared}(%s)", [LOCK_KEY])
            return cur
        cur = self.raw.cursor(row_factory=_row_factory)
        cur.execute(translate(sql), params if params is not None else ())
        return cur

    def executemany(self, sql: str, seq: Any) -> Any:
        cur = self.raw.cursor()
        cur.executemany(translate(sql), list(seq))
        return cur

    @property
    def in_transaction(self) -> bool:
        from psycopg import pq

        return bool(self.raw.pgconn.transaction_status != pq.TransactionStatus.IDLE)

    def close(self) -> None:
        self.raw.close()

    def alive(self) -> bool:
        """Whether the server still answers on this connection (one round trip): a restart,
        a failover or an idle-session reaper ends a connection held open."""
        import psycopg

        if self.raw.closed or self.raw.broken:
            return False
        try:
            self.raw.execute("select 1")
        except psycopg.Error:
            return False
        return True


APPLICATION = "memtrack"
"""How memtrack's connections name themselves to the server (pg_stat_activity)."""


def connect(
    url: ServerUrl, *, readonly: bool = False, application: str = APPLICATION, retry: bool = True
) -> Connection:
    """A connection to the server `url` names. StoreError in one line, the password never
    in it, where the driver is missing or the server is down or refuses."""
    try:
        import psycopg
        from psycopg.types.numeric import IntDumper
    except ImportError:
        raise StoreError(
            f"{url}: a PostgreSQL database needs psycopg (pip install 'memtrack[postgres]')"
        ) from None

    class BoolAsInt(IntDumper):  # flags are integer columns on both engines
        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    def attempt() -> Any:
        try:
            return psycopg.connect(
                url.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name=application,
            )
        except psycopg.Error as exc:
            raise failure(exc, url) from None

    raw = retrying(attempt, url) if retry else attempt()
    raw.adapters.register_dumper(bool, BoolAsInt)
    if readonly:
        raw.execute("set default_transaction_read_only = on")
    return Connection(raw)


TRANSIENT_STATES = frozenset(
    {
        "53300",  # too many connections (the server's limit, or the role's)
        "57P01",  # terminated by the administrator (a fast shutdown or restart)
        "57P02",  # crash shutdown
        "57P03",  # cannot connect now: the server is starting or shutting down
        "40001",  # serialization failure
        "40P01",  # deadlock detected
    }
)
"""SQLSTATEs after which the same statement, tried again later, may succeed; and every
class 08 state (the connection failed or was lost)."""
RETRY_S = 120.0
"""How long memtrack waits out a server that is restarting, failing over or full, in all,
before it gives up (a run is then kept in the spool: memtrack.store.spool). The
environment's MEMTRACK_SERVER_RETRY_S sets another."""
FIRST_WAIT_S, LONGEST_WAIT_S = 1.0, 15.0


NO_ANSWER = (
    "Connection refused",
    "No such file or directory",  # a unix socket not there: the server is not up (yet)
    "server closed the connection unexpectedly",
    "timeout expired",
    "could not receive data",
    "could not send data",
    "connection not open",
    "the connection is lost",
    "consuming input failed",
)
"""What libpq says where no server answered, or the connection was lost: a restart."""
BUSY_SERVER = (
    "too many connections",
    "too many clients",
    "remaining connection slots are reserved",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "terminating connection",
)
"""What a server that refuses a new connection for now says (libpq gives such a refusal no
SQLSTATE: its FATAL message is all there is)."""


def transient(exc: BaseException) -> bool:
    """Whether a driver's error is one that waiting may cure: the server said so
    (TRANSIENT_STATES, or a refusal of a connection for now: BUSY_SERVER), or no server
    answered or the connection was lost (NO_ANSWER: it may be restarting). A refusal for
    good (no such database, a wrong or missing password, a host name that does not
    resolve) is not."""
    import psycopg

    state = getattr(exc, "sqlstate", None)
    if state is not None:
        return state in TRANSIENT_STATES or state.startswith("08")
    if not isinstance(exc, psycopg.OperationalError):
        return False
    text = str(exc)
    return any(words in text for words in (*BUSY_SERVER, *NO_ANSWER))


def failure(exc: BaseException, url: ServerUrl | None) -> StoreError:
    """A driver's error as a StoreError in one line, a TransientStoreError where waiting may
    cure it."""
    kind = TransientStoreError if transient(exc) else StoreError
    return kind(describe(exc, url))


def retry_window() -> float:
    """RETRY_S, or the seconds MEMTRACK_SERVER_RETRY_S gives (0: no retry)."""
    text = os.environ.get("MEMTRACK_SERVER_RETRY_S")
    if text is None:
        return RETRY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise ConfigError(f"MEMTRACK_SERVER_RETRY_S: {text!r} is not a number of seconds")
    return value


def retrying(attempt: Callable[[], T], url: ServerUrl) -> T:
    """`attempt()`, tried again while it raises TransientStoreError, waits doubling from 1 s
    to 15 s, until `retry_window()` seconds of waiting are spent; each wait said in one line
    on stderr. The last error is raised."""
    window, waited, wait = retry_window(), 0.0, FIRST_WAIT_S
    while True:
        try:
            return attempt()
        except TransientStoreError as exc:
            if waited + wait > window:
                raise
            reason = str(exc).removeprefix(f"{url}: ")
            print(
                f"memtrack: {url}: {reason}; trying again in {wait:g} s "
                f"({waited + wait:g} of {window:g} s)",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(wait)
            waited += wait
            wait = min(LONGEST_WAIT_S, wait * 2)


def describe(exc: BaseException, url: ServerUrl | None) -> str:
    """A driver's error as one line naming the database, the password never in it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines[:2]) or type(exc).__name__
    missing = re.search(r'database "([^"]+)" does not exist', text)
    if missing:  # memtrack makes its tables on first use, never the database itself
        text += f" (make it first: createdb {shlex.quote(missing.group(1))})"
    if url is not None:
        text = url.redact(text)
    return f"{url}: {text}" if url is not None else text


# -- the schema ----------------------------------------------------------------------------


def _pg_type(declared: str, *, primary: bool) -> str:
    t = (declared or "").upper()
    if "INT" in t:
        return "bigint generated by default as identity" if primary else "bigint"
    if any(w in t for w in ("REAL", "FLOA", "DOUB")):
        return "double precision"
    return 'text collate "C"'


def _sqlite_schema(steps: int | None = None) -> dict[str, Any]:
    """Tables (column -> (type, not null, default, primary key)) and index statements of a
    database migrated by the first `steps` migrations (all: None), in memory."""
    from memtrack.store.database import import_sqlite_utils

    sqlite_utils = import_sqlite_utils()
    conn = sqlite3.connect(":memory:")
    chosen = migrations.STEPS if steps is None else migrations.STEPS[:steps]
    db = sqlite_utils.Database(conn)
    for step in chosen:
        step(db)
    tables: dict[str, dict[str, tuple[str, bool, Any, bool]]] = {}
    for (name,) in conn.execute(
        "select name from sqlite_master where type = 'table' and name not like 'sqlite%' "
        "order by rowid"
    ):
        tables[name] = {
            r[1]: (r[2], bool(r[3]), r[4], bool(r[5]))
            for r in conn.execute(f'pragma table_info("{name}")')
        }
    indexes = {
        name: sql
        for name, sql in conn.execute(
            "select name, sql from sqlite_master where type = 'index' and sql is not null "
            "order by rowid"
        )
    }
    conn.close()
    return {"tables": tables, "indexes": indexes}


def _column_ddl(name: str, spec: tuple[str, bool, Any, bool]) -> str:
    declared, notnull, default, primary = spec
    ddl = f'"{name}" {_pg_type(declared, primary=primary)}'
    if primary:
        ddl += " primary key"
    if notnull and not primary:
        ddl += " not null"
    if default is not None:
        ddl += f" default {default}"
    return ddl


def schema_statements(applied: int = 0) -> list[str]:
    """The DDL that brings a server database migrated by the first `applied` steps to all of
    them: tables, then columns, then indexes added by the steps not yet applied."""
    new = _sqlite_schema()
    old = _sqlite_schema(applied) if applied else {"tables": {}, "indexes": {}}
    out = []
    for table, columns in new["tables"].items():
        if table not in old["tables"]:
            body = ", ".join(_column_ddl(c, spec) for c, spec in columns.items())
            out.append(f'create table "{table}" ({body})')
            continue
        for column, spec in columns.items():
            if column not in old["tables"][table]:
                out.append(f'alter table "{table}" add column {_column_ddl(column, spec)}')
    for name, sql in new["indexes"].items():
        if name not in old["indexes"]:
            out.append(re.sub(r"\[(\w+)\]", r'"\1"', sql))
    return out


# -- the store -----------------------------------------------------------------------------

_WRITTEN = (
    "environments",
    "runs",
    "measurements",
    "device_measurements",
    "rank_measurements",
    "verdicts",
)
"""The tables a run or a check writes."""


class ServerStore(Store):
    """A memtrack database on a PostgreSQL server. Open it with `open_store(url)`."""

    url: ServerUrl
    pg: Connection
    _cursors: int
    application: str
    BOOKKEEPING = frozenset({MIGRATIONS_TABLE})

    @classmethod
    def open_server(
        cls,
        url: ServerUrl,
        *,
        readonly: bool = False,
        create: bool = True,
        older: bool = False,
        application: str = APPLICATION,
        retry: bool = True,
    ) -> ServerStore:
        conn = connect(url, readonly=readonly, application=application, retry=retry)
        store = cls(conn, url, readonly)  # type: ignore[arg-type]
        store.url, store.pg, store._cursors = url, conn, 0
        store.application = application
        try:
            store._prepare_server(create=create, older=older)
        except BaseException:
            conn.close()
            raise
        return store

    def _fail(self, exc: BaseException) -> StoreError:
        return failure(exc, self.url)

    def reconnect(self) -> None:
        """A new connection in place of one the server ended (a restart, a failover); one
        attempt (the caller retries: `retrying`)."""
        with contextlib.suppress(Exception):
            self.pg.close()
        conn = connect(self.url, readonly=self.readonly, application=self.application, retry=False)
        self.conn = self.pg = conn  # type: ignore[assignment]

    def _prepare_server(self, *, create: bool, older: bool = False) -> None:
        import psycopg

        try:
            applied = self.applied_migrations()
            if self.readonly and older and applied:  # an older schema read as it is
                self.check_schema(allow_pending=True)
                return
            if not applied and (self.readonly or not create):
                self.check_schema()  # a foreign schema, or an empty database, said
            if not self.readonly and set(migrations.names()) - applied:
                self._migrate()
            self.check_schema()
            problem = self._schema_problem()
        except psycopg.Error as exc:
            raise self._fail(exc) from None
        if problem:
            raise damaged(self.path, problem)

    def _migrate(self) -> None:
        with self._writing(exclusive=True):
            # under the lock, the schema as it is now: another process may have just made it
            self.pg.forget_catalog()
            self.check_schema(allow_pending=True)
            applied = self.applied_migrations()
            names = migrations.names()
            done = 0
            while done < len(names) and names[done] in applied:
                done += 1
            if set(names[done:]) & applied:
                raise StoreError(f"{self.url}: migrations applied out of order; nothing changed")
            self.conn.execute(
                f"create table if not exists {MIGRATIONS_TABLE} (migration_set text, "
                "name text, applied_at text, primary key (migration_set, name))"
            )
            for statement in schema_statements(done):
                self.pg.raw.execute(statement)
            for name in names[done:]:
                self.conn.execute(
                    f"insert into {MIGRATIONS_TABLE} (migration_set, name, applied_at) "
                    "values (?, ?, cast(now() as text))",
                    [migrations.SET_NAME, name],
                )
            # ids from the sequence from now on, past those written after the largest stored
            # (no writer is in flight: a migration holds the database's lock alone)
            self.pg.raw.execute(
                f"select setval({MEASUREMENT_IDS}, "
                "coalesce((select max(id) from measurements), 0) + 1, false)"
            )
        self.pg.forget_catalog()

    def applied_migrations(self) -> set[str]:
        if MIGRATIONS_TABLE not in self.table_names():
            return set()
        rows = self.conn.execute(
            f"select name from {MIGRATIONS_TABLE} where migration_set = ?", [migrations.SET_NAME]
        )
        return {r[0] for r in rows}

    def table_names(self) -> set[str]:
        return set(self.pg.catalog())

    def column_types(self, table: str) -> dict[str, str]:
        return {name: kind for name, kind, _ in self.pg.catalog().get(table, [])}

    def column_names(self, table: str) -> list[str]:
        return [name for name, _, _ in self.pg.catalog().get(table, [])]

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One read-only transaction on one snapshot (REPEATABLE READ): a check sees one
        moment of the history, and its lazy reads are server-side cursors in it."""
        import psycopg

        if self.pg.in_transaction:
            yield
            return
        try:
            self.pg.raw.execute("begin isolation level repeatable read read only")
            yield
        except psycopg.Error as exc:
            raise self._fail(exc) from None
        finally:
            self._rollback()

    def lazy_rows(self, sql: str, params: Any) -> Iterator[Any]:
        """Inside `reading`, a server-side cursor: rows come 64 at a time as they are read,
        and the server plans for the first ones (a baseline walk stops after a few dozen of
        20,000); outside it, all rows at once."""
        if not self.pg.in_transaction:
            return iter(self.conn.execute(sql, params))
        self._cursors += 1
        cur = self.pg.raw.cursor(name=f"lazy_{self._cursors}", row_factory=_row_factory)
        cur.itersize = 64
        cur.execute(translate(sql), params)
        return iter(cur)

    def table_rows(
        self, table: str, columns: list[str], key: str, batch: int = 5000
    ) -> Iterator[tuple[Any, ...]]:
        """Every row of `table` in `key` order, by a server-side cursor: `batch` rows in
        memory at a time, not the whole table."""
        names = ", ".join(f'"{c}"' for c in columns)
        with self.pg.raw.transaction(), self.pg.raw.cursor(name=f"rows_{table}") as cur:
            cur.itersize = batch
            cur.execute(f'select {names} from "{table}" order by "{key}"')
            yield from (tuple(r) for r in cur)

    def insert_tables(
        self, tables: Iterable[tuple[str, list[str], Iterable[tuple[Any, ...]]]]
    ) -> None:
        """Rows into tables by COPY (ids included), in one transaction; each identity
        column's sequence then starts past the ids copied."""
        with self._writing():
            for table, columns, rows in tables:
                names = ", ".join(f'"{c}"' for c in columns)
                cur = self.pg.raw.cursor()
                with cur.copy(f'copy "{table}" ({names}) from stdin') as copy:
                    for row in rows:
                        copy.write_row(row)
                if "id" in columns:
                    self.pg.raw.execute(
                        f"select setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                        f'coalesce((select max(id) from "{table}"), 0) + 1, false)'
                    )
                self.pg.raw.execute(f'analyze "{table}"')  # the planner's figures, now

    def kept_columns(self, table: str) -> set[str]:
        return {name for name, _, kept in self.pg.catalog().get(table, []) if kept}

    def _schema_problem(self) -> str | None:
        kinds = {"bigint": "integer", "double precision": "real", "text": "text"}
        for table, columns in expected_schema().items():
            found = self.column_types(table)
            if not found:
                return f"table {table!r} is missing"
            for column, affinity in columns.items():
                if column not in found:
                    return f"column {table}.{column} is missing"
                if affinity is not None and kinds.get(found[column]) != affinity:
                    return (
                        f"column {table}.{column} is of type {found[column]}, expected {affinity}"
                    )
        return None

    def _check_whole(self) -> None:
        problem = self._schema_problem()
        if problem:
            raise damaged(self.path, problem)

    def check_writable(self) -> None:
        import psycopg

        try:
            (read_only,) = self.pg.raw.execute("show transaction_read_only").fetchone()
            if read_only == "on":
                raise StoreError(f"{self.url}: the server takes no writes (read-only)")
            for table in _WRITTEN:
                row = self.conn.execute(
                    "select has_table_privilege(?, 'INSERT')", [table]
                ).fetchone()
                if not row[0]:
                    raise StoreError(f"{self.url}: this user may not write table {table!r}")
        except psycopg.Error as exc:
            raise self._fail(exc) from None

    def _check_same_file(self) -> None:
        """A server database has no file that could be swapped under it."""

    def id_allocator(self) -> Callable[[int], list[int]]:
        def allocate(n: int) -> list[int]:
            rows = self.pg.raw.execute(
                f"select nextval({MEASUREMENT_IDS}) from generate_series(1, %s)", [n]
            ).fetchall()
            return [int(r[0]) for r in rows]

        return allocate

    def claim(self, repository: str | None) -> None:
        """Hold `repository`'s lock until the write transaction ends (taken once each): a
        writer of another repository goes on meanwhile."""
        key = repository or ""
        if key in self._claimed:
            return
        self.pg.raw.execute(
            "select pg_advisory_xact_lock(%s, hashtext(%s))", [REPOSITORY_LOCKS, key]
        )
        self._claimed.add(key)

    @contextlib.contextmanager
    def _writing(
        self, refused: str = "opened read-only", *, exclusive: bool = False
    ) -> Iterator[None]:
        import psycopg

        if self.readonly:
            raise StoreError(f"{self.url}: {refused}")
        if self.pg.in_transaction:  # a write inside `reading` would end its snapshot
            raise StoreError(f"{self.url}: a write inside a read of the history; nothing written")
        self._claimed: set[str] = set()
        try:
            self.conn.execute("BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE")
            yield
            self.conn.execute("COMMIT")
        except psycopg.errors.LockNotAvailable:
            self._rollback()
            raise StoreError(
                f"{self.url}: another writer of the same repository held it for "
                f"{BUSY_TIMEOUT_S:g} s; nothing written"
            ) from None
        except psycopg.Error as exc:
            self._rollback()
            raise self._fail(exc) from None
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        with contextlib.suppress(Exception):
            if self.conn.in_transaction:
                self.pg.raw.execute("rollback")


__all__ = [
    "Connection",
    "Row",
    "ServerStore",
    "connect",
    "describe",
    "schema_statements",
    "translate",
]
