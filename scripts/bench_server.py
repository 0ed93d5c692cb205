"""The history on PostgreSQL beside the SQLite file, measured side by side in one run: a
throwaway PostgreSQL cluster of this script's own (tests/pgcluster.py: Debian's server or
pgserver's, a unix socket, fsync on as a production server has it; `--fsync-off` as a CI
database on a tmpfs would be), and the same data in both engines.

1. `memtrack check` of a pull request against 1,000,050 measurement rows (20,000 commits of
   a 50-case suite and 200 estimate runs; scripts/bench_check_speed.py's history, copied to
   the server by `memtrack db copy`), each a fresh process, the engines alternated; in
   steady state (the copy vacuumed and analyzed, as autovacuum leaves it a minute later).
2. `memtrack ingest` of 10,000 records (scripts/bench_ingest.py's) into a new database.
3. 8 concurrent writers, each recording 50 runs one by one (as 8 runners' `memtrack run`s
   do), into one database: throughput, and runs lost or duplicated (0 and 0 is the goal).
4. The dashboard's Overview and History at 100,000 runs (scripts/bench_dashboard.py's
   seed, copied to the server): the page's script alone (AppTest, empty caches).

    python scripts/bench_server.py                 # everything (~15 min on 2 cores)
    python scripts/bench_server.py --only writers  # one part: check, ingest, writers, dashboard
    python scripts/bench_server.py --only check --cache /tmp/bcache  # a history kept
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

import pgcluster  # noqa: E402

MEMTRACK = [sys.executable, "-c", "from memtrack.cli import main; main()"]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMTRACK, *args], cwd=cwd, capture_output=True, text=True)


def _copy(src: str, dst: str) -> float:
    t = time.perf_counter()
    done = _cli("db", "copy", src, dst)
    if done.returncode != 0:
        raise SystemExit(f"db copy failed: {done.stderr.strip()}")
    return time.perf_counter() - t


def bench_check(work: Path, cluster: pgcluster.Cluster, tries: int, cache: Path | None) -> None:
    import psycopg
    from bench_check_speed import history

    repo, db, run_id = history(cache or work / "check", 20_000, 50, 200)
    from memtrack.store.database import Store

    Store.open(db).close()  # a kept history migrated to this memtrack's schema first
    url = cluster.database()
    took = _copy(str(db), url)
    print(f"check: the history copied to the server in {took:.1f} s (memtrack db copy)")
    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("vacuum analyze")
    print(f"check: steady state: the copy vacuumed and analyzed in {time.perf_counter() - t:.1f} s")
    walls: dict[str, list[float]] = {"sqlite": [], "postgres": []}
    last = {}
    for _ in range(tries):
        for engine, target in (("sqlite", str(db)), ("postgres", url)):
            t = time.perf_counter()
            done = subprocess.run(
                [*MEMTRACK, "check", "--config", str(repo / "memtrack.toml"), "--run", run_id],
                cwd=repo,
                env={**os.environ, "MEMTRACK_DB": target},
                capture_output=True,
                text=True,
            )
            walls[engine].append(time.perf_counter() - t)
            if done.returncode not in (0, 1):
                raise SystemExit(f"{engine}: check failed: {done.stderr.strip()}")
            last[engine] = done.stdout.strip().splitlines()[-1]
    rows = 20_000 * 50 + 200 * 50 + 50
    print(
        f"check: `memtrack check` of a pull request against {rows:,} measurement rows, "
        f"{tries} fresh processes per engine, alternated:"
    )
    for engine, times in walls.items():
        print(
            f"  {engine:8}: median {statistics.median(times):.3f} s, best {min(times):.3f} s "
            f"({last[engine]})"
        )
    ratio = statistics.median(walls["postgres"]) / statistics.median(walls["sqlite"])
    print(f"  PostgreSQL / SQLite: {ratio:.2f} (medians)")


def bench_ingest(work: Path, cluster: pgcluster.Cluster, records: int) -> None:
    from bench_ingest import TEMPLATE, make_records

    folder = work / "records"
    folder.mkdir(parents=True, exist_ok=True)
    paths = make_records(folder, records, json.loads(TEMPLATE.read_text()))
    out = {}
    for engine in ("sqlite", "postgres"):
        target = str(work / "ingest.db") if engine == "sqlite" else cluster.database()
        t = time.perf_counter()
        done = _cli("ingest", "--db", target, *map(str, paths))
        out[engine] = time.perf_counter() - t
        if done.returncode != 0:
            raise SystemExit(f"{engine}: ingest failed: {done.stderr.strip()}")
    print(f"ingest: {records:,} records into a new database, one `memtrack ingest` each:")
    for engine, took in out.items():
        print(f"  {engine:8}: {took:.2f} s ({records / took:,.0f} records/s)")
    print(f"  PostgreSQL / SQLite: {out['postgres'] / out['sqlite']:.2f}")


def _writer(target: str, writer: int, runs: int, ready: object, go: object) -> None:
    from factories import make_measurement, make_run

    from memtrack.store.opening import open_store
    from memtrack.store.url import parse_database

    records = [
        make_run(
            [
                make_measurement(f"w{c}", {"batch": 1}, peak=(writer + c + 1) * 2**20)
                for c in range(4)
            ],
            run_id=f"{writer:02d}{i:030d}",
            started_at=f"2026-04-01T{writer:02d}:{i // 60:02d}:{i % 60:02d}+00:00",
        )
        for i in range(runs)
    ]
    db = parse_database(target, "db")
    ready.put(writer)  # type: ignore[attr-defined]
    go.wait()  # type: ignore[attr-defined]
    for run in records:  # each as a run is recorded: open, write, close
        with open_store(db) as store:
            store.write_run(run)


def bench_writers(work: Path, cluster: pgcluster.Cluster, writers: int, runs: int) -> None:
    from memtrack.store.opening import open_store
    from memtrack.store.url import parse_database

    print(f"writers: {writers} processes at once, {runs} runs each (4 cases a run), one database:")
    ctx = multiprocessing.get_context("spawn")
    for engine in ("sqlite", "postgres"):
        target = str(work / "writers.db") if engine == "sqlite" else cluster.database()
        with open_store(parse_database(target, "db")):
            pass  # the schema, before the clock
        ready, go = ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=_writer, args=(target, w, runs, ready, go)) for w in range(writers)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=300)
        t = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        took = time.perf_counter() - t
        failed = [p.exitcode for p in procs if p.exitcode != 0]
        with open_store(parse_database(target, "db"), readonly=True) as store:
            ids = [r[0] for r in store.conn.execute("select run_id from runs")]
            (rows,) = store.conn.execute("select count(*) from measurements").fetchone()
        expected = {f"{w:02d}{i:030d}" for w in range(writers) for i in range(runs)}
        lost = len(expected - set(ids))
        duplicated = len(ids) - len(set(ids)) + max(0, rows - 4 * len(set(ids)))
        print(
            f"  {engine:8}: {took:.2f} s, {writers * runs / took:.1f} runs/s; lost {lost}, "
            f"duplicated {duplicated}, writers failed {len(failed)}"
        )


def bench_dashboard(work: Path, cluster: pgcluster.Cluster, runs: int) -> None:
    from bench_dashboard import CASES, case_id, script_time, seed

    db = work / "dashboard.db"
    t = time.perf_counter()
    n = seed(db, runs, random.Random(0))
    from memtrack.store.database import Store

    Store.open(db).close()  # a kept history migrated to this memtrack's schema first
    url = cluster.database()
    took = _copy(str(db), url)
    seeded = time.perf_counter() - t - took
    print(
        f"dashboard: {runs:,} runs ({n:,} measurements) seeded in {seeded:.1f} s, copied to "
        f"the server in {took:.1f} s; the page's script alone (AppTest, empty caches), "
        "best of 3:"
    )
    logging.disable(logging.WARNING)
    case = case_id(CASES[1][0], CASES[1][1])
    for page, query in (("overview", {}), ("history", {"page": "History", "case": case})):
        took = {}
        for engine, target in (("sqlite", str(db)), ("postgres", url)):
            took[engine] = min(script_time(target, query) for _ in range(3))  # type: ignore[arg-type]
        print(
            f"  {page:8}: SQLite {took['sqlite']:.2f} s, PostgreSQL {took['postgres']:.2f} s "
            f"(ratio {took['postgres'] / took['sqlite']:.2f})"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("check", "ingest", "writers", "dashboard"))
    ap.add_argument("--tries", type=int, default=5, help="fresh checks per engine")
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--runs", type=int, default=50, help="runs per writer")
    ap.add_argument("--dashboard-runs", type=int, default=100_000)
    ap.add_argument("--fsync-off", action="store_true", help="the server without fsync")
    ap.add_argument("--cache", type=Path, help="where check's history is kept between runs")
    args = ap.parse_args()
    why = pgcluster.unavailable()
    if why:
        raise SystemExit(f"no PostgreSQL to measure: {why}")
    cluster = pgcluster.Cluster(fsync=not args.fsync_off)
    work = Path(tempfile.mkdtemp(prefix="memtrack-bench-server-"))
    try:
        server = subprocess.run(
            [str(cluster.bin / "postgres"), "--version"], capture_output=True, text=True
        ).stdout.strip()
        fsync = "off" if args.fsync_off else "on"
        print(
            f"server: {server}, fsync {fsync}, on a unix socket; client psycopg, "
            f"{os.cpu_count()} cores"
        )
        parts = {
            "check": lambda: bench_check(work, cluster, args.tries, args.cache),
            "ingest": lambda: bench_ingest(work, cluster, args.records),
            "writers": lambda: bench_writers(work, cluster, args.writers, args.runs),
            "dashboard": lambda: bench_dashboard(work, cluster, args.dashboard_runs),
        }
        for name, part in parts.items():
            if args.only in (None, name):
                part()
                sys.stdout.flush()
    finally:
        cluster.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
