"""memtrack's dashboard: memory history a reviewer can read at a glance.

Start it with `memtrack dashboard [--db PATH] [--config PATH]`, which runs

    streamlit run dashboard/app.py -- --db PATH [--config PATH]

Without --db, the database is $MEMTRACK_DATABASE_URL (how `memtrack dashboard` hands over a
server's URL: never on a command line), else the config's `database` (found from the
current directory as memtrack finds it). The database is opened read-only; nothing here
writes to it.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path

import streamlit as st
from memtrack.dashboard import data
from memtrack.dashboard.views import (
    PAGES,
    Context,
    compare,
    esc,
    history,
    overview,
    page_name,
    plan,
    regressions,
    run_detail,
)

from memtrack.config import Config, load_config
from memtrack.errors import ConfigError, MemtrackError, StoreError
from memtrack.machine.provenance import repository_identity
from memtrack.store import browse as queries
from memtrack.store.database import ALL_REPOSITORIES
from memtrack.store.url import Database, ServerUrl, parse_database

RENDER = dict(
    zip(
        PAGES,
        (
            overview.render,
            history.render,
            regressions.render,
            run_detail.render,
            compare.render,
            plan.render,
        ),
        strict=True,
    )
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dashboard/app.py", add_help=False)
    parser.add_argument("--db")
    parser.add_argument("--config", type=Path)
    args, _ = parser.parse_known_args(argv)
    return args


@st.cache_data(ttl=60, show_spinner=False)
def load_settings(config_path: str | None, cwd: str) -> tuple[Config | None, str | None]:
    """The config (for budgets and the base branch), or None and why not."""
    try:
        return load_config(Path(config_path) if config_path else None, cwd=Path(cwd)), None
    except MemtrackError as exc:
        return None, str(exc)


def empty_state(db: Database, why: str) -> None:
    st.title("memtrack")
    st.info(
        f"**No runs recorded yet** in {esc(db)} ({why}).\n\n"
        "Record a first run, then reload this page:\n\n"
        f"```bash\nmemtrack run --db {db}\n```\n\n"
        "This measures the configured suite (the shipped examples without a config) and "
        "stores one row per workload case. Runs recorded elsewhere as JSON records can be "
        f"merged with `memtrack ingest run.json --db {db}`."
    )


def open_database(db: Database) -> dict | None:
    """The store's summary, or None after showing why it cannot be shown."""
    if isinstance(db, ServerUrl):
        return _open_server(db)
    if not db.is_file() or db.stat().st_size == 0 or queries.has_no_tables(db):
        empty_state(
            db, "the database does not exist yet" if not db.is_file() else "the database is empty"
        )
        return None
    try:
        queries.open_readonly(db).close()  # checks the schema version
    except StoreError as exc:
        st.title("memtrack")
        st.error(f"This database cannot be shown: {esc(exc)}")
        return None
    summary = data.summary(str(db), data.stamp(str(db)))
    if summary["runs"] == 0:
        empty_state(db, "the database has no runs")
        return None
    return summary


def _open_server(db: ServerUrl) -> dict | None:
    try:
        data.connected(db.url)  # the schema version checked as the session's connection opens
    except StoreError as exc:
        if "empty database" in str(exc):
            empty_state(db, "the database holds no memtrack schema yet")
        else:
            st.title("memtrack")
            st.error(f"This database cannot be shown: {esc(exc)}")
        return None
    summary = data.summary(db.url, data.stamp(db.url))
    if summary["runs"] == 0:
        empty_state(db, "the database has no runs")
        return None
    return summary


def _page_to_url() -> None:
    """The selector's callback: the page chosen goes into the address, to share."""
    st.query_params["page"] = st.session_state["page"]


def choose_page() -> str:
    """The page the address names (in any case; Overview where it names none), drawn in
    this same run; the selector shows it and writes a choice back to the address. The
    selector is not bound to the address by Streamlit: a bound one drops a name in
    another case, and the rerun that said it right first could leave the page blank."""
    asked = st.query_params.get("page")
    page = page_name(asked)
    if asked is not None and page is None:
        del st.query_params["page"]
        st.warning(f"There is no page {esc(asked, 40)}: the pages are {', '.join(PAGES)}.")
    elif page is not None and asked != page:
        st.query_params["page"] = page  # said right in the address
    # The address decides (a link, or the browser's back and forward); set before the
    # selector is drawn, so that it shows the page.
    st.session_state["page"] = page or PAGES[0]
    st.radio(
        "Page",
        PAGES,
        key="page",
        on_change=_page_to_url,
        horizontal=True,
        label_visibility="collapsed",
    )
    return page or PAGES[0]


def choose_repository(found: list[str], config: Config | None) -> str:
    """The repository shown, where the database records any: a selector of them (in the
    address as `repo`, to share), the config's or the working tree's first, else the
    first. Runs that record none are shown with every one."""
    if not found:
        return ALL_REPOSITORIES
    here = repository_identity(config.root, config.repository) if config else None
    asked = st.query_params.get("repo")
    default = asked if asked in found else here if here in found else found[0]
    if len(found) == 1:
        st.caption(f"Repository {esc(found[0])}")
        return found[0]
    chosen = str(st.selectbox("Repository", found, index=found.index(default), key="repository"))
    if chosen != asked:
        st.query_params["repo"] = chosen
    return chosen


def show(db: Database, config: Config | None, config_error: str | None) -> None:
    summary = open_database(db)
    if summary is None:
        return
    name = db.url if isinstance(db, ServerUrl) else str(db)  # what opens it, never shown
    key = data.stamp(name)
    choices = data.choices(name, key)
    page = choose_page()
    with st.sidebar:
        st.header("memtrack")
        repository = choose_repository(choices["repositories"], config)
        st.caption(
            f"Database {esc(db)} (read-only) · {summary['runs']:,} runs, newest "
            f"{esc((summary['last'] or '-')[:16].replace('T', ' '))}"
        )
        if config_error:
            st.warning(f"Budgets not loaded: {esc(config_error)}")
        elif config is not None:
            where = esc(config.path) if config.path else "the embedded default"
            st.caption(
                f"Config {where} · base branch {esc(config.base_branch)} · "
                f"{len(config.budgets)} budget rule(s) in the config; a case without "
                "one shows the budget its latest verdict recorded."
            )
        if not summary["has_verdicts"]:
            st.caption(
                "No verdicts recorded yet: regressions show once `memtrack check` records them."
            )
    ctx = Context(
        db=name,
        key=key,
        config=config,
        summary=summary,
        choices=choices,
        repository=repository,
    )
    RENDER[page](ctx)


def server_errors() -> type[Exception]:
    """The driver's errors where a server's database is read (a server gone while a page
    is drawn), else a class nothing raises."""
    psycopg = sys.modules.get("psycopg")
    return psycopg.Error if psycopg is not None else StoreError


def main() -> None:
    st.set_page_config(
        page_title="memtrack", page_icon="📈", layout="wide", initial_sidebar_state="collapsed"
    )
    args = parse_args(sys.argv[1:])
    config, config_error = load_settings(str(args.config) if args.config else None, str(Path.cwd()))
    given = args.db or os.environ.get("MEMTRACK_DATABASE_URL")
    try:
        db = parse_database(given, "--db") if given else None
    except ConfigError as exc:
        st.error(esc(exc))
        return
    db = db or (config.database if config else Path("data/memtrack.db"))
    if isinstance(db, Path):
        db = db.resolve()
    try:
        show(db, config, config_error)
    except (sqlite3.DatabaseError, StoreError, server_errors()) as exc:
        # A damaged file (or one replaced while open): one line, not a traceback.
        st.error(
            f"The database {esc(db)} cannot be read: {esc(exc)}. Restore it from a "
            "backup (`memtrack backup`) or point --db at another file."
        )


main()
