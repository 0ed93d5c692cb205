"""Options and helpers shared by several commands."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from memtrack.config import Config, load_config
from memtrack.errors import ConfigError, MemtrackError
from memtrack.files import output_problem
from memtrack.records import RunRecord, write_fallback, write_json
from memtrack.store.database import Store, describe_failure, room_problem

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="memtrack.toml or pyproject.toml (default: found from the current directory; "
    "without one, the shipped example suite).",
)
db_option = click.option(
    "--db",
    "db_path",
    envvar="MEMTRACK_DB",
    type=click.Path(path_type=Path, dir_okay=False),
    help="SQLite database (default: $MEMTRACK_DB, else the config's `database`, data/memtrack.db).",
)


def resolve(config_path: Path | None, db_path: Path | None) -> tuple[Config, Path]:
    config = load_config(config_path)
    return config, db_path or config.database


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


def save_run(
    record: RunRecord, store: Store | None, json_path: Path | None
) -> tuple[list[str], list[str]]:
    """Write the database first, then the JSON record, each whatever became of the other.
    A run written nowhere (the database locked past its timeout, full, damaged or deleted
    by a workload, and no JSON record) is kept in a fallback file: a measured run is never
    lost. Returns where the run was saved, and what failed (one line each)."""
    saved, failures = [], []
    if store:
        try:
            store.write_run(record)
            saved.append(str(store.path))
        except MemtrackError as exc:
            failures.append(str(exc))
    if json_path:
        try:
            write_json(record, json_path)
            saved.append(str(json_path))
        except OSError as exc:
            failures.append(describe_failure(exc, json_path))
    if failures and saved and store and str(store.path) not in saved:
        failures.append(f"the run is kept in {saved[0]}: `memtrack ingest {saved[0]}` records it")
    elif failures and not saved:
        folders = [p.parent for p in (store.path if store else None, json_path) if p]
        try:
            kept = write_fallback(record, [*folders, Path.cwd(), Path(tempfile.gettempdir())])
        except OSError as exc:
            failures.append(
                f"the run could not be kept anywhere either ({describe_failure(exc, None)})"
            )
        else:
            saved.append(str(kept))
            failures.append(f"the run is kept in {kept}: `memtrack ingest {kept}` records it")
    return saved, failures
