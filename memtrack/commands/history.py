from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import (
    config_option,
    db_option,
    repository_of,
    resolve,
    rich_console,
)
from memtrack.config import MAX_COUNT
from memtrack.errors import StoreError
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

    CASE is a workload name or a whole case id, matched literally.
    """
    config, db = resolve(config_path, db_path)
    with open_store(db, readonly=True, repository=repository_of(config)) as store:
        rows = store.history(case, limit=limit, branch=branch)
        if not rows and (not branch or not store.history(case, limit=1)):
            near = store.nearest_cases(case)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise StoreError(f"{db}: no case or workload {case!r}{hint}")
    if not rows:
        click.echo(f"no measurements of {case!r} on branch {branch!r} in {db}", err=True)
        return
    rich_console().print(history_table(case, rows))
