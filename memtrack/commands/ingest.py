from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import config_option, db_option, resolve
from memtrack.records.redact import secret_values
from memtrack.store import spool
from memtrack.store.ingest import discard, private_path, publish, read_runs
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
    counts = None
    if isinstance(db, Path) and not db.exists():
        # A new database is written as a file of this process's own beside it, the records
        # streaming into it from the readers, and put in place only once every one was
        # read, checked and written: a refused batch makes none, and no file that another
        # process may have opened meanwhile (a `memtrack run` starting) is ever removed.
        fresh = private_path(db)
        try:
            with read_runs(files, secrets, db) as runs, open_store(fresh) as store:
                counts = store.write_runs(runs)
            if not publish(fresh, db):
                counts = None  # made meanwhile: the records go into that one
        finally:
            discard(fresh)
    if counts is None:
        with read_runs(files, secrets, db) as runs, open_store(db) as store:
            counts = store.write_runs(runs)
    added, present = counts
    click.echo(f"{added} run(s) added, {present} already present, in {db}")
    if spool.pending(db):  # runs kept while the database could not take them
        with open_store(db) as store:
            for line in spool.drain(store, db):
                click.echo(line)
