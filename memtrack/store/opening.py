"""Opening the history wherever it lives: `open_store(db)` opens an SQLite file (a path) or a
PostgreSQL database (a `ServerUrl`), each as its own `Store`; every command opens it here."""

from __future__ import annotations

from pathlib import Path

from memtrack.store import database
from memtrack.store.database import ALL_REPOSITORIES, Store
from memtrack.store.url import Database, ServerUrl

last_server: ServerUrl | None = None
"""The server database this process opened last: the CLI names it when a driver error
escapes (its password hidden)."""


def open_store(
    db: Database,
    *,
    readonly: bool = False,
    create: bool = True,
    older: bool = False,
    repository: str | None = ALL_REPOSITORIES,
) -> Store:
    """The database `db` names, opened as `Store.open` opens a file: read-only for viewers,
    created (the file, or the schema on an empty server database) when `create`, an older
    schema read as it is with `older`; its history read as `repository`'s
    (`Store.repository`). Raises StoreError."""
    store: Store
    if isinstance(db, ServerUrl):
        from memtrack.store.server import ServerStore

        global last_server
        database.last_path, last_server = None, db
        store = ServerStore.open_server(db, readonly=readonly, create=create, older=older)
    else:
        store = Store.open(Path(db), readonly=readonly, create=create, older=older)
    store.repository = repository
    return store


__all__ = ["open_store"]
