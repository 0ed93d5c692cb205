"""Faults a CI machine meets: a full disk, a read-only or corrupted database, a read-only file
system, a workload that deletes the database. Each is one line naming the thing, exit
status 2 (1 means only "a verdict blocks"), and nothing half-written left behind.

A full disk is made with RLIMIT_FSIZE in the memtrack process, which works without root:
writes past the limit fail with EFBIG (SIGXFSZ ignored), as they fail with ENOSPC on a full
file system.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import processes
import pytest
from factories import committed, make_measurement, make_run

from memtrack.records import write_json
from memtrack.store.database import Store

KiB = 1024


def memtrack(
    *args: str, fsize: int | None = None, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a real process; with `fsize`, no file may grow past that many bytes.

    Such a process writes no bytecode: the limit would cut short a `.pyc` that Python writes
    for a module the checkout has not compiled yet (importlib does not check for a short
    write), and every later process importing that module would fail on it."""

    def limit() -> None:
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))

    no_bytecode = {"PYTHONDONTWRITEBYTECODE": "1"} if fsize is not None else {}
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        cwd=cwd,
        env={**os.environ, **no_bytecode, **(env or {})},
        timeout=300,
    )


def _error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("memtrack: error: "), res.stderr
    return lines[-1]


def _seed(db: Path, n: int = 3) -> list[str]:
    runs = [make_run([make_measurement("decoder", {"batch": b}) for b in (1, 8)]) for _ in range(n)]
    with Store.open(db) as store:
        store.write_runs(runs)
    return [r.run_id for r in runs]


def _intact(db: Path, runs: int) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
        assert conn.execute("select count(*) from runs").fetchone()[0] == runs
    finally:
        conn.close()


def _records(folder: Path, n: int) -> list[str]:
    folder.mkdir()
    for i in range(n):
        write_json(
            make_run([make_measurement("decoder", {"batch": b}) for b in (1, 8)]),
            folder / f"{i}.json",
        )
    return [str(p) for p in sorted(folder.glob("*.json"))]


# -- a full disk ---------------------------------------------------------------------------


def test_ingest_onto_a_full_disk_says_so_and_keeps_the_database(tmp_path):
    db = tmp_path / "m.db"
    _seed(db)
    files = _records(tmp_path / "in", 300)
    res = memtrack("ingest", "--db", str(db), *files, fsize=db.stat().st_size + 64 * KiB)
    line = _error_line(res)
    assert "disk full" in line and str(db) in line
    assert "rollback" not in line
    _intact(db, 3)


def test_backup_onto_a_full_disk_leaves_no_copy_or_journal(tmp_path):
    db = tmp_path / "m.db"
    _seed(db, 20)
    dest = tmp_path / "backups"
    dest.mkdir()
    res = memtrack("backup", str(dest / "copy.db"), "--db", str(db), fsize=db.stat().st_size // 2)
    assert "disk full" in _error_line(res)
    assert list(dest.iterdir()) == []
    _intact(db, 20)


def test_db_copy_onto_a_full_disk_leaves_no_destination(tmp_path):
    """A copy that cannot be written leaves no DST at all: an empty file there would be
    refused by the next try as a database that is not empty, or opened as a history."""
    db = tmp_path / "m.db"
    _seed(db, 20)
    dest = tmp_path / "copies"
    dest.mkdir()
    for fsize in (db.stat().st_size // 2, db.stat().st_size - KiB):
        res = memtrack("db", "copy", str(db), str(dest / "copy.db"), fsize=fsize)
        line = _error_line(res)
        assert "disk full" in line and str(dest / "copy.db") in line, line
        assert list(dest.iterdir()) == []
    _intact(db, 20)
    done = memtrack("db", "copy", str(db), str(dest / "copy.db"))
    assert done.returncode == 0, done.stderr
    _intact(dest / "copy.db", 20)
    assert [p.name for p in dest.iterdir()] == ["copy.db"]


def _held_open(db: Path) -> sqlite3.Connection:
    """Another reader of the database, as on a busy runner: its shared-memory file already
    exists, so only the output under test can meet the size limit."""
    conn = sqlite3.connect(db)
    conn.execute("select count(*) from runs").fetchone()
    return conn


def test_export_onto_a_full_disk_leaves_no_tmp_files(tmp_path):
    db = tmp_path / "m.db"
    _seed(db)
    out = tmp_path / "export"
    with _held_open(db):
        res = memtrack("export", str(out), "--db", str(db), fsize=KiB)
    line = _error_line(res)
    assert "disk full" in line and str(out) in line
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_report_onto_a_full_disk_is_exit_2_not_a_regression(tmp_path):
    db = tmp_path / "m.db"
    (run_id, *_) = _seed(db)
    md = tmp_path / "report.md"
    with _held_open(db):
        res = memtrack(
            "check",
            "--db",
            str(db),
            "--run",
            run_id,
            "--no-record",
            "--markdown",
            str(md),
            fsize=64,
            cwd=tmp_path,
        )
    line = _error_line(res)
    assert "disk full" in line and str(md) in line


TINY = """
import os
import memtrack

if os.environ.get("TINY_IMPORTED"):  # say the suite was imported (discovered)
    open(os.environ["TINY_IMPORTED"], "w").close()

@memtrack.workload(params={"n": 1})
def tiny(ctx):
    doomed = os.environ.get("TINY_DELETES")
    if doomed:
        os.remove(doomed)
    blocked = os.environ.get("TINY_BLOCKS")
    if blocked:
        os.makedirs(blocked)
    filler = os.environ.get("TINY_FILLS")
    if filler:  # fill the file system the database is on
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
            except OSError:
                pass
    breaks = os.environ.get("TINY_BREAKS")
    if breaks:  # break the database's path while the run holds it open
        import subprocess
        subprocess.run(breaks, shell=True, check=True)
    waits = os.environ.get("TINY_WAITS")
    if waits:  # say the case started, then wait until the test has taken its lock
        import pathlib, time
        pathlib.Path(waits + ".started").write_text("")
        deadline = time.monotonic() + 300
        while not pathlib.Path(waits + ".locked").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return lambda: None
"""


@pytest.fixture
def tiny_suite(tmp_path):
    (tmp_path / "wl.py").write_text(TINY)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    committed(tmp_path)
    return tmp_path / "memtrack.toml"


@pytest.mark.slow
def test_run_json_onto_a_full_disk_says_so_and_leaves_no_tmp(tmp_path, tiny_suite):
    out = tmp_path / "out"
    out.mkdir()
    res = memtrack(
        "run",
        "--config",
        str(tiny_suite),
        "--no-db",
        "--json",
        str(out / "run.json"),
        fsize=1 * KiB,
        cwd=tmp_path,
    )
    line = _error_line(res)
    assert "disk full" in line and "run.json" in line
    assert list(out.iterdir()) == []


def test_run_with_its_database_on_a_full_disk_refuses_before_measuring(tmp_path, tiny_suite):
    db = tmp_path / "m.db"
    _seed(db)
    res = memtrack(
        "run", "--config", str(tiny_suite), "--db", str(db), fsize=16 * KiB, cwd=tmp_path
    )
    assert "disk full" in _error_line(res)
    assert "running" not in res.stderr  # no case started
    _intact(db, 3)


@pytest.mark.slow
def test_a_workload_that_deletes_the_database_is_refused_and_the_json_still_written(
    tmp_path, tiny_suite
):
    db = tmp_path / "m.db"
    _seed(db)
    res = memtrack(
        "run",
        "--config",
        str(tiny_suite),
        "--db",
        str(db),
        "--json",
        str(tmp_path / "run.json"),
        cwd=tmp_path,
        env={"TINY_DELETES": str(db)},
    )
    assert "deleted or replaced" in _error_line(res)
    assert (tmp_path / "run.json").is_file()
    assert not db.exists()  # not silently replaced by a new history of one run


# -- outputs checked before the first case -------------------------------------------------


@pytest.mark.parametrize("kind", ["not sqlite", "under a file", "json under a file"])
def test_run_refuses_a_bad_output_before_any_case_starts(tmp_path, tiny_suite, kind):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "text.db").write_text("not a database, but my notes" * 100)
    args = {
        "not sqlite": ["--db", str(tmp_path / "text.db")],
        "under a file": ["--db", str(tmp_path / "file" / "m.db")],
        "json under a file": ["--no-db", "--json", str(tmp_path / "file" / "run.json")],
    }[kind]
    res = memtrack("run", "--config", str(tiny_suite), *args, cwd=tmp_path)
    _error_line(res)
    assert "running" not in res.stderr
    assert (tmp_path / "text.db").read_text() == "not a database, but my notes" * 100


# -- read-only and corrupted databases ------------------------------------------------------


@pytest.fixture
def read_only_file(tmp_path):
    """Makes a file unwritable: chmod for a user, the immutable attribute for root (whom
    permissions do not stop)."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if os.geteuid() == 0:
            if (
                shutil.which("chattr") is None
                or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0
            ):
                pytest.skip("root, and no immutable attribute on this file system")
        else:
            path.chmod(0o444)
        made.append(path)

    yield make
    for path in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=False)


def _as_user() -> list[str]:
    """A command prefix that runs a process without root's power over permissions: a user
    namespace whose one user owns what root owns outside, as a plain user owns their own
    files, with no capability to override a mode. Empty for a user already."""
    if os.geteuid() != 0:
        return []
    prefix = ["unshare", "--map-user=1000", "--map-group=1000"]
    if (
        shutil.which("unshare") is None
        or subprocess.run([*prefix, "true"], capture_output=True).returncode
    ):
        pytest.skip("root, and no user namespace to drop the power over permissions")
    return prefix


def _as_user_memtrack(*args: str, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [*_as_user(), sys.executable, "-m", "memtrack.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.mark.parametrize(
    "how, words",
    [
        ("mv data data.gone && touch data", "Not a directory"),
        ("chmod 000 data", "permission denied"),
        ("rm data/m.db && ln -s m.db data/m.db", "symbolic links"),
    ],
    ids=["folder made a file", "folder unreadable", "symbolic link loop"],
)
def test_a_database_path_broken_mid_run_keeps_the_run_in_a_file(tmp_path, tiny_suite, how, words):
    """Whatever breaks the database's path after the run opened it, the measured run is kept
    in a file the one-line error names, and `memtrack ingest` records it."""
    db = tmp_path / "data" / "m.db"
    db.parent.mkdir()
    _seed(db)
    res = _as_user_memtrack(
        "run",
        "--config",
        str(tiny_suite),
        "--db",
        "data/m.db",
        cwd=tmp_path,
        env={"TINY_BREAKS": how},
    )
    (tmp_path / "data").chmod(0o755)
    line = _error_line(res)
    assert words in line and "data/m.db" in line, line
    kept = _kept(line)
    if not kept.is_absolute():
        kept = tmp_path / kept
    res = memtrack("ingest", str(kept), "--db", str(tmp_path / "new.db"))
    assert res.returncode == 0 and "1 run(s) added" in res.stdout, res.stderr


@pytest.mark.parametrize("command", ["history", "show", "check", "export"])
def test_every_read_command_reads_a_database_it_cannot_write(tmp_path, tiny_suite, command):
    """A runner's cache or a mounted artifact: a 0444 database in a 0555 folder, read by a
    user who may write neither (no -wal or -shm file can be made beside it)."""
    db = tmp_path / "ro" / "m.db"
    db.parent.mkdir()
    run_id = _seed(db)[0]
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    db.chmod(0o444)
    db.parent.chmod(0o555)
    args = {
        "history": ["history", "decoder"],
        "show": ["show", run_id[:8]],
        "check": ["check", "--no-record", "--run", run_id],
        "export": ["export", str(out)],
    }[command]
    try:
        res = _as_user_memtrack(*args, "--db", str(db), cwd=tmp_path)
    finally:
        db.parent.chmod(0o755)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr
    assert "read-only" not in res.stderr
    assert sorted(p.name for p in db.parent.iterdir()) == ["m.db"]  # nothing written beside it
    _intact(db, 3)


def test_a_read_only_database_is_refused_before_measuring_and_at_ingest(
    tmp_path, tiny_suite, read_only_file
):
    db = tmp_path / "m.db"
    _seed(db)
    read_only_file(db)
    files = _records(tmp_path / "in", 2)
    assert "read-only database" in _error_line(memtrack("ingest", "--db", str(db), *files))
    res = memtrack("run", "--config", str(tiny_suite), "--db", str(db), cwd=tmp_path)
    assert "read-only database" in _error_line(res)
    assert "running" not in res.stderr
    # reading it still works
    assert memtrack("history", "decoder", "--db", str(db)).returncode == 0


def _corrupt(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("pragma journal_mode=delete")
    pages = conn.execute("pragma page_count").fetchone()[0]
    conn.close()
    with open(db, "r+b") as f:  # keep page 1 (the schema), scribble over the rest
        f.seek(4096)
        f.write(b"\x07" * 4096 * (pages - 1))


@pytest.mark.parametrize("command", ["history", "show", "check", "backup", "export", "ingest"])
def test_a_corrupted_database_is_named_for_every_command(tmp_path, command):
    db = tmp_path / "m.db"
    (run_id, *_) = _seed(db, 5)
    _corrupt(db)
    args = {
        "history": ["history", "decoder"],
        "show": ["show", run_id],
        "check": ["check", "--run", run_id, "--no-record"],
        "backup": ["backup", str(tmp_path / "copy.db")],
        "export": ["export", str(tmp_path / "out")],
        "ingest": ["ingest", *_records(tmp_path / "in", 1)],
    }[command]
    line = _error_line(memtrack(*args, "--db", str(db), cwd=tmp_path))
    assert "corrupted database" in line and str(db) in line


def test_debug_shows_the_traceback_and_keeps_exit_2(tmp_path):
    db = tmp_path / "m.db"
    _seed(db)
    _corrupt(db)
    res = memtrack("history", "decoder", "--db", str(db), env={"MEMTRACK_DEBUG": "1"})
    assert res.returncode == 2 and "Traceback" in res.stderr
    res = memtrack("--debug", "history", "decoder", "--db", str(db))
    assert res.returncode == 2 and "Traceback" in res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only file system needs root")
def test_a_database_on_a_read_only_file_system_is_read(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here")
    try:
        db = mnt / "m.db"
        _seed(db)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        res = memtrack("history", "decoder", "--db", str(db))
        assert res.returncode == 0, res.stderr
        assert "decoder" in res.stdout
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.slow
def test_a_json_record_that_cannot_be_written_costs_not_the_database_write(tmp_path, tiny_suite):
    db = tmp_path / "m.db"
    _seed(db)
    out = tmp_path / "run.json"
    res = memtrack(
        "run",
        "--config",
        str(tiny_suite),
        "--db",
        str(db),
        "--json",
        str(out),
        cwd=tmp_path,
        env={"TINY_BLOCKS": str(out)},
    )  # a folder appears there
    line = _error_line(res)
    assert str(out) in line
    assert f"recorded in {db}" in res.stdout
    _intact(db, 4)
    assert not (tmp_path / "run.json.tmp").exists()


# -- no room, a lock held too long, a damaged database: no measured run is lost ------------


@pytest.fixture
def small_disk(tmp_path):
    """A file system of 8 MiB of its own (a tmpfs: mounting one needs root, which CI has)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a small file system here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte; returns the filler file."""
    filler = folder / "filler"
    # unbuffered: a buffered file would flush its last partial block on close, onto the
    # full disk, and raise there
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def _kept(line: str) -> Path:
    """The fallback file an error line names: '... the run is kept in PATH: ...'."""
    found = re.search(r"the run is kept in (\S+\.json):", line)
    assert found, line
    return Path(found.group(1))


def test_run_onto_an_already_full_disk_refuses_before_measuring(tmp_path, tiny_suite, small_disk):
    """The up-front test write is rolled back, so it needs no room: a full disk passed it,
    and the whole suite was measured, then lost."""
    db = small_disk / "m.db"
    _seed(db)
    with _held_open(db):  # as on a busy runner: the database's -shm file is there already
        filler = _fill(small_disk)
        res = memtrack("run", "--config", str(tiny_suite), "--db", str(db), cwd=tmp_path)
    line = _error_line(res)
    assert "disk full" in line and str(db) in line
    assert "running" not in res.stderr  # no case started
    filler.unlink()
    _intact(db, 3)


def test_a_json_record_onto_a_full_disk_is_refused_before_measuring(
    tmp_path, tiny_suite, small_disk
):
    _fill(small_disk)
    out = small_disk / "run.json"
    res = memtrack("run", "--config", str(tiny_suite), "--no-db", "--json", str(out), cwd=tmp_path)
    line = _error_line(res)
    assert "disk full" in line and str(out) in line
    assert "running" not in res.stderr


def test_a_disk_that_fills_during_the_run_keeps_the_run_in_a_file(tmp_path, tiny_suite, small_disk):
    db = small_disk / "m.db"
    _seed(db)
    filler = small_disk / "filler"
    res = memtrack(
        "run",
        "--config",
        str(tiny_suite),
        "--db",
        str(db),
        cwd=tmp_path,
        env={"TINY_FILLS": str(filler)},
    )
    line = _error_line(res)
    assert "disk full" in line and str(db) in line
    kept = _kept(line)
    assert kept.parent == tmp_path  # the database's disk is full: the next place that takes it
    filler.unlink()
    _intact(db, 3)
    res = memtrack("ingest", str(kept), "--db", str(db))
    assert res.returncode == 0, res.stderr
    _intact(db, 4)


def test_a_workload_that_deletes_the_database_keeps_its_run_in_a_file(tmp_path, tiny_suite):
    db = tmp_path / "data" / "m.db"
    db.parent.mkdir()
    _seed(db)
    res = memtrack(
        "run",
        "--config",
        str(tiny_suite),
        "--db",
        str(db),
        cwd=tmp_path,
        env={"TINY_DELETES": str(db)},
    )
    line = _error_line(res)
    assert "deleted or replaced" in line
    kept = _kept(line)
    assert kept.parent == db.parent and kept.is_file()
    res = memtrack("ingest", str(kept), "--db", str(tmp_path / "new.db"))
    assert res.returncode == 0 and "1 run(s) added" in res.stdout, res.stderr


# `memtrack` with a busy timeout of 1 s instead of 30: the test holds the lock until the run
# has ended, so how long the run waits for it changes nothing but the test's own time.
SHORT_BUSY_TIMEOUT = (
    "import memtrack.store.database as db; db.BUSY_TIMEOUT_S = 1.0\n"
    "from memtrack.cli import main; main(prog_name='memtrack')"
)


def test_a_lock_held_past_the_busy_timeout_keeps_the_run_in_a_file(tmp_path, tiny_suite):
    """Another writer takes the database after the up-front check and holds it past the
    busy timeout: the measured run is written to a file the error names."""
    db = tmp_path / "m.db"
    _seed(db)
    sync = tmp_path / "sync"
    proc = subprocess.Popen(
        [sys.executable, "-c", SHORT_BUSY_TIMEOUT, "run", "--config", str(tiny_suite)]
        + ["--db", str(db)],
        cwd=tmp_path,
        env={**os.environ, "TINY_WAITS": str(sync)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    holder = sqlite3.connect(db, timeout=60, isolation_level=None)
    try:
        started = Path(f"{sync}.started")
        while not started.exists() and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), proc.communicate()
        holder.execute("BEGIN IMMEDIATE")  # the write lock, until the run has given up
        Path(f"{sync}.locked").write_text("")
        out, err = proc.communicate(timeout=600)
    finally:
        holder.close()
    assert proc.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert "database is locked" in line and str(db) in line
    kept = _kept(line)
    res = memtrack("ingest", str(kept), "--db", str(db))
    assert res.returncode == 0, res.stderr
    _intact(db, 4)


def _damage(db: Path, how: str) -> None:
    conn = sqlite3.connect(db)
    conn.executescript(
        {
            "a table dropped": "drop table device_measurements;",
            "a column dropped": "alter table measurements drop column params;",
            "a column retyped": "alter table measurements drop column params; "
            "alter table measurements add column params integer;",
        }[how]
    )
    conn.close()


@pytest.mark.parametrize("how", ["a table dropped", "a column dropped", "a column retyped"])
def test_a_damaged_database_is_refused_before_the_first_case(tmp_path, tiny_suite, how):
    db = tmp_path / "m.db"
    (run_id, *_) = _seed(db)
    _damage(db, how)
    imported = tmp_path / "imported"
    env = {"TINY_IMPORTED": str(imported)}
    res = memtrack("run", "--config", str(tiny_suite), "--db", str(db), cwd=tmp_path, env=env)
    line = _error_line(res)
    assert (
        line.startswith(f"memtrack: error: {db}: damaged database (")
        and "running" not in res.stderr
    ), res.stderr
    assert not imported.exists()  # refused at once, before the suite was discovered
    for args in (
        ["show", run_id],
        ["check", "--run", run_id, "--no-record"],
        ["history", "decoder"],
        ["ingest", *_records(tmp_path / how, 1)],
    ):
        line = _error_line(memtrack(*args, "--db", str(db), cwd=tmp_path))
        assert f"{db}: damaged database" in line, (args, line)


def test_backup_refuses_a_damaged_database(tmp_path):
    db = tmp_path / "m.db"
    _seed(db)
    _damage(db, "a table dropped")
    dest = tmp_path / "backups"
    dest.mkdir()
    line = _error_line(memtrack("backup", str(dest), "--db", str(db), cwd=tmp_path))
    assert f"{db}: damaged database (table 'device_measurements' is missing)" in line
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(
    "column, value",
    [("params", "'not json'"), ("allocated_samples", "'5'"), ("peak_allocated_bytes", "'a lot'")],
)
def test_a_stored_value_of_the_wrong_type_is_named_not_a_traceback(tmp_path, column, value):
    db = tmp_path / "m.db"
    (run_id, *_) = _seed(db)
    conn = sqlite3.connect(db)
    conn.execute(f"update measurements set {column} = {value} where run_id = ?", [run_id])
    conn.commit()
    conn.close()
    for args in (
        ["show", run_id],
        ["check", "--run", run_id, "--no-record"],
        ["export", str(tmp_path / "out")],
        # history shows JSON columns as they are stored; a number it shows must be one
        *([["history", "decoder"]] if column == "peak_allocated_bytes" else []),
    ):
        line = _error_line(memtrack(*args, "--db", str(db), cwd=tmp_path))
        assert f"{db}: damaged database (" in line and run_id in line, (args, line)


# -- text no output can carry -------------------------------------------------------------


@pytest.mark.parametrize("field", ["git.subject", "measurements.0.workload", "env_vars key"])
def test_a_lone_surrogate_in_a_record_is_named_and_nothing_is_made(tmp_path, field):
    """JSON's `\\ud800` escape makes a string no database, terminal or page can encode: the
    record is refused at ingest, naming the file and the field, and no database is made."""
    run = make_run([make_measurement("decoder", {"batch": 1})])
    data = json.loads(json.dumps(dataclasses.asdict(run)))
    if field == "git.subject":
        data["git"]["subject"] = "fix \ud800 the cache"
    elif field == "env_vars key":
        data["environment"]["env_vars"]["CUDA\ud800"] = "1"
    else:
        data["measurements"][0]["workload"] = "dec\ud800oder"
    record = tmp_path / "r.json"
    record.write_text(json.dumps(data))  # ASCII JSON, the surrogate as its escape
    db = tmp_path / "new.db"
    line = _error_line(memtrack("ingest", str(record), "--db", str(db)))
    assert str(record) in line and "lone surrogate" in line, line
    assert field.split(".")[0].split()[0] in line, line
    assert not db.exists()


def test_line_and_paragraph_separators_in_a_message_stay_on_one_line_in_show(tmp_path):
    db = tmp_path / "m.db"
    m = dataclasses.replace(
        make_measurement("decoder", {"batch": 1}),
        status="error",
        message="first\u2028second\u2029third\x85fourth",
    )
    run = make_run([m])
    with Store.open(db) as store:
        store.write_run(run)
    res = memtrack("show", run.run_id, "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert not {"\u2028", "\u2029", "\x85"} & set(res.stdout)
    assert any("first second third" in line for line in res.stdout.splitlines()), res.stdout


def test_a_database_of_a_newer_schema_is_refused_by_backup_leaving_no_copy(tmp_path):
    db = tmp_path / "m.db"
    _seed(db)
    conn = sqlite3.connect(db)
    conn.execute(
        "insert into _sqlite_migrations (migration_set, name, applied_at) "
        "values ('memtrack', 'm999_from_the_future', '2030-01-01')"
    )
    conn.commit()
    conn.close()
    dest = tmp_path / "backups"
    dest.mkdir()
    line = _error_line(memtrack("backup", str(dest), "--db", str(db)))
    assert "m999_from_the_future" in line and "upgrade memtrack" in line, line
    assert list(dest.iterdir()) == []


# -- signals to `memtrack run` ---------------------------------------------------------------

HOLDS = """
import json, os, pathlib, subprocess, sys, time
import memtrack

@memtrack.workload
def slow(ctx):
    here = pathlib.Path(__file__).parent
    sleep = [sys.executable, "-c", "import time; time.sleep(600)", (here / "marker").read_text()]
    plain = subprocess.Popen(sleep)  # in the worker's process group
    own = subprocess.Popen(sleep, start_new_session=True)  # a session of its own
    pids = {"worker": os.getpid(), "plain": plain.pid, "session": own.pid}
    (here / "pids.tmp").write_text(json.dumps(pids))
    os.replace(here / "pids.tmp", here / "pids.json")
    return lambda: time.sleep(60)
"""


def _running(case: dict[int, int], marker: str) -> dict[int, int]:
    """The processes of `case` (pid -> start time) that still run, and every running process
    whose command line carries `marker`."""
    left = {pid: start for pid, start in case.items() if processes.running(pid, start)}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and marker.encode() in processes.cmdline(int(entry)):
            st = processes.stat(int(entry))
            if st is not None and processes.running(int(entry), st[2]):
                left[int(entry)] = st[2]
    return left


def _run_until_the_case_holds(
    tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], dict[int, int], str]:
    """A real `memtrack run` of HOLDS, once its case's worker has started both children: the
    run, its case's processes (pid -> start time) and the marker in the children's commands."""
    db = tmp_path / "m.db"
    _seed(db)
    marker = f"memtrack-test-case-{uuid.uuid4().hex}"
    (tmp_path / "marker").write_text(marker)
    (tmp_path / "wl.py").write_text(HOLDS)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 1\n')
    committed(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memtrack.cli", "run", "--config", "memtrack.toml", "--db", str(db)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stderr is not None
        while "running" not in (line := proc.stderr.readline()):  # the case has started
            assert line, "memtrack run ended before its case"
        pids = tmp_path / "pids.json"
        for _ in range(6000):  # the step is a 60 s sleep: its setup is done long before
            if pids.exists():
                break
            assert proc.poll() is None, "memtrack run ended before the case's setup"
            time.sleep(0.05)
        case = {}
        for pid in json.loads(pids.read_text()).values():
            st = processes.stat(pid)
            assert st is not None, f"the case's process {pid} ended before the signal"
            case[pid] = st[2]
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, case, marker


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT], ids=lambda s: s.name
)
def test_a_signal_to_memtrack_run_mid_case_is_an_interrupt(tmp_path, sig):
    """SIGTERM (what CI sends on cancel), SIGHUP and SIGQUIT (^\\) as ^C: one line, the
    shell's status for the signal, every process of the case ended (its worker, a child in its
    group and one in a session of its own), the database intact."""
    proc, case, marker = _run_until_the_case_holds(tmp_path)
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        left = _running(case, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        processes.kill(_running(case, marker))
    assert proc.returncode == 128 + sig, err
    said = "memtrack: interrupted" + ("" if sig == signal.SIGINT else f" ({sig.name})")
    assert err.strip().splitlines()[-1] == said, err
    assert "Traceback" not in err
    assert left == {}, "processes of the case outlived the run"
    _intact(tmp_path / "m.db", 3)


@pytest.mark.parametrize("how", ["forked", "spawned"])
def test_a_sigkill_of_memtrack_run_mid_case_leaves_no_process_of_the_case(tmp_path, how):
    """Nothing runs in a runner killed by SIGKILL: its case's worker dies with it (its
    parent-death signal), and the children the workload started, in the worker's group and in
    a session of its own, are ended by the runner's guard. Forked by the fork server or
    spawned as a fresh interpreter alike."""
    env = {"MEMTRACK_SPAWN": "1"} if how == "spawned" else {}
    proc, case, marker = _run_until_the_case_holds(tmp_path, env)
    try:
        proc.kill()
        proc.communicate()
        ended = processes.wait_until(lambda: not _running(case, marker))
        left = _running(case, marker)
    finally:
        processes.kill(_running(case, marker))
    assert ended, f"processes of the case outlived the killed run: {left}"
    _intact(tmp_path / "m.db", 3)
