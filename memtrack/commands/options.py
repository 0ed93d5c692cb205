"""Options and helpers shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from memtrack.config import Config, load_config

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
    help="SQLite database (default: $MEMTRACK_DB, else the config's `database`, "
    "data/memtrack.db).",
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
