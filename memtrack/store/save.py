"""Recording a run: measured, redacted, then written to the database and to its JSON record,
each whatever became of the other, and kept in the spool (memtrack.store.spool) where both
fail. One sequence for `memtrack run`, `estimate` and `plan`: a measured run is never lost.

`memtrack run` holds no connection while it measures (`record_to` opens the database once
the run is measured): a server's restart, a failover or an idle-session reaper during an
hour of measuring changes nothing, and a write that meets one is tried again
(memtrack.store.server.retrying) before the run is spooled."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memtrack.errors import MemtrackError, StoreError
from memtrack.records import RunRecord, write_fallback, write_json
from memtrack.records.redact import redact_run
from memtrack.store import spool
from memtrack.store.database import Store, describe_failure
from memtrack.store.url import Database, ServerUrl


@dataclass(frozen=True)
class Recorded:
    """A run as it was recorded."""

    record: RunRecord
    """The run, secrets redacted: what was written and what is shown."""
    saved: tuple[str, ...]
    """Where it was written (the database's path, the JSON record's, a fallback file's)."""
    failures: tuple[str, ...]
    """What could not be written, one line each (with where the run is kept instead)."""
    said: tuple[str, ...] = ()
    """What became of the runs the spool kept for the database, one line each."""


def record_run(
    measure: Callable[[], RunRecord], store: Store | None, json_path: Path | None
) -> Recorded:
    """Measure a run and record it: the store's writability first (before an hour of
    measuring, not after), then `measure()`, secrets out of everything the run holds
    (subject, variables, messages) before it is stored, written or shown, then `save_run`."""
    if store is not None:
        store.check_writable()
    record = redact_run(measure())
    saved, failures = save_run(record, store, json_path)
    said = spool.drain(store, store.path) if store and str(store.path) in saved else []
    return Recorded(record, tuple(saved), tuple(failures), tuple(said))


def record_to(record: RunRecord, db: Database, json_path: Path | None) -> Recorded:
    """`save_run` into the database `db` names, opened now (a server's connection waited
    for while it restarts or is full) and closed again; what the spool kept for it is
    recorded too, once the run is."""
    from memtrack.store.opening import open_store

    try:
        store = open_store(db)
    except StoreError as exc:
        saved, failures = save_run(record, None, json_path)
        kept, said = _keep(record, db, json_path)
        return Recorded(record, (*saved, *kept), (str(exc), *failures, said))
    with store:
        saved, failures = save_run(record, store, json_path)
        drained = spool.drain(store, db) if str(store.path) in saved else []
    return Recorded(record, tuple(saved), tuple(failures), tuple(drained))


def save_run(
    record: RunRecord, store: Store | None, json_path: Path | None
) -> tuple[list[str], list[str]]:
    """Write the database first (a server's write that meets a restart tried again on a new
    connection), then the JSON record, each whatever became of the other. A run written
    nowhere (the database down, locked past its timeout, full, damaged or deleted by a
    workload, and no JSON record) is kept: a server's in its spool, a file's beside it. A
    measured run is never lost. Returns where the run was saved, and what failed (one line
    each)."""
    saved, failures = [], []
    if store:
        try:
            _write(store, record)
            saved.append(str(store.path))
        except MemtrackError as exc:
            failures.append(str(exc))
        except (OSError, sqlite3.Error) as exc:  # whatever broke, the run is kept below
            failures.append(describe_failure(exc, store.path))
        except Exception as exc:  # a server's driver error the store did not word
            failures.append(f"{store.path}: {type(exc).__name__}: {exc}".splitlines()[0])
        except BaseException:  # interrupted (a CI job cancelled while a server was waited for)
            _keep(record, store.path, json_path)
            raise
    if json_path:
        try:
            write_json(record, json_path)
            saved.append(str(json_path))
        except OSError as exc:
            failures.append(describe_failure(exc, json_path))
    if failures and store and isinstance(store.path, ServerUrl) and str(store.path) not in saved:
        kept, said = _keep(record, store.path, json_path)  # its spool: the next write drains it
        saved += kept
        failures.append(said)
    elif failures and saved and store and str(store.path) not in saved:
        failures.append(f"the run is kept in {saved[0]}: `memtrack ingest {saved[0]}` records it")
    elif failures and not saved:
        saved, said = _keep(record, store.path if store else None, json_path)
        failures.append(said)
    return saved, failures


def _write(store: Store, record: RunRecord) -> None:
    """The run into the store; on a server, tried again on a new connection while the
    server restarts, fails over or is full (memtrack.store.server.retrying)."""
    if not isinstance(store.path, ServerUrl):
        store.write_run(record)
        return
    from memtrack.errors import TransientStoreError
    from memtrack.store.server import ServerStore, retrying

    assert isinstance(store, ServerStore)
    lost = False

    def attempt() -> None:
        nonlocal lost
        if lost:
            store.reconnect()
        try:
            store.write_run(record)
        except TransientStoreError:
            lost = True
            raise

    retrying(attempt, store.path)


def _keep(record: RunRecord, db: Database | None, json_path: Path | None) -> tuple[list[str], str]:
    """Keep a run written nowhere: a server's in its spool (drained by the next command that
    writes the database), a file's beside it (a database file lives and goes with its
    folder), else beside its JSON record, the working directory or the temporary folder.
    Where it went, and the line that says so."""
    if isinstance(db, ServerUrl):
        try:
            kept = spool.keep(record, db)
        except OSError:
            pass  # beside the database or the record instead
        else:
            return [str(kept)], (
                f"the run is kept in {kept}: the next `memtrack run`, `check` or `ingest` "
                f"that writes {db} records it (or `memtrack ingest {kept}`)"
            )
    places = [p.parent for p in (db, json_path) if isinstance(p, Path)]
    try:
        kept = write_fallback(record, [*places, Path.cwd(), Path(tempfile.gettempdir())])
    except OSError as exc:
        return [], f"the run could not be kept anywhere either ({describe_failure(exc, None)})"
    return [str(kept)], f"the run is kept in {kept}: `memtrack ingest {kept}` records it"


__all__ = ["Recorded", "record_run", "record_to", "save_run"]
