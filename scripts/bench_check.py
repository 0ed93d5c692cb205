"""How sharp and how fast is `memtrack check`? Prints three figures:

1. false positives: the example suite is re-run (real subprocess runs on this machine) at
   least 30 times on one unchanged commit; each run is checked against the others as its
   baseline. Goal: 0 runs blocked.
2. detection: into copies of those real runs, a peak regression is injected (allocated:
   every iteration's peak grows; host: the RSS peak grows) and the smallest one that
   blocks is searched for, per case, against every re-run as the base. Goal: +1 % or
   +1 MiB, whichever is larger, is caught.
3. speed: a database with 1,000,000 measurement rows (20,000 recorded commits of a
   50-case suite, on a real 20,000-commit git history) is made here, and `memtrack check`
   is timed as a user runs it (a fresh process, default options). Goal: under 0.5 s.

    python scripts/bench_check.py                  # everything (~5 min on 2 CPU cores)
    python scripts/bench_check.py --reruns 30 -k decoder_generate
    python scripts/bench_check.py --skip-reruns    # only the 1,000,000-row timing
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from factories import CPU_ENV, GIT_ENV, make_measurement, make_run  # noqa: E402

from memtrack.compare import check  # noqa: E402
from memtrack.config import load_config  # noqa: E402
from memtrack.records import read_json  # noqa: E402
from memtrack.store import Store  # noqa: E402
from memtrack.units import format_size  # noqa: E402

MiB = 2**20
MEMTRACK = [sys.executable, "-c", "from memtrack.cli import main; main()"]


def _git(repo: Path, *args: str, **kw) -> str:
    out = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                         env={**os.environ, **GIT_ENV}, **kw)
    return out.stdout.strip()


# -- 1 and 2: real re-runs --------------------------------------------------------------


def rerun_suite(work: Path, reruns: int, patterns: list[str], parallel: int) -> tuple[Path, Path]:
    repo = work / "suite"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "memtrack.toml").write_text(
        'modules = ["memtrack.examples"]\nwarmup = 1\nrepeats = 3\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the unchanged commit")
    records = work / "records"
    records.mkdir()
    k = [a for p in patterns for a in ("-k", p)]

    def one(i: int) -> None:
        subprocess.run([*MEMTRACK, "run", "--no-db", "--json", str(records / f"{i:03d}.json"),
                        *k], cwd=repo, check=True, capture_output=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        for n, _ in enumerate(pool.map(one, range(reruns)), 1):
            if n % 5 == 0:
                print(f"  {n}/{reruns} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    db = work / "reruns.db"
    with Store.open(db) as store:
        for path in sorted(records.glob("*.json")):
            store.write_run(read_json(path))
    return repo, db


def false_positives(repo: Path, db: Path) -> tuple[int, int, int, list[str]]:
    config = load_config(repo / "memtrack.toml")
    blocked = warned = 0
    reasons = []
    with Store.open(db) as store:
        ids = [r[0] for r in store.conn.execute("select run_id from runs order by started_at")]
        for run_id in ids:
            result = check(store, config, run_id=run_id, root=repo)
            if result.blocking:
                blocked += 1
                reasons += [f"{v.case_id} {v.metric}: {v.message}" for v in result.blocking]
            warned += any(v.kind == "time_regression" for v in result.verdicts)
    return blocked, warned, len(ids), reasons


def _inject(m, metric: str, delta: int):
    if metric == "allocated":
        return replace(m, peak_allocated_bytes=m.peak_allocated_bytes + delta,
                       allocated_samples=tuple(s + delta for s in m.allocated_samples))
    return replace(m, host_peak_rss_bytes=m.host_peak_rss_bytes + delta,
                   host_step_peak_rss_bytes=(m.host_step_peak_rss_bytes or 0) + delta)


def _blocks(store: Store, config, repo: Path, base_run, case_id: str, metric: str,
            delta: int) -> bool:
    ms = tuple(_inject(m, metric, delta) if m.case_id == case_id else m
               for m in base_run.measurements)
    pr = replace(base_run, run_id=uuid.uuid4().hex, measurements=ms,
                 git=replace(base_run.git, branch="pr"))
    store.write_run(pr)
    try:
        result = check(store, config, run_id=pr.run_id, root=repo)
        return any(v.blocking and v.case_id == case_id and v.metric == metric
                   for v in result.verdicts)
    finally:
        store.conn.execute("BEGIN IMMEDIATE")
        store.conn.execute("delete from measurements where run_id = ?", [pr.run_id])
        store.conn.execute("delete from runs where run_id = ?", [pr.run_id])
        store.conn.execute("COMMIT")


def detection(repo: Path, db: Path, bases: int) -> list[dict]:
    """Per case and metric: the smallest injected growth that blocks from every base run."""
    config = load_config(repo / "memtrack.toml")
    out = []
    with Store.open(db) as store:
        ids = [r[0] for r in store.conn.execute(
            "select run_id from runs where git_branch = 'main' order by started_at desc")]
        base_runs = [store.get_run(i) for i in ids[:bases]]
        for m in base_runs[0].measurements:
            for metric in ("allocated", "host"):
                worst = 0
                for run in base_runs:
                    lo, hi = 0, 1 << 30  # lo never blocks, hi does
                    if not _blocks(store, config, repo, run, m.case_id, metric, hi):
                        worst = None
                        break
                    while hi - lo > max(1, hi // 1000):
                        mid = (lo + hi) // 2
                        if _blocks(store, config, repo, run, m.case_id, metric, mid):
                            hi = mid
                        else:
                            lo = mid
                    worst = max(worst, hi)
                value = (m.peak_allocated_bytes if metric == "allocated"
                         else m.host_peak_rss_bytes)
                goal = max(value // 100, MiB)
                out.append({"case": m.case_id, "metric": metric, "value": value,
                            "smallest": worst, "goal": goal})
    return out


# -- 3: the 1,000,000-row database -----------------------------------------------------


def big_history(work: Path, commits: int) -> tuple[Path, list[str], str]:
    """A linear history of `commits` commits on main, and one PR commit off the tenth
    newest, made with git fast-import (seconds, not minutes)."""
    repo = work / "big"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    t0 = 1_767_225_600
    lines = []
    for i in range(1, commits + 1):
        body = f"{i}\n"
        lines += ["commit refs/heads/main", f"mark :{i}",
                  f"committer Bench <bench@example.com> {t0 + 60 * i} +0000",
                  f"data {len(f'commit {i}')}", f"commit {i}"]
        if i > 1:
            lines.append(f"from :{i - 1}")
        lines += ["M 644 inline f.txt", f"data {len(body)}", body.rstrip("\n"), ""]
    fork = commits - 10
    body = "pr\n"
    lines += ["commit refs/heads/feature", f"mark :{commits + 1}",
              f"committer Bench <bench@example.com> {t0 + 60 * (commits + 5)} +0000",
              "data 9", "a comment", f"from :{fork}",
              "M 644 inline f.txt", f"data {len(body)}", body.rstrip("\n"), ""]
    marks = work / "marks"
    subprocess.run(["git", "fast-import", "--quiet", f"--export-marks={marks}"], cwd=repo,
                   input="\n".join(lines) + "\n", text=True, check=True,
                   env={**os.environ, **GIT_ENV})
    sha = {int(m.split()[0][1:]): m.split()[1] for m in marks.read_text().splitlines()}
    return repo, [sha[i] for i in range(1, commits + 1)], sha[commits + 1]


def big_database(work: Path, shas: list[str], pr: str, cases: int) -> tuple[Path, str, int]:
    db = work / "big.db"
    with Store.open(db) as store:  # the real schema, through the migrations
        store.write_run(make_run([make_measurement()], branch="seed"))  # the environment row
        conn = store.conn
        env_id = conn.execute("select env_id from runs").fetchone()[0]
        conn.execute("delete from measurements")
        conn.execute("delete from runs")
        names = [(f"w{c // 5}", {"batch": 2 ** (c % 5)}) for c in range(cases)]
        case_ids = [f"{w}[batch={p['batch']}]" for w, p in names]
        run_rows, m_rows = [], []
        t0 = 1_767_225_600
        for i, sha in enumerate(shas, 1):
            run_id = f"run{i:06d}"
            iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * i))
            started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * i + 30))
            run_rows.append((run_id, started, started, started, "suite", 1, env_id,
                             CPU_ENV.fingerprint, sha, "main", f"commit {i}", iso, 0, "main",
                             sha, 0, "[]"))
            for c, ((w, params), cid) in enumerate(zip(names, case_ids, strict=True)):
                peak = (c + 1) * 10 * MiB
                host = 400 * MiB + ((i * 7 + c) % 5) * 256 * 1024
                m_rows.append((run_id, w, cid, json.dumps(params), 0, "cpu", "float32", 1, 3,
                               "ok", "memtracker", peak, f"[{peak}, {peak}, {peak}]", host,
                               host, "[0.01, 0.0101, 0.0099]", 0.01))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "insert into runs (run_id, started_at, finished_at, recorded_at, suite_hash, "
            "schema_version, env_id, fingerprint, git_commit, git_branch, git_subject, "
            "git_committed_at, git_dirty, git_base_branch, git_merge_base, git_shallow, "
            "git_notes) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", run_rows)
        conn.executemany(
            "insert into measurements (run_id, workload, case_id, params, seed, device, dtype, "
            "warmup, repeats, status, framework, peak_allocated_bytes, allocated_samples, "
            "host_peak_rss_bytes, host_step_peak_rss_bytes, iteration_times_s, time_median_s) "
            "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", m_rows)
        conn.execute("COMMIT")
        candidate = make_run(
            [make_measurement(w, p, peak=(c + 1) * 10 * MiB, host=400 * MiB,
                              times=(0.01, 0.0101, 0.0099))
             for c, (w, p) in enumerate(names)],
            commit=pr, branch="feature", merge_base=shas[-11],
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00",
                                     time.gmtime(t0 + 60 * (len(shas) + 6))))
        store.write_run(candidate)
        rows = conn.execute("select count(*) from measurements").fetchone()[0]
        conn.execute("ANALYZE")
    return db, candidate.run_id, rows


def time_check(repo: Path, db: Path, run_id: str, tries: int) -> tuple[list[float], int, str]:
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    walls = []
    out = None
    for _ in range(tries):
        t = time.perf_counter()
        out = subprocess.run(["memtrack", "check", "--config", str(repo / "memtrack.toml"),
                              "--db", str(db), "--run", run_id], cwd=repo, capture_output=True,
                             text=True)
        walls.append(time.perf_counter() - t)
    assert out is not None
    return walls, out.returncode, out.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reruns", type=int, default=32, help="re-runs of the unchanged commit")
    ap.add_argument("-k", dest="patterns", action="append", default=[],
                    help="only cases whose id contains this (repeatable)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time")
    ap.add_argument("--bases", type=int, default=8,
                    help="re-runs used as the base of each injected regression")
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--skip-reruns", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memtrack-bench-"))
    try:
        if not args.skip_reruns:
            print(f"re-running the example suite {args.reruns} times on one commit ...",
                  file=sys.stderr)
            repo, db = rerun_suite(work, args.reruns, args.patterns, args.parallel)
            blocked, warned, n, reasons = false_positives(repo, db)
            print(f"false positives: {blocked} of {n} re-runs of an unchanged commit blocked "
                  f"(goal 0); {warned} carried a time warning (time warns, never blocks by "
                  "default)")
            for r in reasons:
                print(f"    {r}")
            print("detection: smallest injected peak regression that blocks, worst over "
                  f"{args.bases} base re-runs (goal: +1% or +1 MiB, whichever is larger)")
            rows = detection(repo, db, args.bases)
            for r in rows:
                small = r["smallest"]
                shown = ("not caught below 1 GiB" if small is None else
                         f"{format_size(small)} ({100 * small / r['value']:.3f}%)")
                met = small is not None and small <= r["goal"]
                print(f"  {r['metric']:9} {r['case'][:60]:60} peak {format_size(r['value']):>11}: "
                      f"{shown:>22}  goal {format_size(r['goal'])}: {'met' if met else 'NOT met'}")
            for metric in ("allocated", "host"):
                mine = [r for r in rows if r["metric"] == metric and r["smallest"] is not None]
                if mine:
                    worst = max(mine, key=lambda r: r["smallest"] / r["goal"])
                    print(f"  {metric}: smallest regression caught in every case: "
                          f"{format_size(worst['smallest'])} "
                          f"({100 * worst['smallest'] / worst['value']:.3f}% of "
                          f"{worst['case'][:40]}); goal met in "
                          f"{sum(r['smallest'] <= r['goal'] for r in mine)} of "
                          f"{sum(r['metric'] == metric for r in rows)} cases")
        print(f"building a history of {args.commits} commits and {args.commits * args.cases:,} "
              "measurement rows ...", file=sys.stderr)
        t = time.perf_counter()
        repo, shas, pr = big_history(work, args.commits)
        db, run_id, rows = big_database(work, shas, pr, args.cases)
        print(f"  built in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        walls, code, last = time_check(repo, db, run_id, tries=7)
        with Store.open(db) as store:
            t = time.perf_counter()
            result = check(store, load_config(repo / "memtrack.toml"), run_id=run_id, root=repo)
            inproc = time.perf_counter() - t
        print(f"speed: `memtrack check` against {rows:,} measurement rows "
              f"({args.commits:,} commits x {args.cases} cases): median "
              f"{statistics.median(walls):.3f} s, best {min(walls):.3f} s wall as a fresh process "
              f"(goal < 0.5 s); the check itself {inproc:.3f} s in process; exit {code}, "
              f"{len(result.verdicts)} verdicts, baseline {result.baseline_mode} "
              f"({result.verdicts[0].baseline_runs} runs per case); last line: {last}")
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
