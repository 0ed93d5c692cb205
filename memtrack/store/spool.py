"""Runs that could not be recorded, kept outside the checkout until they can be.

A run measured while a server's database could not be written (the server down past its
retry window, or refusing the write) is kept as its JSON record in the spool: a folder of
the user's cache (`$XDG_CACHE_HOME/memtrack/spool`, else `~/.cache/memtrack/spool`;
`$MEMTRACK_SPOOL` names another, as the generated workflow does with the runner's tool
cache), one subfolder per database. Never the working directory: on a self-hosted runner
the next checkout (`clean: true`) deletes what is there. Every later `run`, `ingest` and
`check` that writes that database records what the spool holds for it (`drain`): each run
once (a run already recorded is skipped), each file removed once its run is recorded.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from memtrack.errors import MemtrackError
from memtrack.records import RunRecord, read_json, write_fallback
from memtrack.store.database import Store
from memtrack.store.url import Database, ServerUrl


def root() -> Path:
    """The spool's folder: $MEMTRACK_SPOOL, else the user's cache's memtrack/spool."""
    named = os.environ.get("MEMTRACK_SPOOL")
    if named:
        return Path(named).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "memtrack" / "spool"


def folder(db: ServerUrl) -> Path:
    """The spool's folder for one server's database: named by a digest of its URL as it is
    shown (its password hidden)."""
    return root() / hashlib.sha256(str(db).encode()).hexdigest()[:16]


def keep(record: RunRecord, db: ServerUrl) -> Path:
    """Keep a run in the database's spool folder (made as needed). Raises OSError."""
    where = folder(db)
    where.mkdir(parents=True, exist_ok=True)
    return write_fallback(record, [where])


def pending(db: Database) -> bool:
    """Whether the spool keeps a run for `db` (never for a file: its runs are kept beside
    it)."""
    if not isinstance(db, ServerUrl):
        return False
    try:
        return any(folder(db).glob("memtrack-run-*.json"))
    except OSError:
        return False


def drain(store: Store, db: Database) -> list[str]:
    """Record every run the spool keeps for `db` into `store`, oldest file first, and remove
    each once recorded (or found recorded already); one line said per file, a file that
    cannot be read or written left where it is, named. Nothing for a file: its runs are
    kept beside it."""
    said: list[str] = []
    if not isinstance(db, ServerUrl):
        return said
    try:
        kept = sorted(folder(db).glob("memtrack-run-*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return said
    for path in kept:
        try:
            run = read_json(path)
            added = store.write_run(run)
            path.unlink()
        except (MemtrackError, OSError) as exc:
            said.append(f"{path}: kept in the spool, not recorded yet: {exc}")
            continue
        how = "recorded" if added else "already recorded"
        said.append(f"run {run.run_id} kept in the spool since it was measured: {how}")
    return said


__all__ = ["drain", "folder", "keep", "pending", "root"]
