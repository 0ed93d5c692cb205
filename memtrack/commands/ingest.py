from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve
from memtrack.records import read_json
from memtrack.store import Store


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@config_option
@db_option
def ingest(files, config_path, db_path) -> None:
    """Merge JSON run records into the database (a run id already there is skipped)."""
    _, db = resolve(config_path, db_path)
    records = [read_json(f) for f in files]  # all parsed before anything is written
    added = 0
    with Store.open(db) as store:
        for record in records:
            added += store.write_run(record)
    click.echo(f"{added} run(s) added, {len(records) - added} already present, in {db}")
