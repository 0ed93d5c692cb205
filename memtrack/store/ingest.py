"""Run record files read for `memtrack ingest`: each one read, checked, redacted and made into
the store's rows, by forked reader processes where the machine has the cores, in the files'
order. The store then writes them in one transaction, as it writes records read here.

Reading is most of an ingest (JSON, every value checked, secrets searched); the rows cost
the writer a fraction of that. A reader is a fork of this process: it has every module it
needs, and it touches no database (the readers start before the store is opened). Elsewhere
than Linux, on one core, or for a few files, the files are read in this process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from memtrack.errors import MemtrackError, RecordError
from memtrack.records import RunRecord, read_all, read_json
from memtrack.records.redact import redact_run
from memtrack.records.validate import bad_files
from memtrack.store.database import Store
from memtrack.store.opening import open_store
from memtrack.store.rows import Prepared, RowMaker
from memtrack.store.url import Database

CHUNK = 32
"""Files a reader reads and sends back at once."""
PIPE_BYTES = 2**20
"""Each reader's pipe: it runs ahead of the writer by what the pipe holds (a few chunks of
rows) and then waits, so memory stays flat however many files there are."""

_rows = RowMaker()  # in each reader: the last environment's id, kept across its chunks


def readers(files: int) -> int:
    """How many reader processes `files` files are read with; 0: in this process."""
    if sys.platform != "linux":
        return 0  # fork is Linux's own here: elsewhere system libraries may not survive it
    cores = len(os.sched_getaffinity(0))
    return min(cores, files // CHUNK) if cores > 1 else 0


def _read(paths: list[Path], secrets: tuple[str, ...], store: Store | None) -> list[Prepared | str]:
    """In a reader: each file as a Prepared without its `record` (not sent: it is made back
    where needed), or the one-line reason it is refused. A run already in `store` is
    compared with it here, where the cores are."""
    out: list[Prepared | str] = []
    for path in paths:
        try:
            run = _record(path, secrets)
        except RecordError as exc:
            out.append(str(exc))
            continue
        if store is not None and _holds(store, run):
            out.append(Prepared(run.run_id, None, _no_record, same_as_stored=True))
        else:
            out.append(Prepared(run.run_id, _rows(run), _no_record))
    return out


def _holds(store: Store, run: RunRecord) -> bool:
    try:
        return store.holds(run)
    except MemtrackError:
        return False  # a stored run this reader cannot read: the writer tells why


def _no_record() -> RunRecord:
    raise AssertionError("a reader's Prepared gets its record where it is received")


def _record(path: Path, secrets: tuple[str, ...]) -> RunRecord:
    return redact_run(read_json(path), values=secrets)


@contextlib.contextmanager
def read_runs(
    paths: Iterable[Path], secrets: tuple[str, ...], db: Database, *, jobs: int | None = None
) -> Iterator[Iterator[RunRecord | Prepared]]:
    """The records of `paths`, redacted of `secrets`, for `Store.write_runs` into `db`:
    every file is read even after a bad one, and then RecordError names the first, as
    `read_all` does. `jobs`: reader processes (default `readers`; 0: none). They live as
    long as the context: leaving it ends them. Call it where this process runs no other
    thread, as a fork needs."""
    files = list(paths)
    jobs = readers(len(files)) if jobs is None else jobs
    if not jobs:
        yield (redact_run(r, values=secrets) for r in read_all(files))
        return
    chunks = [files[i : i + CHUNK] for i in range(0, len(files), CHUNK)]
    pids: list[int] = []
    pipes: list[BinaryIO] = []
    collecting = gc.isenabled()
    try:
        gc.disable()  # rows die by their reference counts: a collection would only cost time
        gc.freeze()  # and the readers share this process's objects; a collection copies them
        for k in range(jobs):
            pids.append(_fork_reader(chunks[k::jobs], secrets, db, pipes))
        yield _in_order(chunks, pipes, secrets)
    finally:
        for pipe in pipes:
            pipe.close()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # done already, or its rows are not wanted
            os.waitpid(pid, 0)
        gc.unfreeze()
        if collecting:
            gc.enable()


def private_path(db: Path) -> Path:
    """A file of this process's own beside `db`, for a new database written before it is
    put in place (`publish`)."""
    return db.with_name(f".{db.name}.{os.getpid()}.new")


def publish(fresh: Path, db: Path) -> bool:
    """Put the closed database `fresh` at `db` by a hard link, which never replaces a file:
    False (nothing changed) where `db` was made meanwhile by another process."""
    try:
        os.link(fresh, db)
    except FileExistsError:
        return False
    return True


def discard(fresh: Path) -> None:
    """Remove a private database and the files SQLite keeps beside it."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{fresh}{suffix}")


def _fork_reader(
    chunks: list[list[Path]], secrets: tuple[str, ...], db: Database, pipes: list[BinaryIO]
) -> int:
    """Start a reader of `chunks`, which writes each chunk's results to a new pipe, appended
    to `pipes`, as a length and a pickle; its pid. It opens `db` read-only, where it exists,
    to compare the runs already stored."""
    r, w = os.pipe()
    with contextlib.suppress(OSError):  # a larger pipe: a reader runs ahead of the writer
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    pid = os.fork()
    if pid == 0:  # the reader: it leaves only by os._exit, which runs no parent's clean-up
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent is told and ends it
            gc.disable()  # its objects die by their reference counts: a collection is only time
            os.close(r)
            for pipe in pipes:
                pipe.close()
            store = None
            if isinstance(db, Path) and db.is_file():
                with contextlib.suppress(MemtrackError):  # the writer compares them instead
                    store = open_store(db, readonly=True)
            with open(w, "wb") as out:
                for chunk in chunks:
                    results = _read(chunk, secrets, store)
                    blob = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
                    out.write(len(blob).to_bytes(8, "little"))
                    out.write(blob)
            code = 0
        except BrokenPipeError:
            code = 0  # the parent stopped reading: its own error is the one to tell
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    pipes.append(open(r, "rb"))  # noqa: SIM115 (closed by read_runs)
    return pid


def _in_order(
    chunks: list[list[Path]], pipes: list[BinaryIO], secrets: tuple[str, ...]
) -> Iterator[Prepared]:
    errors: list[str] = []
    for i, chunk in enumerate(chunks):
        pipe = pipes[i % len(pipes)]
        head = pipe.read(8)
        blob = pipe.read(int.from_bytes(head, "little")) if len(head) == 8 else b""
        if not blob:
            raise RecordError(f"{chunk[0]}: its reader process ended before reading it")
        for path, result in zip(chunk, pickle.loads(blob), strict=True):
            if isinstance(result, str):
                errors.append(result)
            elif not errors:
                yield result._replace(record=functools.partial(_record, path, secrets))
    if errors:
        raise bad_files(errors)
