"""`memtrack ingest` of many files reads them in forked reader processes: what is stored, what
is refused and what is counted as present are the same as when one process reads them."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import CPU_ENV, GPU_ENV, MiB, make_measurement, make_run

from memtrack.cli import main
from memtrack.errors import RecordError
from memtrack.records import RankMeasurement, write_json
from memtrack.store import ingest
from memtrack.store.database import Store

N = 4 * ingest.CHUNK + 5  # chunks for two readers and more, the last one short

needs_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="one core: files are read in one process"
)


def _records(folder: Path, n: int = N) -> list[Path]:
    """Runs of two CPU cases, a GPU case with its device row and a case of two ranks."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        ranks = tuple(
            RankMeasurement(rank=r, device="cpu", status="ok", peak_allocated_bytes=(i + r) * MiB)
            for r in range(2)
        )
        run = make_run(
            [
                make_measurement("decoder", {"batch": 1}, peak=(100 + i) * MiB),
                make_measurement("decoder", {"batch": 8}, peak=(200 + i) * MiB),
                make_measurement("gpu", {"batch": 1}, device="cuda", device_peak=(300 + i) * MiB),
                make_measurement("ranked", {"ranks": 2}, ranks=ranks),
            ],
            env=GPU_ENV if i % 3 else CPU_ENV,
            subject=f"commit {i}",
            started_at=f"2026-01-01T{i // 60:02d}:{i % 60:02d}:00+00:00",
        )
        path = folder / f"{i:04d}.json"
        write_json(run, path)
        paths.append(path)
    return paths


def _ingest(db: Path, *files: Path):
    return CliRunner().invoke(main, ["ingest", "--db", str(db), *map(str, files)])


def _tables(db: Path) -> dict[str, list[tuple]]:
    """Every row of the run tables, in id order; the time of writing left out."""
    conn = sqlite3.connect(db)
    try:
        out = {}
        for table, order in [
            ("environments", "env_id"),
            ("runs", "run_id"),
            ("measurements", "id"),
            ("device_measurements", "measurement_id"),
            ("rank_measurements", "measurement_id, rank"),
        ]:
            cur = conn.execute(f"select * from {table} order by {order}")
            names = [d[0] for d in cur.description]
            keep = [i for i, n in enumerate(names) if n != "recorded_at"]
            out[table] = [tuple(row[i] for i in keep) for row in cur]
        return out
    finally:
        conn.close()


def _write(db: Path, paths: list[Path], jobs: int) -> tuple[int, int]:
    with ingest.read_runs(paths, (), db, jobs=jobs) as runs, Store.open(db) as store:
        return store.write_runs(runs)


@needs_cores
def test_runs_read_by_forked_readers_are_stored_row_for_row_as_read_in_one_process(tmp_path):
    paths = _records(tmp_path / "in")
    assert ingest.readers(len(paths)) >= 2  # what `memtrack ingest` uses here
    one, two = tmp_path / "one.db", tmp_path / "two.db"
    assert _write(one, paths, jobs=0) == (N, 0)
    assert _write(two, paths, jobs=2) == (N, 0)
    rows = _tables(two)
    assert len(rows["runs"]) == N and len(rows["measurements"]) == 4 * N
    assert len(rows["device_measurements"]) == N and len(rows["rank_measurements"]) == 2 * N
    assert rows == _tables(one)
    # the runs read back are the records written
    with Store.open(two, readonly=True) as store:
        for path in (paths[0], paths[-1]):
            record = ingest.read_json(path)
            assert store.get_run(record.run_id) == record


@needs_cores
def test_bad_files_among_many_are_named_first_one_first_and_nothing_is_written(tmp_path):
    paths = _records(tmp_path / "in")
    late, early = paths[-3], paths[ingest.CHUNK + 7]  # read by different readers
    late.write_text("{")
    data = json.loads(early.read_text())
    data["measurements"][1]["peak_allocated_bytes"] = -5
    early.write_text(json.dumps(data))
    db = tmp_path / "m.db"
    res = _ingest(db, *paths)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and line.startswith(
        f"memtrack: error: {early}: measurements[1]"
    )
    assert "(and 1 more bad file(s)); nothing ingested" in line
    assert not db.exists()


@needs_cores
def test_runs_already_stored_are_counted_once_and_other_content_under_their_id_refused(
    tmp_path,
):
    paths = _records(tmp_path / "in")
    db = tmp_path / "m.db"
    assert f"{N} run(s) added, 0 already present" in _ingest(db, *paths).output
    before = _tables(db)
    # again, and one file twice in the same batch: compared by the readers, and by the writer
    res = _ingest(db, *paths, paths[5])
    assert res.exit_code == 0 and f"0 run(s) added, {N + 1} already present" in res.output
    data = json.loads(paths[70].read_text())
    data["measurements"][0]["peak_allocated_bytes"] += 1
    paths[70].write_text(json.dumps(data))
    res = _ingest(db, *paths)
    assert res.exit_code == 2 and "already stored with different content" in res.output
    assert data["run_id"] in res.output
    assert _tables(db) == before


@needs_cores
@pytest.mark.parametrize("jobs", [0, 2])
def test_a_run_twice_in_one_new_batch_is_stored_once_however_far_apart(tmp_path, jobs):
    paths = _records(tmp_path / "in")
    db = tmp_path / "m.db"
    # the copies come after more than one lookup's worth of runs, and within one
    assert _write(db, [*paths, paths[3], paths[-1]], jobs=jobs) == (N, 2)
    assert len(_tables(db)["runs"]) == N
    res = _ingest(tmp_path / "cli.db", *paths, paths[3])
    assert res.exit_code == 0 and f"{N} run(s) added, 1 already present" in res.output


@needs_cores
def test_a_reader_that_dies_fails_the_batch_by_name_and_writes_nothing(tmp_path, monkeypatch):
    paths = _records(tmp_path / "in")
    victim = paths[2 * ingest.CHUNK]
    real = ingest._read

    def dies_at_victim(chunk, secrets, store):
        if victim in chunk:
            os._exit(9)  # as a reader killed by the kernel
        return real(chunk, secrets, store)

    monkeypatch.setattr(ingest, "_read", dies_at_victim)  # forked readers inherit it
    db = tmp_path / "m.db"
    _write(db, paths[:3], jobs=0)
    with pytest.raises(RecordError, match="its reader process ended before reading it"):
        _write(db, paths, jobs=2)
    assert len(_tables(db)["runs"]) == 3
