"""`memtrack backup` and `memtrack export`: keep the history safe, or portable."""

from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve
from memtrack.store import maintenance
from memtrack.store.opening import open_store
from memtrack.store.url import ServerUrl
from memtrack.units import format_size


@click.command()
@click.argument("dest", type=click.Path(path_type=Path))
@config_option
@db_option
@click.option("--overwrite", is_flag=True, help="Replace DEST if it exists.")
def backup(dest: Path, config_path: Path | None, db_path: Path | None, overwrite: bool) -> None:
    """Copy the database to DEST (a file, or a directory for a time-stamped name).

    The copy is one consistent snapshot, safe to take while a run is being recorded. A
    server's database (postgresql://) is copied into an SQLite file, verified row for row:
    a snapshot anyone can open with `memtrack dashboard --db FILE`.
    """
    _, db = resolve(config_path, db_path)
    if isinstance(db, ServerUrl):
        with open_store(db, readonly=True) as source:
            result = maintenance.backup_server(source, dest, overwrite=overwrite)
    else:
        result = maintenance.backup(db, dest, overwrite=overwrite)
    size = format_size(result.size_bytes)
    click.echo(f"{result.runs} run(s), {size}, backed up to {result.path}")


@click.command(name="export")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@config_option
@db_option
@click.option(
    "--since", help="Only runs started at or after this date or time (UTC), e.g. 2026-01-31."
)
def export(
    directory: Path, config_path: Path | None, db_path: Path | None, since: str | None
) -> None:
    """Write every run as a JSON record DIRECTORY/<run_id>.json.

    `memtrack ingest DIRECTORY/*.json` rebuilds a database from them.
    """
    _, db = resolve(config_path, db_path)
    moment = maintenance.parse_since(since) if since else None
    with open_store(db, readonly=True) as store:
        written = maintenance.export_runs(store, directory, since=moment)
    click.echo(f"{len(written)} run(s) exported to {directory}")
