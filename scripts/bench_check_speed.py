"""How fast is `memtrack check`, beside an older commit? Run with --skip-reruns for the
1,000,000-row timing alone; `scripts/bench_check.py` is the benchmark of false blocks and
detection over resampled histories. Prints three figures:

1. false blocks: the example suite is re-run (real subprocess runs on this machine) at
   least 30 times on one unchanged commit, with the page cache dropped before every other
   run where this process may (root). Each run is judged, per metric, against baselines
   drawn from many subsets of the other runs (every size from 1 to 20, many draws each).
   Goal: 0 blocked.
2. detection: into copies of those real runs, a growth is injected per metric (allocated:
   every iteration's peak; host: the whole case's peak; host_step: the step's peak above
   its starting level) and the smallest one that blocks is searched for, per case, against
   baselines of the other runs. Goals: any growth past 512 B (allocated), past 2 MiB
   (host_step), past the larger of 1 % and 4 MiB (host) blocks.
3. speed: a database with 1,000,000 measurement rows (20,000 recorded commits of a
   50-case suite, on a real 20,000-commit git history, with 200 estimate runs spread over
   it) is made here, and `memtrack check` is timed as a user runs it (a fresh process,
   default options). The same check of an older commit (--against, default f7e0af2, the
   last before estimates) is timed beside it, alternated try by try, on the same measured
   history in that commit's own schema, and the ratio printed; then each tree's check in
   process, and its slowest query, named by caller and SQL (scripts/query_profile.py).
   Goals: under 0.5 s, and no slower than the older commit.

    python scripts/bench_check_speed.py                  # everything (~6 min on 2 CPU cores)
    python scripts/bench_check_speed.py --reruns 30 -k decoder_generate
    python scripts/bench_check_speed.py --skip-reruns    # only the 1,000,000-row timing
    python scripts/bench_check_speed.py --skip-reruns --cache /tmp/bench  # built once, reused
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from factories import CPU_ENV, GIT_ENV, make_measurement, make_run  # noqa: E402

from memtrack.config import load_config  # noqa: E402
from memtrack.judge.baseline import COMPONENTS, Point  # noqa: E402
from memtrack.judge.memory import Candidate, verdict  # noqa: E402
from memtrack.records import (  # noqa: E402
    Measurement,
    metrics,  # noqa: E402
    read_json,
)
from memtrack.store.database import Store  # noqa: E402
from memtrack.units import format_size  # noqa: E402

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


def _drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def rerun_suite(work: Path, reruns: int, patterns: list[str]) -> tuple[Path, list, int]:
    """One run after another (a dropped cache must not hit a run half-way)."""
    repo = work / "suite"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "memtrack.toml").write_text(
        'modules = ["memtrack.examples"]\nwarmup = 1\nrepeats = 3\n'
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the unchanged commit")
    records = work / "records"
    records.mkdir()
    k = [a for p in patterns for a in ("-k", p)]
    dropped = 0
    t0 = time.perf_counter()
    for i in range(reruns):
        if i % 2 and _drop_page_cache():
            dropped += 1
        subprocess.run(
            [*MEMTRACK, "run", "--no-db", "--json", str(records / f"{i:03d}.json"), *k],
            cwd=repo,
            check=True,
            capture_output=True,
        )
        if (i + 1) % 5 == 0:
            print(f"  {i + 1}/{reruns} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    runs = [read_json(p) for p in sorted(records.glob("*.json"))]
    return repo, runs, dropped


def _point(run, m: Measurement) -> Point:
    values = {name: v for name in metrics.NAMES if (v := metrics.value(m, name)) is not None}
    parts = {
        name: getattr(m, col)
        for name, col in COMPONENTS.items()
        if getattr(m, col, None) is not None
    }
    return Point(
        run.run_id,
        run.git.commit,
        run.started_at,
        None,
        m.status,
        values,
        m.iteration_times_s,
        parts,
    )


def _judge(config, m: Measurement, base: list[tuple]) -> dict:
    """Verdicts per gated metric of `m` against the baseline (run, measurement) pairs."""
    points = [_point(r, b) for r, b in reversed(base)]  # newest first, as the finder gives
    c = Candidate(m, points, {}, len(points) < config.min_baseline_runs)
    return {metric: verdict(c, metric, config) for metric in GATED}


def _subsets(others: list, rng: random.Random, draws: int) -> list[list]:
    out = []
    for size in range(1, min(20, len(others)) + 1):
        for _ in range(draws):
            out.append(sorted(rng.sample(others, size), key=lambda rm: rm[0].started_at))
    return out


def false_blocks(repo: Path, runs: list, draws: int, seed: int) -> tuple[dict, dict, list]:
    config = load_config(repo / "memtrack.toml")
    rng = random.Random(seed)
    judged = dict.fromkeys(GATED, 0)
    blocked = dict.fromkeys(GATED, 0)
    noisy = dict.fromkeys(GATED, 0)
    reasons = []
    case_ids = [m.case_id for m in runs[0].measurements]
    for case_id in case_ids:
        pairs = [(r, next(m for m in r.measurements if m.case_id == case_id)) for r in runs]
        for i, (_, m) in enumerate(pairs):
            others = pairs[:i] + pairs[i + 1 :]
            for base in _subsets(others, rng, draws):
                for metric, v in _judge(config, m, base).items():
                    if v is None:
                        continue
                    judged[metric] += 1
                    noisy[metric] += v.kind == "noisy"
                    if v.blocking:
                        blocked[metric] += 1
                        if len(reasons) < 10:
                            reasons.append(f"{case_id} {metric}: {v.message}")
    return judged, blocked | {f"{k} noisy": n for k, n in noisy.items()}, reasons


def _inject(m: Measurement, metric: str, delta: int) -> Measurement:
    if metric == "allocated":
        return replace(
            m,
            peak_allocated_bytes=m.peak_allocated_bytes + delta,
            allocated_samples=tuple(s + delta for s in m.allocated_samples),
        )
    if metric == "host":
        return replace(m, host_peak_rss_bytes=m.host_peak_rss_bytes + delta)
    return replace(m, host_step_peak_rss_bytes=m.host_step_peak_rss_bytes + delta)


def detection(repo: Path, runs: list, bases: int) -> list[dict]:
    """Per case and metric: the smallest injected growth that blocks, worst over `bases`
    candidates, each judged against all the other runs as its baseline (up to 20)."""
    config = load_config(repo / "memtrack.toml")
    out = []
    for case_id in [m.case_id for m in runs[0].measurements]:
        pairs = [(r, next(m for m in r.measurements if m.case_id == case_id)) for r in runs]
        for metric in GATED:
            worst: int | None = 0
            for i, (_, m) in enumerate(pairs[:bases]):
                base = (pairs[:i] + pairs[i + 1 :])[-20:]

                def blocks(delta: int, m=m, base=base, metric=metric) -> bool:
                    v = _judge(config, _inject(m, metric, delta), base)[metric]
                    return v is not None and v.blocking

                lo, hi = 0, 1 << 30  # lo never blocks, hi does
                if not blocks(hi):
                    worst = None
                    break
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if blocks(mid) else (mid, hi)
                worst = max(worst or 0, hi)
            value = statistics.median(metrics.value(m, metric) or 0 for _, m in pairs)
            goal = {"allocated": 512, "host_step": 2 * MiB}.get(
                metric, max(int(value) // 100, 4 * MiB)
            )
            out.append(
                {"case": case_id, "metric": metric, "value": value, "smallest": worst, "goal": goal}
            )
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
        lines += [
            "commit refs/heads/main",
            f"mark :{i}",
            f"committer Bench <bench@example.com> {t0 + 60 * i} +0000",
            f"data {len(f'commit {i}')}",
            f"commit {i}",
        ]
        if i > 1:
            lines.append(f"from :{i - 1}")
        lines += ["M 644 inline f.txt", f"data {len(body)}", body.rstrip("\n"), ""]
    fork = commits - 10
    body = "pr\n"
    lines += [
        "commit refs/heads/feature",
        f"mark :{commits + 1}",
        f"committer Bench <bench@example.com> {t0 + 60 * (commits + 5)} +0000",
        "data 9",
        "a comment",
        f"from :{fork}",
        "M 644 inline f.txt",
        f"data {len(body)}",
        body.rstrip("\n"),
        "",
    ]
    marks = work / "marks"
    subprocess.run(
        ["git", "fast-import", "--quiet", f"--export-marks={marks}"],
        cwd=repo,
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    sha = {int(m.split()[0][1:]): m.split()[1] for m in marks.read_text().splitlines()}
    return repo, [sha[i] for i in range(1, commits + 1)], sha[commits + 1]


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
            add_run(f"run{i:06d}", i, sha, "measured", 30)
            if i in estimated:  # its id sorts beside its commit's, as random ids spread
                add_run(f"run{i:06d}e", i, sha, "estimate", 45)
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
                make_measurement(
                    w, p, peak=(c + 1) * 10 * MiB, host=400 * MiB, times=(0.01, 0.0101, 0.0099)
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
            "import sys; from memtrack.store import Store; Store.open(sys.argv[1]).close()",
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
    ap.add_argument("--reruns", type=int, default=32, help="re-runs of the unchanged commit")
    ap.add_argument(
        "-k",
        dest="patterns",
        action="append",
        default=[],
        help="only cases whose id contains this (repeatable)",
    )
    ap.add_argument(
        "--draws",
        type=int,
        default=5,
        help="baseline subsets drawn per size (1..20) for each re-run",
    )
    ap.add_argument(
        "--bases", type=int, default=8, help="re-runs used as the candidate of each injected growth"
    )
    ap.add_argument("--seed", type=int, default=1)
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
    ap.add_argument("--skip-reruns", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memtrack-bench-"))
    try:
        if not args.skip_reruns:
            print(
                f"re-running the example suite {args.reruns} times on one commit ...",
                file=sys.stderr,
            )
            repo, runs, dropped = rerun_suite(work, args.reruns, args.patterns)
            judged, blocked, reasons = false_blocks(repo, runs, args.draws, args.seed)
            print(
                f"false blocks over {len(runs)} re-runs of an unchanged commit (page cache "
                f"dropped before {dropped} of them), each judged against baselines from "
                f"{args.draws} random subsets of every size 1-20 of the others (goal 0):"
            )
            for metric in GATED:
                print(
                    f"  {metric:9}: {blocked[metric]} blocked of {judged[metric]:,} verdicts "
                    f"({blocked[metric + ' noisy']} said noisy)"
                )
            for r in reasons:
                print(f"    {r}")
            print(
                "detection: smallest injected growth that blocks, worst over "
                f"{args.bases} candidates against the other runs as baseline"
            )
            rows = detection(repo, runs, args.bases)
            for r in rows:
                small = r["smallest"]
                shown = (
                    "not caught below 1 GiB"
                    if small is None
                    else f"{format_size(small)} ({small:,} B, "
                    f"{100 * small / max(r['value'], 1):.3f}%)"
                )
                met = small is not None and small <= r["goal"] + 1  # past the goal blocks
                print(
                    f"  {r['metric']:9} {r['case'][:56]:56} figure "
                    f"{format_size(int(r['value'])):>11}: {shown:>34}  goal "
                    f"{format_size(r['goal'])}: {'met' if met else 'NOT met'}"
                )
        speed(work, args)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
