from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve
from memtrack.records.redact import secret_values
from memtrack.store.ingest import read_runs
from memtrack.store.opening import open_store


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@config_option
@db_option
def ingest(files: tuple[Path, ...], config_path: Path | None, db_path: Path | None) -> None:
    """Merge JSON run records into the database, all or none.

    Every file is read and checked, and all runs are written in one transaction: one bad
    file and nothing is written. A run id already stored with the same content is skipped;
    with different content it is an error. Secrets in a record's free text (messages,
    subject, variables, CI fields) are redacted, as `memtrack run` does.
    """
    _, db = resolve(config_path, db_path, writes=True)
    secrets = secret_values()  # once: this machine's secret variables, for every record
    with read_runs(files, secrets, db) as runs:
        if isinstance(db, Path) and not db.exists():
            # Every record is read and checked before a new database is made: a refused
            # batch makes none, and no file that another process may have opened meanwhile
            # (a `memtrack run` starting) is ever removed.
            runs = iter(list(runs))
        with open_store(db) as store:
            added, present = store.write_runs(runs)
    click.echo(f"{added} run(s) added, {present} already present, in {db}")
