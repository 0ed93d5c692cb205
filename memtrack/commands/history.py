from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import (
    config_option,
    db_option,
    repository_of,
    resolve,
    rich_console,
    series_of,
)
from memtrack.config import MAX_COUNT
from memtrack.report.run import history_table
from memtrack.store.opening import open_store


@click.command()
@click.argument("case")
@config_option
@db_option
@click.option(
    "-n",
    "--limit",
    default=20,
    show_default=True,
    type=click.IntRange(min=1, max=MAX_COUNT),
    help="How many rows.",
)
@click.option("--branch", help="Only runs on this branch.")
def history(
    case: str, config_path: Path | None, db_path: Path | None, limit: int, branch: str | None
) -> None:
    """Show a workload's (or one case's) series, newest first.

    CASE is a workload name, a whole case id, or a prefix of one case's id.
    """
    config, db = resolve(config_path, db_path)
    with open_store(db, readonly=True, repository=repository_of(config)) as store:
        rows = store.history(case, limit=limit, branch=branch)
        if not rows:
            case = series_of(store, db, case)
            rows = store.history(case, limit=limit, branch=branch)
    if not rows:
        click.echo(f"no measurements of {case!r} on branch {branch!r} in {db}", err=True)
        return
    rich_console().print(history_table(case, rows))
