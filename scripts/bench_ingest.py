"""Throughput of `memtrack ingest`: N realistic run records into a new database, in one process.

The records are copies of a real `memtrack run --json` record of the example suite (4 cases,
scripts/example-run.json) with their own run ids, commits, times and slightly varied
figures. Each ingest runs as its own `memtrack ingest` process; its peak RSS comes from the
kernel (ru_maxrss of the child). A smaller batch is ingested too: equal peaks mean memory
does not grow with the number of files. Goal: 10,000 records in under 3 s on a quiet machine.

    python scripts/bench_ingest.py [--records 10000] [--pythonpath OTHER_CHECKOUT]

--pythonpath measures another checkout's memtrack on the same records (e.g. the base
branch), for a before/after figure on one machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

TEMPLATE = Path(__file__).with_name("example-run.json")


def make_records(folder: Path, n: int, template: dict) -> list[Path]:
    rng = random.Random(0)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    paths = []
    parent = None
    for i in range(n):
        data = copy.deepcopy(template)
        commit = f"{rng.getrandbits(160):040x}"
        when = (start + timedelta(minutes=10 * i)).isoformat(timespec="seconds")
        data["run_id"] = uuid.UUID(int=rng.getrandbits(128)).hex
        data["started_at"] = data["finished_at"] = when
        data["git"].update(commit=commit, parent=parent, merge_base=commit, committed_at=when)
        parent = commit
        for m in data["measurements"]:
            if m["peak_allocated_bytes"] is not None:
                m["peak_allocated_bytes"] += rng.randrange(0, 4096) * 64
            m["host_peak_rss_bytes"] += rng.randrange(0, 2**20)
            m["iteration_times_s"] = [t * rng.uniform(0.9, 1.1) for t in m["iteration_times_s"]]
        path = folder / f"{i:05d}.json"
        path.write_text(json.dumps(data, indent=2, sort_keys=True))
        paths.append(path)
    return paths


def ingest(db: Path, paths: list[Path],
           pythonpath: str | None) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds, peak RSS in MiB, and the command's last line."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = "import sys; from memtrack.cli import main; main(sys.argv[1:])"
    args = [sys.executable, "-c", code, "ingest", "--db", str(db), *map(str, paths)]
    t0 = time.perf_counter()
    # cwd: the database's folder, so `python -c` imports memtrack from PYTHONPATH, not from
    # the folder this script was started in
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=db.parent)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0)  # reap it ourselves: its own peak RSS, in KiB
    proc.returncode = 0
    elapsed = time.perf_counter() - t0
    rss, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    lines = out.strip().splitlines()
    return elapsed, cpu, rss / 1024, lines[-1] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--pythonpath", help="measure the memtrack of this checkout instead")
    args = ap.parse_args()
    template = json.loads(TEMPLATE.read_text())
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-") as tmp:
        folder = Path(tmp) / "records"
        folder.mkdir()
        t0 = time.perf_counter()
        paths = make_records(folder, args.records, template)
        print(f"{len(paths)} records of {len(template['measurements'])} cases "
              f"({sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB of JSON) "
              f"made in {time.perf_counter() - t0:.1f} s")
        small = paths[: max(1, len(paths) // 10)]
        for label, batch in ((f"{len(small)} records", small), (f"{len(paths)} records", paths)):
            db = Path(tmp) / f"{len(batch)}.db"
            report(label, len(batch), *ingest(db, batch, args.pythonpath))
        again = ingest(Path(tmp) / f"{len(paths)}.db", paths, args.pythonpath)
        report("again (all dup.)", len(paths), *again)


def report(label: str, n: int, seconds: float, cpu: float, rss: float, last: str) -> None:
    # CPU seconds beside wall seconds: on a busy machine the wall clock also counts waiting.
    print(f"{label:>16}: {seconds:6.2f} s wall, {cpu:6.2f} s CPU  {n / seconds:6.0f} records/s  "
          f"peak RSS {rss:6.1f} MiB  ({last})")


if __name__ == "__main__":
    main()
