"""Recording a run: measured, redacted, then written to the database and to its JSON record,
each whatever became of the other, and kept in a fallback file where both fail. One sequence
for `memtrack run`, `estimate` and `plan`: a measured run is never lost."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memtrack.errors import MemtrackError
from memtrack.records import RunRecord, write_fallback, write_json
from memtrack.records.redact import redact_run
from memtrack.store.database import Store, describe_failure


@dataclass(frozen=True)
class Recorded:
    """A run as it was recorded."""

    record: RunRecord
    """The run, secrets redacted: what was written and what is shown."""
    saved: tuple[str, ...]
    """Where it was written (the database's path, the JSON record's, a fallback file's)."""
    failures: tuple[str, ...]
    """What could not be written, one line each (with where the run is kept instead)."""


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
    return Recorded(record, tuple(saved), tuple(failures))


def save_run(
    record: RunRecord, store: Store | None, json_path: Path | None
) -> tuple[list[str], list[str]]:
    """Write the database first, then the JSON record, each whatever became of the other.
    A run written nowhere (the database locked past its timeout, full, damaged or deleted
    by a workload, and no JSON record) is kept in a fallback file: a measured run is never
    lost. Returns where the run was saved, and what failed (one line each)."""
    saved, failures = [], []
    if store:
        try:
            store.write_run(record)
            saved.append(str(store.path))
        except MemtrackError as exc:
            failures.append(str(exc))
        except (OSError, sqlite3.Error) as exc:  # whatever broke, the run is kept below
            failures.append(describe_failure(exc, store.path))
        except Exception as exc:  # a server's driver error the store did not word
            failures.append(f"{store.path}: {type(exc).__name__}: {exc}".splitlines()[0])
    if json_path:
        try:
            write_json(record, json_path)
            saved.append(str(json_path))
        except OSError as exc:
            failures.append(describe_failure(exc, json_path))
    if failures and saved and store and str(store.path) not in saved:
        failures.append(f"the run is kept in {saved[0]}: `memtrack ingest {saved[0]}` records it")
    elif failures and not saved:
        places = (store.path if store else None, json_path)
        folders = [p.parent for p in places if isinstance(p, Path)]
        try:
            kept = write_fallback(record, [*folders, Path.cwd(), Path(tempfile.gettempdir())])
        except OSError as exc:
            failures.append(
                f"the run could not be kept anywhere either ({describe_failure(exc, None)})"
            )
        else:
            saved.append(str(kept))
            failures.append(f"the run is kept in {kept}: `memtrack ingest {kept}` records it")
    return saved, failures


__all__ = ["Recorded", "record_run", "save_run"]
