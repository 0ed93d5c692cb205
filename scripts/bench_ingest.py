"""Throughput of `memtrack ingest`: N realistic run records into a new database, in one process.

The records are copies of a real `memtrack run --json` record of the example suite (4 cases,
scripts/example-run.json) with their own run ids, commits, times and slightly varied
figures. Each ingest runs as its own `memtrack ingest` process; its peak RSS comes from the
kernel (ru_maxrss of the child and its reader processes, the largest of them). A smaller
batch is ingested too: equal peaks mean memory does not grow with the number of files. CPU
seconds count the readers too, so wall below CPU is the cores at work. Goal: 10,000 records
in at most half of f37245f's time, measured beside it (--against f37245f).

    python scripts/bench_ingest.py [--records 10000] [--pythonpath OTHER_CHECKOUT]
    python scripts/bench_ingest.py --against f37245f --tries 3

--pythonpath measures another checkout's memtrack on the same records. --against REV also
measures commit REV of this repository (its files unpacked in a temporary folder) beside
this tree, try by try on the same records, and prints the medians and their ratio: a
before/after figure from one run on one machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

TEMPLATE = Path(__file__).with_name("example-run.json")
ROOT = Path(__file__).resolve().parents[1]


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


def ingest(db: Path, paths: list[Path], pythonpath: str | None) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds, peak RSS in MiB, and the command's last line."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = "import sys; from memtrack.cli import main; main(sys.argv[1:])"
    args = [sys.executable, "-c", code, "ingest", "--db", str(db), *map(str, paths)]
    t0 = time.perf_counter()
    # cwd: the database's folder, so `python -c` imports memtrack from PYTHONPATH, not from
    # the folder this script was started in
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=db.parent
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0)  # reap it ourselves: its own peak RSS, in KiB
    proc.returncode = 0
    elapsed = time.perf_counter() - t0
    rss, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    lines = out.strip().splitlines()
    return elapsed, cpu, rss / 1024, lines[-1] if lines else ""


def _tree(work: Path, rev: str) -> tuple[str, Path]:
    """The tracked files of commit `rev` of this repository, unpacked under `work`."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = work / f"tree-{sha[:12]}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return sha[:7], tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--pythonpath", help="measure the memtrack of this checkout instead")
    ap.add_argument("--against", help="also measure this commit of the repository, beside")
    ap.add_argument("--tries", type=int, default=1, help="ingests of each batch per tree")
    args = ap.parse_args()
    template = json.loads(TEMPLATE.read_text())
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-") as tmp:
        work = Path(tmp)
        folder = work / "records"
        folder.mkdir()
        t0 = time.perf_counter()
        paths = make_records(folder, args.records, template)
        print(
            f"{len(paths)} records of {len(template['measurements'])} cases "
            f"({sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB of JSON) "
            f"made in {time.perf_counter() - t0:.1f} s"
        )
        trees = [("this tree", args.pythonpath or str(ROOT))]
        if args.against:
            label, tree = _tree(work, args.against)
            trees.append((label, str(tree)))
        small = paths[: max(1, len(paths) // 10)]
        batches = [
            (f"{len(small)} records", small),
            (f"{len(paths)} records", paths),
            ("again (all dup.)", paths),
        ]
        figures: dict[tuple[str, str], list[tuple[float, float, float, str]]] = {}
        for i in range(args.tries):
            for name, pythonpath in trees:  # alternated: a busy moment falls on both alike
                for label, batch in batches:
                    db = work / f"{i}-{name.replace(' ', '_')}-{len(batch)}.db"
                    figures.setdefault((name, label), []).append(ingest(db, batch, pythonpath))
        for label, batch in batches:
            for name, _ in trees:
                runs = figures[(name, label)]
                wall = statistics.median(r[0] for r in runs)
                cpu = statistics.median(r[1] for r in runs)
                rss = max(r[2] for r in runs)
                tag = f"{label} ({name})" if len(trees) > 1 else label
                report(tag, len(batch), wall, cpu, rss, runs[-1][3])
            if len(trees) > 1:
                (a, _), (b, _) = trees
                wa, wb = (statistics.median(r[0] for r in figures[(n, label)]) for n in (a, b))
                ca, cb = (statistics.median(r[1] for r in figures[(n, label)]) for n in (a, b))
                print(
                    f"{'':>16}  {a} / {b}: {wa / wb:.2f} wall, {ca / cb:.2f} CPU "
                    f"(medians of {args.tries})"
                )


def report(label: str, n: int, seconds: float, cpu: float, rss: float, last: str) -> None:
    # CPU seconds beside wall seconds: on a busy machine the wall clock also counts waiting.
    print(
        f"{label:>16}: {seconds:6.2f} s wall, {cpu:6.2f} s CPU  {n / seconds:6.0f} records/s  "
        f"peak RSS {rss:6.1f} MiB  ({last})"
    )


if __name__ == "__main__":
    main()
