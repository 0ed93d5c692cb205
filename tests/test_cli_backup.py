"""`memtrack backup` and `memtrack export`: a consistent copy of a live database, and a
rebuild from JSON records that loses nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from click.testing import CliRunner
from factories import MiB, make_measurement, make_run

from memtrack.cli import main
from memtrack.records import CIInfo
from memtrack.store.database import Store


def _seed(db: Path, n: int = 3) -> list[str]:
    runs = [
        make_run(
            [make_measurement("decoder", {"batch": b}, peak=(100 + i) * MiB) for b in (1, 8)],
            started_at=f"2026-01-0{i + 1}T12:00:00+00:00",
            ci=CIInfo(provider="github-actions", event="push", ref="refs/heads/main"),
            subject=f"commit {i}",
        )
        for i in range(n)
    ]
    with Store.open(db) as store:
        for run in runs:
            store.write_run(run)
    return [r.run_id for r in runs]


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# A writer in another process: it holds a write transaction open (BEGIN IMMEDIATE, one run
# inserted, not committed) until told to go on, then commits and keeps writing runs.
_WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from factories import make_measurement, make_run
    from memtrack.store.database import Store
    from memtrack.store.rows import Batch

    store = Store.open({db!r})
    store.conn.execute("BEGIN IMMEDIATE")
    held = Batch(store.conn, store.kept_columns)
    held.add(make_run([make_measurement("decoder", {{"batch": 99}})], subject="held"))
    held.flush()
    print("holding", flush=True)
    sys.stdin.readline()
    store.conn.execute("COMMIT")
    for i in range(40):
        store.write_run(make_run([make_measurement("decoder", {{"batch": i}})]))
        time.sleep(0.005)
    print("done", flush=True)
    """
)


def test_backup_while_a_writer_holds_the_database(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    ids = _seed(db)
    script = _WRITER.format(tests=str(Path(__file__).parent), db=str(db))
    writer = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "holding"

        # The writer's transaction is open: the copy has the committed runs, not its own.
        first = _invoke("backup", str(tmp_path / "during.db"), "--db", str(db))
        assert first.exit_code == 0, first.output
        assert "3 run(s)" in first.output
        with Store.open(tmp_path / "during.db", readonly=True) as copy:
            assert sorted(copy.run_ids()) == sorted(ids)
            assert copy.get_run(ids[0]).measurements[0].peak_allocated_bytes == 100 * MiB

        # Backups taken while the writer commits run after run are each a consistent
        # snapshot: every run in the copy is whole, and the copy passes its check.
        writer.stdin.write("go\n")
        writer.stdin.flush()
        backups = tmp_path / "backups"
        backups.mkdir()
        for _ in range(5):
            result = _invoke("backup", str(backups), "--db", str(db))
            assert result.exit_code == 0, result.output
            time.sleep(0.02)
        assert writer.stdout.readline().strip() == "done"
    finally:
        writer.kill() if writer.poll() is None else None
        writer.wait()

    copies = sorted(backups.glob("live-*.db"))
    assert copies, "a backup into a directory gets a time-stamped name"
    for path in [tmp_path / "during.db", *copies]:
        assert not Path(f"{path}-wal").exists(), "the copy is one self-contained file"
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        orphans = conn.execute(
            "select count(*) from runs r where not exists "
            "(select 1 from measurements m where m.run_id = r.run_id)"
        ).fetchone()[0]
        assert orphans == 0, f"{path} holds a run without its measurements"
        conn.close()
    # After the writer finished, a last copy has everything it wrote.
    final = _invoke("backup", str(tmp_path / "final.db"), "--db", str(db))
    assert "44 run(s)" in final.output


def test_backup_refuses_to_overwrite_and_a_missing_database(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    _seed(db, 1)
    dest = tmp_path / "copy.db"
    assert _invoke("backup", str(dest), "--db", str(db)).exit_code == 0
    again = _invoke("backup", str(dest), "--db", str(db))
    assert again.exit_code == 2 and "already exists" in again.output
    assert _invoke("backup", str(dest), "--db", str(db), "--overwrite").exit_code == 0
    missing = _invoke("backup", str(dest), "--db", str(tmp_path / "nope.db"), "--overwrite")
    assert missing.exit_code == 2 and "no such database" in missing.output
    itself = _invoke("backup", str(db), "--db", str(db), "--overwrite")
    assert itself.exit_code == 2 and "database itself" in itself.output


def test_export_then_ingest_rebuilds_the_same_runs(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    ids = _seed(db)
    out = tmp_path / "records"
    result = _invoke("export", str(out), "--db", str(db))
    assert result.exit_code == 0, result.output
    files = sorted(out.glob("*.json"))
    assert sorted(f.stem for f in files) == sorted(ids)
    assert json.loads(files[0].read_text())["schema_version"] == 1

    fresh = tmp_path / "fresh.db"
    rebuilt = _invoke("ingest", *map(str, files), "--db", str(fresh))
    assert rebuilt.exit_code == 0 and "3 run(s) added" in rebuilt.output
    with Store.open(db, readonly=True) as a, Store.open(fresh, readonly=True) as b:
        assert sorted(b.run_ids()) == sorted(ids)
        for run_id in ids:
            assert b.get_run(run_id) == a.get_run(run_id)
    # Ingesting the same export again adds nothing.
    again = _invoke("ingest", *map(str, files), "--db", str(fresh))
    assert "0 run(s) added, 3 already present" in again.output


def test_export_since_selects_by_start_time(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    ids = _seed(db)  # started 2026-01-01, -02, -03 at 12:00 UTC
    out = tmp_path / "recent"
    result = _invoke("export", str(out), "--db", str(db), "--since", "2026-01-02")
    assert result.exit_code == 0 and "2 run(s)" in result.output
    assert sorted(f.stem for f in out.glob("*.json")) == sorted(ids[1:])
    late = _invoke(
        "export", str(tmp_path / "late"), "--db", str(db), "--since", "2026-01-03T13:00:00+01:00"
    )  # 12:00 UTC: the third run, inclusive
    assert "1 run(s)" in late.output
    bad = _invoke("export", str(out), "--db", str(db), "--since", "last tuesday")
    assert bad.exit_code == 2 and "--since" in bad.output
