"""What the dashboard reads: its read-only SQL, here in the store with every other statement.
Every query is bounded and rides an index.

The schema's indexes are measurements(case_id, run_id), measurements(run_id),
runs(started_at), runs(git_branch, started_at) and runs(git_commit). A series is read by
walking runs newest first (`CROSS JOIN` keeps runs as the outer loop, so SQLite follows
runs(started_at) or runs(git_branch, started_at) and stops after `limit` rows) and probing
measurements(case_id, run_id) per run; a rare case is read from its own index entries
instead, which is cheaper than walking every run to find a few. No function here loads a
whole table: lists of distinct values come from skip-scans of an index.

Functions take an open connection (`Store.conn`, row factory sqlite3.Row) and return
plain dicts, so the layer above can cache them.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memtrack.records import metrics
from memtrack.store.database import ALL_REPOSITORIES, Store, of_repository
from memtrack.store.opening import open_store
from memtrack.store.url import Database

RARE_CASE_ROWS = 2000
"""Below this many measurements, a case's series is read from its own index entries."""

_MEASUREMENT_COLUMNS = (
    "id",
    "run_id",
    "case_id",
    "workload",
    "status",
    "message",
    "device",
    *metrics.COLUMNS.values(),
    "host_peak_rss_bytes",
    "allocated_samples",
    "time_median_s",
    "time_p95_s",
    "time_min_s",
    "kind",
    "scratch_bytes",
)
_RUN_COLUMNS = (
    "started_at",
    "git_commit",
    "git_parent",
    "git_branch",
    "git_subject",
    "git_dirty",
    "git_committed_at",
    "git_merge_base",
    "fingerprint",
    "env_id",
    "ci_run_url",
)


def _series_columns(conn: sqlite3.Connection) -> str:
    """The series' columns; those an older schema lacks read as NULL."""
    have_m, have_r = table_columns(conn, "measurements"), table_columns(conn, "runs")
    return ", ".join(
        [f"m.{c}" if c in have_m else f"null as {c}" for c in _MEASUREMENT_COLUMNS]
        + [f"r.{c}" if c in have_r else f"null as {c}" for c in _RUN_COLUMNS]
    )


_HEX = re.compile(r"^[0-9a-fA-F]+$")


def open_readonly(path: Database) -> Store:
    """The store, read-only, as `Store.open(readonly=True)` opens it, except that a schema
    older than this memtrack (migrations still pending) is read as it is: the dashboard
    needs only the first schema, and reads verdicts where the table exists. A newer or a
    foreign schema is refused as Store.open refuses it."""
    return open_store(path, readonly=True, older=True)


def _dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    if not isinstance(conn, sqlite3.Connection):  # a server's (memtrack.store.server)
        return bool(table_columns(conn, name))
    row = conn.execute(
        "select 1 from sqlite_master where type = 'table' and name = ?", [name]
    ).fetchone()
    return row is not None


def table_columns(conn: sqlite3.Connection, name: str) -> set[str]:
    if not isinstance(conn, sqlite3.Connection):  # a server's: its catalog, read once
        return {column for column, _, _ in conn.catalog().get(name, [])}
    return {r[1] for r in conn.execute(f"pragma table_info({name})")}


def _in_repository(conn: sqlite3.Connection, alias: str, scope: str) -> str:
    """SQL: ` and` the run `alias` is of the repository `scope` (a `Store.scope`, bound to
    `:repo`: with the runs that record none); '' for every repository, or on a schema from
    before repositories were recorded."""
    if scope == ALL_REPOSITORIES or "git_repository" not in table_columns(conn, "runs"):
        return ""
    return f" and {of_repository(scope, alias, ':repo')}"


def write_stamp(conn: sqlite3.Connection) -> tuple[int, ...]:
    """What changes whenever runs are recorded or a check records verdicts (a server's
    database, which has no file to look at): the runs counted, the newest verdict's id."""
    runs = conn.execute("select count(*) from runs").fetchone()[0]
    verdicts = (
        conn.execute("select coalesce(max(id), 0) from verdicts").fetchone()[0]
        if has_table(conn, "verdicts")
        else 0
    )
    return (int(runs), int(verdicts))


def summary(conn: sqlite3.Connection) -> dict[str, Any]:
    """How many runs, and the newest and oldest start times (runs(started_at) index)."""
    count = conn.execute("select count(*) from runs").fetchone()[0]
    first = conn.execute("select min(started_at) from runs").fetchone()[0]
    last = conn.execute("select max(started_at) from runs").fetchone()[0]
    return {"runs": count, "first": first, "last": last}


def _distinct(conn: sqlite3.Connection, table: str, column: str, limit: int) -> list[str]:
    """Distinct non-null values of an indexed leading column: one index seek per value."""
    sql = f"""
        with recursive v(x, n) as (
            select (select min({column}) from {table}), 1
            union all
            select (select min({column}) from {table} where {column} > v.x), n + 1
            from v where v.x is not null and n < :limit
        )
        select x from v where x is not null
    """
    return [r[0] for r in conn.execute(sql, {"limit": limit})]


def repositories(conn: sqlite3.Connection, limit: int = 1000) -> list[str]:
    """The repositories the runs record (none on a schema from before they were)."""
    if "git_repository" not in table_columns(conn, "runs"):
        return []
    return _distinct(conn, "runs", "git_repository", limit)


def case_ids(conn: sqlite3.Connection, limit: int = 5000) -> list[str]:
    return _distinct(conn, "measurements", "case_id", limit)


def branches(conn: sqlite3.Connection, limit: int = 1000) -> list[str]:
    return _distinct(conn, "runs", "git_branch", limit)


def environments(conn: sqlite3.Connection, limit: int = 1000) -> list[dict[str, Any]]:
    """One row per environment recorded (a small table: one row per distinct software stack)."""
    cur = conn.execute(
        "select env_id, fingerprint, gpus, driver, cuda_runtime, cudnn, nccl, torch, python, "
        "os, cpu, cpu_count, host_ram_bytes, packages, env_vars from environments limit ?",
        [limit],
    )
    rows = _dicts(cur)
    for row in rows:
        for key in ("gpus", "packages", "env_vars"):
            row[key] = json.loads(row[key]) if row[key] else ({} if key != "gpus" else [])
    return rows


def case_size(conn: sqlite3.Connection, case_id: str, cap: int = RARE_CASE_ROWS + 1) -> int:
    """How many measurements a case has, counted up to `cap` (its own index entries only)."""
    return conn.execute(
        "select count(*) from (select 1 from measurements where case_id = ? limit ?) c",
        [case_id, cap],
    ).fetchone()[0]


def series(
    conn: sqlite3.Connection,
    case_id: str,
    *,
    branches: Sequence[str] = (),
    fingerprints: Sequence[str] = (),
    since: str | None = None,
    until: str | None = None,
    limit: int = 500,
    size: int | None = None,
    kind: str = "measured",
    repository: str = ALL_REPOSITORIES,
) -> list[dict[str, Any]]:
    """A case's measurements with their run, newest first, at most `limit` rows.

    `since`/`until` bound started_at (ISO strings; `until` exclusive). `size` is the case's
    measurement count when the caller already knows it. `kind`: 'measured' (the series),
    or 'estimate' (`memtrack estimate`'s figures, never part of a series).
    """
    params: dict[str, Any] = {"case": case_id, "limit": limit, "kind": kind, "repo": repository}
    where = [w for w in [_in_repository(conn, "r", repository)[len(" and ") :]] if w]
    if "kind" in table_columns(conn, "measurements"):
        where.append("m.kind = :kind")
    elif kind != "measured":  # a schema from before estimates holds none
        return []
    if len(branches) == 1:
        where.append("r.git_branch = :branch")
        params["branch"] = branches[0]
    elif branches:
        # Unary + keeps SQLite from sorting all rows of these branches; it walks by time.
        marks = ", ".join(f":b{i}" for i in range(len(branches)))
        where.append(f"+r.git_branch in ({marks})")
        params.update({f"b{i}": b for i, b in enumerate(branches)})
    if fingerprints:
        marks = ", ".join(f":f{i}" for i in range(len(fingerprints)))
        where.append(f"r.fingerprint in ({marks})")
        params.update({f"f{i}": f for i, f in enumerate(fingerprints)})
    if since:
        where.append("r.started_at >= :since")
        params["since"] = since
    if until:
        where.append("r.started_at < :until")
        params["until"] = until
    filters = "".join(f" and {w}" for w in where)
    if size is None:
        size = case_size(conn, case_id)
    if size <= RARE_CASE_ROWS:
        sql = (
            f"select {_series_columns(conn)} from measurements m cross join runs r "
            f"on r.run_id = m.run_id where m.case_id = :case{filters} "
            "order by r.started_at desc, m.id desc limit :limit"
        )
    else:
        sql = (
            f"select {_series_columns(conn)} from runs r cross join measurements m "
            f"on m.run_id = r.run_id and m.case_id = :case where true{filters} "
            "order by r.started_at desc limit :limit"
        )
    return _dicts(conn.execute(sql, params))


def verdicts_for_runs(
    conn: sqlite3.Connection, run_ids: Iterable[str], *, case_id: str | None = None
) -> list[dict[str, Any]]:
    """Verdicts recorded about these candidate runs; [] when the store has no verdicts."""
    ids = list(dict.fromkeys(run_ids))
    if not ids or not has_table(conn, "verdicts"):
        return []
    out: list[dict[str, Any]] = []
    for start in range(0, len(ids), 500):  # stay under SQLite's variable limit
        chunk = ids[start : start + 500]
        sql = f"select * from verdicts where run_id in ({', '.join('?' for _ in chunk)})"
        args: list[Any] = list(chunk)
        if case_id is not None:
            sql += " and case_id = ?"
            args.append(case_id)
        out.extend(_dicts(conn.execute(sql + " order by id", args)))
    return out


def latest_verdicts(
    conn: sqlite3.Connection, case_id: str, *, repository: str = ALL_REPOSITORIES
) -> list[dict[str, Any]]:
    """The newest verdict per metric of a case that carries a baseline or a budget."""
    if not has_table(conn, "verdicts"):
        return []
    # Verdicts are written as they are checked, so id order is check order, and the
    # case_id index (whose entries end in the rowid) walks it newest first without sorting.
    scope = _in_repository(conn, "r", repository)
    joined = "join runs r on r.run_id = v.run_id " if scope else ""
    rows = _dicts(
        conn.execute(
            f"select v.* from verdicts v {joined}where v.case_id = :case and "
            f"(v.threshold is not null or v.budget_bytes is not null){scope} "
            "order by v.id desc limit 200",
            {"case": case_id, "repo": repository},
        )
    )
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        seen.setdefault(row["metric"], row)
    return list(seen.values())


def recent_runs(
    conn: sqlite3.Connection,
    *,
    limit: int = 200,
    branch: str | None = None,
    repository: str = ALL_REPOSITORIES,
) -> list[dict[str, Any]]:
    """The newest runs with their case and failure counts (measurements(run_id) index)."""
    cols = (
        "r.run_id, r.started_at, r.git_commit, r.git_branch, r.git_subject, r.git_dirty, "
        "r.fingerprint, r.env_id, r.git_merge_base, "
        "(select count(*) from measurements m where m.run_id = r.run_id) as cases, "
        "(select count(*) from measurements m where m.run_id = r.run_id "
        " and m.status != 'ok') as failed"
    )
    scope = _in_repository(conn, "r", repository)
    params = {"branch": branch, "limit": limit, "repo": repository}
    if branch:
        cur = conn.execute(
            f"select {cols} from runs r where r.git_branch = :branch{scope} "
            "order by r.started_at desc limit :limit",
            params,
        )
    else:
        cur = conn.execute(
            f"select {cols} from runs r where true{scope} order by r.started_at desc limit :limit",
            params,
        )
    return _dicts(cur)


def find_runs(
    conn: sqlite3.Connection, text: str, *, limit: int = 20, repository: str = ALL_REPOSITORIES
) -> list[dict[str, Any]]:
    """Runs whose id or commit starts with `text` (hex), newest first."""
    text = text.strip()
    if not text or not _HEX.match(text):
        return []
    # GLOB is case-sensitive, so SQLite answers a prefix GLOB from the index; a server's
    # text columns are of the "C" collation, so its LIKE prefix rides the index too. The
    # text is hex: no wildcard of either.
    match = "glob" if isinstance(conn, sqlite3.Connection) else "like"
    pattern = text.lower() + ("*" if match == "glob" else "%")
    return _dicts(
        conn.execute(
            "select run_id, started_at, git_commit, git_branch, git_subject, fingerprint from ("
            f" select * from runs where run_id {match} :p"
            f" union select * from runs where git_commit {match} :p"
            f") u where true{_in_repository(conn, 'u', repository)} "
            "order by started_at desc limit :n",
            {"p": pattern, "n": limit, "repo": repository},
        )
    )


def run(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """One run's row with its environment, or None."""
    rows = _dicts(conn.execute("select * from runs where run_id = ?", [run_id]))
    if not rows:
        return None
    row = rows[0]
    envs = _dicts(conn.execute("select * from environments where env_id = ?", [row["env_id"]]))
    env = envs[0] if envs else {}
    for key in ("gpus", "torch_cuda_arch_list", "packages", "env_vars"):
        if isinstance(env.get(key), str):
            env[key] = json.loads(env[key])
    row["environment"] = env
    if isinstance(row.get("git_notes"), str):
        row["git_notes"] = json.loads(row["git_notes"])
    return row


def measurements(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """A run's measurements, each with its per-device rows under 'devices'."""
    rows = _dicts(
        conn.execute("select * from measurements where run_id = ? order by case_id, id", [run_id])
    )
    for row in rows:
        for key in ("params", "categories", "notes", "sites"):
            if isinstance(row.get(key), str):
                row[key] = json.loads(row[key])
        row["devices"] = _dicts(
            conn.execute(
                'select * from device_measurements where measurement_id = ? order by "index"',
                [row["id"]],
            )
        )
    return rows


def has_no_tables(path: Path) -> bool:
    """Whether the SQLite file at `path` holds no table yet (a database made but never
    written); False where it cannot be read."""
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            return conn.execute("select count(*) from sqlite_master").fetchone()[0] == 0
        finally:
            conn.close()
    except sqlite3.Error:
        return False
