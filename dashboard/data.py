"""Cached access to the store: each function reads it (read-only) through `queries`.

Results are cached per database file and its modification stamp, so a run recorded while
the dashboard is open shows on the next interaction, and a page that is revisited costs
nothing. A database file is opened and closed by each read; a server's database is read
through one connection per browser session (`_session_store`), kept for its reruns and
opened again where the server ended it, so that viewers hold a connection each, not one
per query.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import streamlit as st
from memtrack.dashboard import model

from memtrack.judge.gather.baseline import open_regressions
from memtrack.store import browse as queries
from memtrack.store.database import ALL_REPOSITORIES, Store
from memtrack.store.url import Database, ServerUrl, parse_database

TTL_S = 600
Stamp = tuple[int, ...]


def stamp(db: str) -> Stamp:
    """Changes whenever the database (or its write-ahead log) is written; a server's
    database, whenever runs or verdicts are recorded."""
    if isinstance(database(db), ServerUrl):
        with _open(db) as s:
            return queries.write_stamp(s.conn)
    out: list[int] = []
    for suffix in ("", "-wal"):
        try:
            st_ = os.stat(db + suffix)
        except OSError:
            out += [0, 0]
        else:
            out += [st_.st_mtime_ns, st_.st_size]
    return tuple(out)


def database(db: str) -> Database:
    """The database a page's `db` names: a file's path, or a server's URL (its password
    included: `db` is never shown; `str(database(db))` is)."""
    return parse_database(db, "--db")


@contextlib.contextmanager
def _open(db: str, repository: str | None = ALL_REPOSITORIES) -> Iterator[Store]:
    """The store, read-only, its history read as `repository`'s (`Store.repository`)."""
    found = database(db)
    if isinstance(found, ServerUrl):
        store = _session_store(db, found)
        store.repository = repository
        yield store
        return
    with queries.open_readonly(found) as store:
        store.repository = repository
        yield store


def connected(db: str) -> None:
    """The database opened as a read opens it: StoreError where it cannot be (its schema
    version checked; a server's through the session's connection, checked once)."""
    with _open(db):
        pass


SESSION_STORE = "memtrack_server_store"
"""Where a session keeps its connection to a server's database (st.session_state)."""


def _session_store(db: str, url: ServerUrl) -> Store:
    """This browser session's connection to the server's database: opened on its first
    read, reused by every later one, opened again where the server no longer answers on it
    (a restart, a failover, an idle-session timeout). It names itself 'memtrack dashboard'
    to the server (pg_stat_activity)."""
    from memtrack.store.server import ServerStore

    held = st.session_state.get(SESSION_STORE)
    if held is not None:
        held_db, store = held
        if held_db == db and store.pg.alive():
            return store
        with contextlib.suppress(Exception):  # lost already: nothing to close cleanly
            store.close()
    # no wait for a server that does not answer (a page says so at once), and a session
    # left open in a browser tab ends on the server after IDLE (opened again when used)
    store = ServerStore.open_server(
        url, readonly=True, older=True, application=DASHBOARD, retry=False
    )
    with contextlib.suppress(Exception):  # before PostgreSQL 14: kept until the tab closes
        store.pg.raw.execute(f"set idle_session_timeout = '{IDLE_S * 1000}ms'")
    st.session_state[SESSION_STORE] = (db, store)
    return store


DASHBOARD = "memtrack dashboard"
IDLE_S = 600
"""How long a browser session's connection may stay idle before the server ends it."""


@st.cache_data(ttl=TTL_S, show_spinner=False)
def summary(db: str, key: Stamp, repository: str | None = ALL_REPOSITORIES) -> dict[str, Any]:
    with _open(db, repository) as s:
        out = queries.summary(s.conn)
        out["has_verdicts"] = queries.has_table(s.conn, "verdicts")
        return out


@st.cache_data(ttl=TTL_S, show_spinner=False)
def choices(db: str, key: Stamp, repository: str | None = ALL_REPOSITORIES) -> dict[str, Any]:
    """What the filters offer: case ids, branches, environments (by env id)."""
    with _open(db, repository) as s:
        return {
            "cases": queries.case_ids(s.conn),
            "branches": queries.branches(s.conn),
            "repositories": queries.repositories(s.conn),
            "environments": {e["env_id"]: e for e in queries.environments(s.conn)},
        }


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latest_by_case(
    db: str,
    key: Stamp,
    branch: str | None,
    fingerprint: str | None,
    points: int,
    factor: float,
    base_branch: str = "main",
    repository: str | None = ALL_REPOSITORIES,
) -> list[dict[str, Any]]:
    """Per case, its newest `points` measurements under the filters (cases without any are
    left out), the verdicts recorded about them ('window_verdicts') and about its newest run
    ('verdicts'), its newest verdict per metric that carries a budget or a threshold, the
    steps of each view ('steps'), and the base branch's regressions of the case still open,
    whatever their age ('open', on its newest run's environment)."""
    with _open(db, repository) as s:
        out: list[dict[str, Any]] = []
        for case in queries.case_ids(s.conn):
            rows = queries.series(
                s.conn,
                case,
                repository=s.scope,
                branches=[branch] if branch else [],
                fingerprints=[fingerprint] if fingerprint else [],
                limit=points,
            )
            if rows:
                out.append(
                    {
                        "case_id": case,
                        "rows": rows,
                        "budget_verdicts": queries.latest_verdicts(
                            s.conn, case, repository=s.scope
                        ),
                    }
                )
        verdicts = queries.verdicts_for_runs(s.conn, [r["run_id"] for c in out for r in c["rows"]])
        for c in out:
            latest = c["rows"][0]
            c["window_verdicts"] = [v for v in verdicts if v["case_id"] == c["case_id"]]
            c["verdicts"] = [v for v in c["window_verdicts"] if v["run_id"] == latest["run_id"]]
            c["open"] = model.open_dicts(
                open_regressions(
                    s, base_branch, [c["case_id"]], fingerprint=latest.get("fingerprint")
                )
            )
    for c in out:
        c["steps"] = {m: model.steps(c["rows"], m, factor) for m in model.METRIC_COLUMNS}
    return out


@st.cache_data(ttl=TTL_S, show_spinner=False)
def base_series(
    db: str,
    key: Stamp,
    base_branch: str,
    points: int,
    factor: float,
    repository: str | None = ALL_REPOSITORIES,
) -> list[dict[str, Any]]:
    """Per case, its newest `points` runs on the base branch, their verdicts and the steps
    of each view."""
    with _open(db, repository) as s:
        out: list[dict[str, Any]] = []
        for case in queries.case_ids(s.conn):
            rows = queries.series(
                s.conn, case, branches=[base_branch], limit=points, repository=s.scope
            )
            if rows:
                out.append(
                    {
                        "case_id": case,
                        "rows": rows,
                        "verdicts": queries.verdicts_for_runs(
                            s.conn, [r["run_id"] for r in rows], case_id=case
                        ),
                        "open": model.open_dicts(open_regressions(s, base_branch, [case])),
                    }
                )
    for c in out:
        c["steps"] = {m: model.steps(c["rows"], m, factor) for m in model.CHART_METRICS}
    return out


@st.cache_data(ttl=TTL_S, show_spinner=False)
def history(
    db: str,
    key: Stamp,
    case_id: str,
    branches: tuple[str, ...],
    fingerprints: tuple[str, ...],
    since: str | None,
    until: str | None,
    limit: int,
    base_branch: str,
    factor: float,
    repository: str | None = ALL_REPOSITORIES,
) -> dict[str, Any]:
    """A case's rows under the filters (each with its place 'x' on the time axis: commit
    time on the base branch, run time elsewhere), their verdicts, and the steps of each
    view along the base branch (along the rows shown, without it). Cached: finding steps
    is the costly part of a page."""
    shown: dict[str, Any] = dict(
        branches=branches, fingerprints=fingerprints, since=since, until=until, limit=limit
    )
    with _open(db, repository) as s:
        rows = queries.series(s.conn, case_id, repository=s.scope, **shown)
        verdicts = queries.verdicts_for_runs(s.conn, [r["run_id"] for r in rows], case_id=case_id)
        latest = queries.latest_verdicts(s.conn, case_id, repository=s.scope)
        estimates = queries.series(s.conn, case_id, repository=s.scope, kind="estimate", **shown)
        still = model.open_dicts(open_regressions(s, base_branch, [case_id]))
    place_on_one_axis(rows, estimates, base_branch=base_branch)
    line = [r for r in rows if r["git_branch"] == base_branch] or rows
    return {
        "rows": rows,
        "verdicts": verdicts,
        "latest_verdicts": latest,
        "open": still,
        "estimates": [r for r in estimates if r["status"] == "ok"],
        "on_base": line is not rows,
        "steps": {m: model.steps(line, m, factor) for m in model.CHART_METRICS},
    }


def place_on_one_axis(*groups: list[dict[str, Any]], base_branch: str) -> None:
    """Each row's `x` on one time base, the base branch's commit times: a base-branch run
    at its commit's time, another branch's run at the time of its merge-base (where a run
    of the base branch names that commit; else at its own commit's time). The run's start
    is the last resort: runs start after their commits, and a history whose commits are
    dated ahead of their runs would otherwise press one series against an edge."""
    committed = {
        r["git_commit"]: _utc(r["git_committed_at"])
        for rows in groups
        for r in rows
        if r["git_branch"] == base_branch and r.get("git_committed_at")
    }
    for rows in groups:
        for r in rows:
            own = _utc(r.get("git_committed_at") or r["started_at"])
            if r["git_branch"] == base_branch:
                r["x"] = own
            else:
                r["x"] = committed.get(r.get("git_merge_base") or "", own)


def _utc(stamp: str) -> str:
    """An ISO time in UTC ('+02:00' commit times beside '+00:00' runs sort as times)."""
    try:
        return datetime.fromisoformat(stamp).astimezone(timezone.utc).isoformat()
    except (TypeError, ValueError):
        return stamp


@st.cache_data(ttl=TTL_S, show_spinner=False)
def pull_requests(
    db: str,
    key: Stamp,
    base_branch: str,
    limit: int = 200,
    repository: str | None = ALL_REPOSITORIES,
) -> list[dict[str, Any]]:
    """The newest run of each branch other than the base branch among the newest `limit`
    runs, newest first, each with its recorded verdicts ('verdicts')."""
    with _open(db, repository) as s:
        seen: dict[str, dict[str, Any]] = {}
        for r in queries.recent_runs(s.conn, limit=limit, repository=s.scope):
            branch = r.get("git_branch")
            if branch and branch != base_branch and branch not in seen:
                seen[branch] = r
        for r in seen.values():
            r["verdicts"] = queries.verdicts_for_runs(s.conn, [r["run_id"]])
        return list(seen.values())


@st.cache_data(ttl=TTL_S, show_spinner=False)
def recent_runs(
    db: str, key: Stamp, limit: int = 200, repository: str | None = ALL_REPOSITORIES
) -> list[dict[str, Any]]:
    with _open(db, repository) as s:
        return queries.recent_runs(s.conn, limit=limit, repository=s.scope)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def find_runs(
    db: str, key: Stamp, text: str, repository: str | None = ALL_REPOSITORIES
) -> list[dict[str, Any]]:
    with _open(db, repository) as s:
        return queries.find_runs(s.conn, text, repository=s.scope)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run_detail(
    db: str, key: Stamp, run_id: str, repository: str | None = ALL_REPOSITORIES
) -> dict[str, Any] | None:
    with _open(db, repository) as s:
        run = queries.run(s.conn, run_id)
        if run is None:
            return None
        run["measurements"] = queries.measurements(s.conn, run_id)
        run["verdicts"] = queries.verdicts_for_runs(s.conn, [run_id])
        return run


@st.cache_data(ttl=TTL_S, show_spinner=False)
def plan_rows(
    db: str,
    key: Stamp,
    workload: str,
    param: str,
    branch: str | None = None,
    limit: int = 200,
    repository: str | None = ALL_REPOSITORIES,
) -> list[dict[str, Any]]:
    """The newest `limit` measurements of each case of a workload that sets `param` (of one
    branch, or of all)."""
    with _open(db, repository) as s:
        cases = [
            c
            for c in queries.case_ids(s.conn)
            if model.case_params(c)[0] == workload and param in model.case_params(c)[1]
        ]
        branches = (branch,) if branch else ()
        return [
            r
            for c in cases
            for r in queries.series(s.conn, c, branches=branches, limit=limit, repository=s.scope)
        ]
