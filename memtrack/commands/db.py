"""`memtrack db copy SRC DST`: move a history between databases (an SQLite file and a
PostgreSQL server, either way), verified row for row."""

from __future__ import annotations

from pathlib import Path

import click

from memtrack.commands.options import DatabaseParam
from memtrack.errors import StoreError
from memtrack.store import maintenance
from memtrack.store.opening import open_store
from memtrack.store.url import Database, ServerUrl, present


@click.group()
def db() -> None:
    """Work on a database as a whole."""


@db.command()
@click.argument("src", type=DatabaseParam())
@click.argument("dst", type=DatabaseParam())
def copy(src: Database, dst: Database) -> None:
    """Copy the whole history of SRC into DST, then verify it row for row.

    SRC and DST are SQLite files or postgresql:// URLs (a password is better left to
    PGPASSWORD or PGPASSFILE than written on a command line). DST is an empty database (a
    new file, or a server's database without memtrack's tables); its schema is made, every
    table copied as it is (ids and times kept) in one transaction, and then read back and
    compared with SRC's, value for value. To merge runs into a database that holds some,
    use `memtrack export` and `memtrack ingest`.
    """
    if _same(src, dst):
        raise StoreError(f"{dst}: is the source itself; nothing copied")
    if not present(src):
        raise StoreError(f"{src}: no such database")
    if isinstance(dst, Path) and not dst.exists():
        # a new file is made whole beside DST and moved into place: a full disk or an
        # interrupt leaves no DST at all, not an empty one that a second try would refuse
        if not dst.parent.is_dir():
            raise StoreError(f"{dst}: no such folder {dst.parent}")
        needs = 0 if isinstance(src, ServerUrl) else src.stat().st_size
        with open_store(src, readonly=True) as source:
            done = maintenance.copy_history_to_file(source, dst, needs)
    else:
        with open_store(src, readonly=True) as source, open_store(dst) as target:
            done = maintenance.copy_history(source, target)
    rows = ", ".join(f"{n:,} {table}" for table, n in done.rows.items())
    click.echo(f"copied {src} to {dst}, verified row for row: {rows}")


def _same(a: Database, b: Database) -> bool:
    if isinstance(a, ServerUrl) or isinstance(b, ServerUrl):
        return isinstance(a, ServerUrl) and isinstance(b, ServerUrl) and a.url == b.url
    return a.resolve() == b.resolve()
