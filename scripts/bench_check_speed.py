"""How fast is `memtrack check`, beside an older commit? (`scripts/bench_check.py` is the
benchmark of false blocks and detection over histories resampled from real reruns; its git
history of many commits is built by the same function, imported from it.)

A database with 1,000,000 measurement rows (20,000 recorded commits of a 50-case suite, on a
real 20,000-commit git history, with 200 estimate runs spread over it) is made here, and
`memtrack check` is timed as a user runs it (a fresh process, default options). The same
check of an older commit (--against, default f7e0af2, the last before estimates) is timed
beside it, alternated try by try, on the same measured history in that commit's own schema,
and the ratio printed; then each tree's check in process, and its slowest query, named by
caller and SQL (scripts/query_profile.py). Goals: under 0.5 s, and no slower than the older
commit.

    python scripts/bench_check_speed.py                         # the timing (~3 min)
    python scripts/bench_check_speed.py --cache /tmp/bench      # built once, reused
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_check import big_history  # noqa: E402
from factories import CPU_ENV, GIT_ENV, make_measurement, make_run  # noqa: E402

from memtrack.store.database import Store  # noqa: E402

MiB = 2**20
ROOT = Path(__file__).resolve().parents[1]
MEMTRACK = [sys.executable, "-c", "from memtrack.cli import main; main()"]


def _git(repo: Path, *args: str, **kw) -> str:
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        **kw,
    )
    return out.stdout.strip()


# -- 1 and 2: real re-runs --------------------------------------------------------------

GATED = ("allocated", "host", "host_step")


def big_database(
    work: Path, shas: list[str], pr: str, cases: int, estimates: int
) -> tuple[Path, str]:
    """The history's measured runs, `estimates` estimate runs (`memtrack estimate`, every
    case) spread over it, and a candidate run of the PR commit, all through this tree's
    schema. Returns the database and the candidate's run id."""
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
        estimated = {round((k + 1) * len(shas) / (estimates + 1)) for k in range(estimates)}

        def add_run(run_id: str, i: int, sha: str, kind: str, seconds: int) -> None:
            iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * i))
            started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * i + seconds))
            run_rows.append(
                (
                    run_id,
                    started,
                    started,
                    started,
                    "suite",
                    1,
                    env_id,
                    CPU_ENV.fingerprint,
                    sha,
                    "main",
                    f"commit {i}",
                    iso,
                    0,
                    "main",
                    sha,
                    0,
                    "[]",
                )
            )
            framework = "memtracker" if kind == "measured" else "fake-tensor-estimate"
            for c, ((w, params), cid) in enumerate(zip(names, case_ids, strict=True)):
                peak = (c + 1) * 10 * MiB
                host = 400 * MiB + ((i * 7 + c) % 5) * 256 * 1024
                m_rows.append(
                    (
                        run_id,
                        w,
                        cid,
                        json.dumps(params),
                        0,
                        "cpu",
                        "float32",
                        1,
                        3,
                        "ok",
                        framework,
                        peak,
                        f"[{peak}, {peak}, {peak}]",
                        host,
                        host,
                        host - 90 * MiB,
                        10 * MiB,
                        "[0.01, 0.0101, 0.0099]",
                        0.01,
                        kind,
                    )
                )

        for i, sha in enumerate(shas, 1):
            # run ids are 32 hex digits, as records hold them
            add_run(f"{i:031x}0", i, sha, "measured", 30)
            if i in estimated:  # its id sorts beside its commit's, as random ids spread
                add_run(f"{i:031x}e", i, sha, "estimate", 45)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "insert into runs (run_id, started_at, finished_at, recorded_at, suite_hash, "
            "schema_version, env_id, fingerprint, git_commit, git_branch, git_subject, "
            "git_committed_at, git_dirty, git_base_branch, git_merge_base, git_shallow, "
            "git_notes) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            run_rows,
        )
        conn.executemany(
            "insert into measurements (run_id, workload, case_id, params, seed, device, dtype, "
            "warmup, repeats, status, framework, peak_allocated_bytes, allocated_samples, "
            "host_peak_rss_bytes, host_step_peak_rss_bytes, host_bytes, host_step_bytes, "
            "iteration_times_s, time_median_s, kind) "
            "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            m_rows,
        )
        conn.execute("COMMIT")
        candidate = make_run(
            [
                # At the history's level: `host` is the gated figure (the history's
                # host_bytes, peak RSS less 90 MiB of file pages), so the check passes, as
                # most pull requests' do.
                make_measurement(
                    w, p, peak=(c + 1) * 10 * MiB, host=310 * MiB, times=(0.01, 0.0101, 0.0099)
                )
                for c, (w, p) in enumerate(names)
            ],
            commit=pr,
            branch="feature",
            merge_base=shas[-11],
            started_at=time.strftime(
                "%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * (len(shas) + 6))
            ),
        )
        store.write_run(candidate)
        conn.execute("ANALYZE")
    return db, candidate.run_id


def _rows(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        columns = {r[1] for r in conn.execute("pragma table_info(measurements)")}
        if "kind" not in columns:
            return {"measured": conn.execute("select count(*) from measurements").fetchone()[0]}
        return dict(conn.execute("select kind, count(*) from measurements group by kind"))
    finally:
        conn.close()


def history(cache: Path, commits: int, cases: int, estimates: int) -> tuple[Path, Path, str]:
    """The git history and this tree's database, built in `cache` unless already there."""
    meta = cache / "meta.json"
    if meta.exists():
        print(f"reusing the history and database in {cache}", file=sys.stderr)
        return cache / "big", cache / "big.db", json.loads(meta.read_text())["run_id"]
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    print(
        f"building a history of {commits:,} commits and {commits * cases:,} measurement rows "
        f"(and {estimates * cases:,} estimate rows) in {cache} ...",
        file=sys.stderr,
    )
    t = time.perf_counter()
    repo, shas, pr = big_history(cache, commits)
    db, run_id = big_database(cache, shas, pr, cases, estimates)
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    meta.write_text(json.dumps({"run_id": run_id}))
    print(f"  built in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return repo, db, run_id


def older_tree(work: Path, rev: str) -> tuple[Path, str] | None:
    """The tracked files of `rev` of this repository, unpacked under `work`."""
    try:
        sha = _git(ROOT, "rev-parse", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        return None
    tree = work / f"tree-{sha[:12]}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree, sha


def older_database(cache: Path, db: Path, tree: Path, sha: str) -> Path:
    """The same measured history in the older tree's own schema: the database is made by
    that tree's migrations, then filled with the columns both schemas have (estimates are
    left out: an older tree would read them as measured figures)."""
    old = cache / f"big-{sha[:12]}.db"
    if old.exists():
        return old
    part = old.with_name(old.name + ".part")
    part.unlink(missing_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-c",
            # memtrack.store.database since the store became a package; memtrack.store before
            "import sys\ntry:\n    from memtrack.store.database import Store\n"
            "except ImportError:\n    from memtrack.store import Store\n"
            "Store.open(sys.argv[1]).close()",
            str(part),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
    )
    conn = sqlite3.connect(part, isolation_level=None)
    conn.execute("attach database ? as src", [f"{db.resolve().as_uri()}?mode=ro"])
    measured = (
        "exists (select 1 from src.measurements x where x.run_id = runs.run_id "
        "and x.kind = 'measured')"
    )
    where = {
        "runs": measured,
        "measurements": "kind = 'measured'",
        "device_measurements": "measurement_id in (select id from src.measurements "
        "where kind = 'measured')",
    }
    conn.execute("BEGIN")
    for table in ("environments", "runs", "measurements", "device_measurements"):
        cols = [r[1] for r in conn.execute(f"pragma main.table_info({table})")]
        have = {r[1] for r in conn.execute(f"pragma src.table_info({table})")}
        names = ", ".join(f'"{c}"' for c in cols if c in have)
        conn.execute(
            f"insert into main.{table} ({names}) select {names} from src.{table} "
            f"where {where.get(table, '1')}"
        )
    conn.execute("COMMIT")
    conn.execute("detach database src")
    conn.execute("ANALYZE")
    conn.close()
    part.rename(old)
    return old


def _check_command(tree: Path, repo: Path, db: Path, run_id: str) -> tuple[list[str], dict]:
    """`memtrack check` as a user runs it (default options), with `tree`'s memtrack."""
    return (
        [
            sys.executable,
            "-c",
            "from memtrack.cli import main; main()",
            "check",
            "--config",
            str(repo / "memtrack.toml"),
            "--db",
            str(db),
            "--run",
            run_id,
        ],
        {**os.environ, "PYTHONPATH": str(tree)},
    )


def time_checks(
    subjects: list[tuple[str, Path, Path]], repo: Path, run_id: str, tries: int
) -> dict[str, tuple[list[float], int, str]]:
    """Fresh-process walls per subject (label, tree, database), the subjects alternated
    round by round so that a busy moment of the machine falls on all of them alike."""
    out: dict[str, tuple[list[float], int, str]] = {label: ([], 0, "") for label, _, _ in subjects}
    for _ in range(tries):
        for label, tree, db in subjects:
            args, env = _check_command(tree, repo, db, run_id)
            t = time.perf_counter()
            proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t
            if proc.returncode not in (0, 1):
                raise SystemExit(f"{label}: memtrack check failed: {proc.stderr.strip()}")
            walls, _, _ = out[label]
            walls.append(wall)
            out[label] = (walls, proc.returncode, proc.stdout.strip().splitlines()[-1])
    return out


def query_profile(tree: Path, repo: Path, db: Path, run_id: str) -> dict:
    """The check in process under `tree`'s memtrack, and its time per query."""
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("query_profile.py")),
            str(db),
            run_id,
            str(repo / "memtrack.toml"),
        ],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(proc.stdout)


def speed(work: Path, args: argparse.Namespace) -> None:
    cache = (args.cache or work) / f"history-{args.commits}x{args.cases}-e{args.estimates}"
    repo, db, run_id = history(cache, args.commits, args.cases, args.estimates)
    Store.open(db).close()  # this tree's pending migrations, if any, before the clock starts
    subjects = [("this tree", ROOT, db)]
    if args.against:
        older = older_tree(work, args.against)
        if older is None:
            print(f"{args.against}: not a commit of this repository; timed alone", file=sys.stderr)
        else:
            tree, sha = older
            subjects.append((sha[:7], tree, older_database(cache, db, tree, sha)))
    timed = time_checks(subjects, repo, run_id, args.tries)
    rows = _rows(db)
    extra = f" and {rows['estimate']:,} estimate rows" if rows.get("estimate") else ""
    print(
        f"speed: `memtrack check` against {rows['measured']:,} measured rows "
        f"({args.commits:,} commits x {args.cases} cases){extra}, each a fresh process, "
        f"{args.tries} alternated tries (goal < 0.5 s, and no slower than {args.against}):"
    )
    medians = {}
    for label, tree, path in subjects:
        walls, code, last = timed[label]
        medians[label] = statistics.median(walls)
        profile = query_profile(tree, repo, path, run_id)
        slowest = profile["queries"][0]
        shown = slowest["sql"] if len(slowest["sql"]) <= 100 else slowest["sql"][:97] + "..."
        print(
            f"  {label:9}: median {medians[label]:.3f} s, best {min(walls):.3f} s; in process "
            f"{profile['check_s']:.3f} s; exit {code}: {last}"
        )
        print(
            f"  {'':9}  slowest query: {slowest['seconds']:.3f} s in {slowest['calls']} "
            f"call(s), {slowest['caller']}: {shown}"
        )
    if len(subjects) == 2:
        (a, _, _), (b, _, _) = subjects
        print(f"  ratio {a} / {b}: {medians[a] / medians[b]:.2f} (medians of fresh processes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument(
        "--estimates",
        type=int,
        default=200,
        help="estimate runs of the whole suite spread over the history",
    )
    ap.add_argument(
        "--against",
        default="f7e0af2",
        help="also time the check of this commit of the repository, side by side "
        "('' for none); default: the last one before estimates existed",
    )
    ap.add_argument("--tries", type=int, default=7, help="fresh processes per tree")
    ap.add_argument(
        "--cache",
        type=Path,
        help="build the history and databases in this folder once, and reuse them",
    )
    ap.add_argument(
        "--skip-reruns",
        action="store_true",
        help="accepted for old command lines: the re-runs are scripts/bench_check.py's",
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memtrack-bench-"))
    try:
        speed(work, args)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
