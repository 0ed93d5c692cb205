"""Options and helpers shared by several commands."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from memtrack.config import Config, load_config
from memtrack.errors import ConfigError, StoreError
from memtrack.files import output_problem
from memtrack.store.database import Store, room_problem
from memtrack.store.url import Database, parse_database

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="memtrack.toml or pyproject.toml (default: found from the current directory; "
    "without one, the shipped example suite).",
)
no_db_option = click.option(
    "--no-db", is_flag=True, help="Do not write the database (use with --json)."
)


def patterns_option(verb: str = "") -> Callable[[Any], Any]:
    """-k/--workload: '[{verb}] only cases whose id contains this text (repeatable).'"""
    words = "only cases whose id contains this text (repeatable)."
    return click.option(
        "-k",
        "--workload",
        "patterns",
        multiple=True,
        help=f"{verb} {words}" if verb else words[0].upper() + words[1:],
    )


def json_path_option(what: str) -> Callable[[Any], Any]:
    """--json PATH: 'Also write {what} here.'"""
    return click.option(
        "--json",
        "json_path",
        type=click.Path(path_type=Path, dir_okay=False),
        help=f"Also write {what} here.",
    )


class DatabaseParam(click.ParamType):
    """A database: an SQLite file's path (or sqlite:///PATH) or a server URL
    (postgresql://...), its password never shown in an error."""

    name = "PATH|URL"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse_database(value, "")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


db_option = click.option(
    "--db",
    "db_path",
    envvar=["MEMTRACK_DB", "MEMTRACK_DATABASE_URL"],
    type=DatabaseParam(),
    help="SQLite file or postgresql:// URL (default: $MEMTRACK_DB, $MEMTRACK_DATABASE_URL, "
    "else the config's `database`, data/memtrack.db).",
)


def resolve(
    config_path: Path | None, db_path: Database | None, *, writes: bool = False
) -> tuple[Config, Database]:
    """The config, and the database: --db (or $MEMTRACK_DB) where given, else the config's
    `database`. A command that `writes` the database refuses a --db whose folder does not
    exist (a typo must not plant folders anywhere); the config's own path gets its folder
    made with the database."""
    config = load_config(config_path)
    if writes and isinstance(db_path, Path) and not db_path.parent.is_dir():
        raise ConfigError(
            f"--db {db_path}: no such folder {db_path.parent} (memtrack makes the database "
            "file, not the folders above it)"
        )
    return config, db_path or config.database


def series_of(store: Store, db: Database, name: str) -> str:
    """What `history` shows for `name`: the name itself where it has runs (a case id, or a
    workload name for all its cases), else the one case whose id starts with it (a unique
    prefix). StoreError naming what it could have meant: the cases it is a prefix of, else
    the recorded names that read most like it."""
    if store.history(name, limit=1):
        return name
    ids = [c for c in store.case_ids() if c.startswith(name) and store.history(c, limit=1)]
    if len(ids) == 1:
        return ids[0]
    # several: their workloads first (a name cut short), then the cases themselves
    near = [*dict.fromkeys(c.partition("[")[0] for c in ids), *ids][:3]
    near = near if ids else store.nearest_cases(name)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise StoreError(f"{db}: no case or workload {name!r}{hint}")


def one_case_of(store: Store, db: Database, name: str) -> str:
    """The one case `name` names, as `history` reads it (`series_of`): a case id, a
    workload name with one case, a unique prefix. StoreError for a workload of several
    cases, naming them."""
    series = series_of(store, db, name)
    ids = [
        c
        for c in store.case_ids()
        if (c == series or c.startswith(f"{series}[")) and store.history(c, limit=1)
    ]
    if len(ids) > 1:
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        raise StoreError(
            f"{db}: workload {name!r} has {len(ids)} cases; did you mean "
            f"{', '.join(ids[:3])}{more}?"
        )
    return ids[0] if ids else series


def repository_of(config: Config) -> str | None:
    """The working tree's repository, whose history a command reads (`Store.repository`)."""
    from memtrack.machine.provenance import repository_identity

    return repository_identity(config.root, config.repository)


def rich_console(**kwargs: Any) -> Any:
    """A rich console; wide when not a terminal, so CI logs keep whole case ids."""
    from rich.console import Console

    console = Console(**kwargs)
    if not console.is_terminal and "width" not in kwargs:
        console.width = 200
    return console


def check_json_folder(json_path: Path) -> None:
    """Refuse, before measuring, a --json path that cannot be written (a missing folder is
    not made: a typo must not plant folders anywhere) or has no room."""
    problem = output_problem(json_path) or room_problem(json_path)
    if problem:
        raise ConfigError(f"--json {json_path}: {problem}")


def progress_echo(verb: str, plain: bool) -> Callable[[str, Any, Any], None]:
    """A suite's progress as lines on stderr: '{verb} CASE ...' at each start where `plain`
    (CI, or not a terminal), and each case's status and time when it is done."""

    def progress(event: str, case: Any, m: Any) -> None:
        if event == "start" and plain:
            click.echo(f"{verb} {case.case_id} ...", err=True)
        elif event == "done":
            why = f": {failure_line(m.message)}" if m.status != "ok" and m.message else ""
            click.echo(f"  {m.status:8} {case.case_id} ({m.duration_s:.1f} s){why}", err=True)

    return progress


def failure_line(message: str, limit: int = 200) -> str:
    """A failed case's reason on one line: its message's last line, secrets redacted (it is
    shown before the run is), control characters shown, cut to `limit` characters."""
    from memtrack.escape import terminal_text
    from memtrack.records.redact import redact

    lines = message.strip().splitlines() or [""]
    line = terminal_text(redact(lines[-1]) or "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def plain_output() -> bool:
    """Progress as plain lines: in CI, or where stderr is not a terminal."""
    return os.environ.get("CI") == "true" or not rich_console(stderr=True).is_terminal


def fail_on(failures: tuple[str, ...] | list[str]) -> None:
    """What could not be written, as one error (exit 2), after the run was shown."""
    if failures:
        raise StoreError("; ".join(failures))
