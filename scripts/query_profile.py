"""Where `memtrack check`'s time goes, query by query, in one process.

Runs the check (as `memtrack check --run RUN_ID` does, without printing) a few times for its
time in process, then once more with the store's connection wrapped, so that each SQL
statement's time inside SQLite (its execute and every row fetched) is summed per statement
and caller. Prints one JSON object: {"check_s": ..., "queries": [{"caller", "sql", "calls",
"seconds"}, ...]}, slowest first.

    python scripts/query_profile.py DB RUN_ID CONFIG [--repeat 3]

It imports only what every memtrack with a `check` has (store, config, judge.check), so
scripts/bench_check.py runs it against an older checkout too (PYTHONPATH=that checkout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from memtrack.config import load_config
from memtrack.judge.check import check

try:
    from memtrack.store.database import Store
except ImportError:  # an older tree, timed beside this one: store.py was one module
    from memtrack.store import Store  # type: ignore[attr-defined,no-redef]

Stat = list  # [calls, seconds]


class _TimedCursor:
    """A cursor whose fetches add their time to the statement's figure."""

    def __init__(self, cursor: Any, stat: Stat):
        self._cursor, self._stat = cursor, stat

    def _timed(self, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._stat[1] += time.perf_counter() - t

    def __iter__(self) -> _TimedCursor:
        return self

    def __next__(self) -> Any:
        return self._timed(next, self._cursor)

    def fetchone(self) -> Any:
        return self._timed(self._cursor.fetchone)

    def fetchall(self) -> Any:
        return self._timed(self._cursor.fetchall)

    def fetchmany(self, *args: Any) -> Any:
        return self._timed(self._cursor.fetchmany, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class TimedConnection:
    """An sqlite3 connection that times each statement, keyed by its caller and SQL text."""

    def __init__(self, conn: Any):
        self._conn = conn
        self.stats: dict[tuple[str, str], Stat] = {}

    def _stat(self, sql: str) -> Stat:
        frame = sys._getframe(2)
        while frame.f_code.co_filename == __file__:
            frame = frame.f_back  # type: ignore[assignment]
        code = frame.f_code
        caller = f"{frame.f_globals.get('__name__')}.{getattr(code, 'co_qualname', code.co_name)}"
        stat = self.stats.setdefault((caller, " ".join(sql.split())), [0, 0.0])
        stat[0] += 1
        return stat

    def execute(self, sql: str, *args: Any) -> _TimedCursor:
        stat = self._stat(sql)
        t = time.perf_counter()
        cursor = self._conn.execute(sql, *args)
        stat[1] += time.perf_counter() - t
        return _TimedCursor(cursor, stat)

    def executemany(self, sql: str, *args: Any) -> _TimedCursor:
        stat = self._stat(sql)
        t = time.perf_counter()
        cursor = self._conn.executemany(sql, *args)
        stat[1] += time.perf_counter() - t
        return _TimedCursor(cursor, stat)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _open(db: str) -> Any:
    """The store: through open_store where the tree has one (an SQLite file or a server's
    database), else Store.open (an older tree)."""
    try:
        from memtrack.store.opening import open_store
        from memtrack.store.url import parse_database
    except ImportError:
        return Store.open(Path(db))
    return open_store(parse_database(db, "DB"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="an SQLite file, or (this tree) a postgresql:// URL")
    ap.add_argument("run_id")
    ap.add_argument("config", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    config = load_config(args.config)
    walls = []
    with _open(args.db) as store:
        for _ in range(args.repeat):
            t = time.perf_counter()
            check(store, config, run_id=args.run_id, root=args.config.parent)
            walls.append(time.perf_counter() - t)
        timed = TimedConnection(store.conn)
        store.conn = timed  # type: ignore[assignment]
        check(store, config, run_id=args.run_id, root=args.config.parent)
        store.conn = timed._conn
    queries = [
        {"caller": caller, "sql": sql, "calls": calls, "seconds": seconds}
        for (caller, sql), (calls, seconds) in timed.stats.items()
    ]
    queries.sort(key=lambda q: -q["seconds"])
    print(json.dumps({"check_s": statistics.median(walls), "queries": queries}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
