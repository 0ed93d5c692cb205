"""How quickly the dashboard renders on a large store, in a real browser.

Seeds a temporary database with 100,000 runs (six workload cases each, a base branch and
feature branches, a CPU environment and two GPU environments with a driver upgrade between
them, a few failures, verdicts of the gate), serves it with `streamlit run`, and loads the
Overview and a History page in Debian's Chromium (Playwright) as a new visitor would: a
fresh browser context, timed by the page's own clock (tested every frame) from navigation
until the page's last element is shown and the script has finished. It also prints where
the time goes: the script run alone (AppTest), and the bytes the server sent over its
websocket. Measured in the same run, the pages visited in turn, as floors: an empty
Streamlit page, and a page of one six-row `st.dataframe` (what any page with a grid pays a
new visitor). Goal: each page within 0.5 s of the empty page.

    python scripts/bench_dashboard.py [--runs 100000] [--db PATH] [--keep] [--repeat 5]
    python scripts/bench_dashboard.py --runs 20000 --one-commit    # reruns of one commit
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
MiB = 2**20
GiB = 2**30

CASES: list[tuple[str, dict[str, Any], int, int]] = [
    # (workload, params, base framework peak, weights)
    ("decoder_generate", {"batch": 1, "dtype": "bfloat16", "seq_len": 4096}, 3 * GiB, 2 * GiB),
    ("decoder_generate", {"batch": 8, "dtype": "bfloat16", "seq_len": 4096}, 9 * GiB, 2 * GiB),
    ("decoder_generate", {"batch": 8, "dtype": "float32", "seq_len": 4096}, 17 * GiB, 4 * GiB),
    ("train_step", {"batch": 16, "dtype": "float32"}, 6 * GiB, 1 * GiB),
    ("train_step", {"batch": 64, "dtype": "bfloat16"}, 11 * GiB, 1 * GiB),
    ("vision_forward", {"batch": 32, "resolution": 1024}, 5 * GiB, GiB // 2),
]
ENVS: list[tuple[str, str, str | None, str | None, str]] = [
    # (env_id, fingerprint, gpu name or None, driver, torch)
    ("cpu0000000000001", "cpu-fp", None, None, "2.13.0+cpu"),
    ("h200000000000001", "h200-fp-1", "NVIDIA H200", "570.86", "2.13.0+cu128"),
    ("h200000000000002", "h200-fp-2", "NVIDIA H200", "580.65", "2.14.1+cu130"),
]
BRANCHES = ["main"] * 12 + [f"feature/{i:02d}" for i in range(20)]


def case_id(workload: str, params: dict[str, Any]) -> str:
    inner = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{workload}[{inner}]"


def seed(path: Path, n_runs: int, rng: random.Random, one_commit: bool = False) -> int:
    """Create the schema through the store, then bulk-insert `n_runs` runs in one transaction;
    with `one_commit`, all of them reruns of one commit on the base branch."""
    sys.path.insert(0, str(ROOT))
    from memtrack.store.database import Store

    Store.open(path).close()  # migrations: the schema exactly as memtrack makes it
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA synchronous=off")
    conn.execute("BEGIN")
    for env_id, fp, gpu_name, driver, torch in ENVS:
        gpus = (
            []
            if gpu_name is None
            else [
                {
                    "index": 0,
                    "name": gpu_name,
                    "uuid": "GPU-0",
                    "total_bytes": 141 * GiB,
                    "compute_capability": "9.0",
                    "mig_mode": None,
                }
            ]
        )
        conn.execute(
            "insert into environments (env_id, fingerprint, gpus, driver, cuda_runtime, torch, "
            "python, os, cpu, cpu_count, host_ram_bytes, packages, env_vars, "
            "torch_cuda_arch_list) values (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                env_id,
                fp,
                json.dumps(gpus),
                driver,
                None if gpu_name is None else "13.0",
                torch,
                "3.11.7",
                "Linux",
                "bench cpu",
                16,
                128 * GiB,
                "{}",
                "{}",
                "[]",
            ],
        )
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    runs, meas = [], []
    device_rows, verdicts = [], []
    next_mid = 1
    drift = [0] * len(CASES)
    for i in range(n_runs):
        at = (start + timedelta(minutes=10 * i)).isoformat(timespec="seconds")
        branch = "main" if one_commit else rng.choice(BRANCHES)
        if i % 50 == 0:
            env = ENVS[0]
        else:
            env = ENVS[1] if i < n_runs * 0.7 else ENVS[2]
        commit = "ab" * 20 if one_commit else f"{rng.getrandbits(160):040x}"
        run_id = f"{rng.getrandbits(128):032x}"
        runs.append(
            (
                run_id,
                at,
                at,
                at,
                "suite",
                None,
                None,
                1,
                env[0],
                env[1],
                commit,
                branch,
                None,
                f"commit {i}: change something",
                at,
                0,
                "main",
                commit,
                0,
                "[]",
            )
        )
        if branch == "main" and rng.random() < 0.002:  # an occasional real step on main
            k = rng.randrange(len(CASES))
            drift[k] += rng.choice((1, -1)) * rng.randrange(1, 64) * MiB
        for k, (workload, params, peak, weights) in enumerate(CASES):
            gpu = env[2] is not None
            failed = rng.random() < 0.003
            alloc = peak + drift[k] + (0 if gpu else -peak // 2)
            reserved = alloc + 2 * MiB * rng.randrange(0, 40)
            device = reserved + 480 * MiB + rng.randrange(0, 8) * MiB
            seen = gpu and not failed  # the CPU has no reserved or device view
            status = rng.choice(("oom", "error", "timeout")) if failed else "ok"
            t = 0.05 * (k + 1) * (1 + rng.random() * 0.05)
            host = 2 * GiB + rng.randrange(0, 64) * MiB
            meas.append(
                (
                    next_mid,
                    run_id,
                    workload,
                    case_id(workload, params),
                    json.dumps(params),
                    0,
                    "cuda" if gpu else "cpu",
                    params.get("dtype"),
                    1,
                    3,
                    status,
                    f"{status}: synthetic" if failed else None,
                    None if failed else alloc,
                    reserved if seen else None,
                    device if seen else None,
                    host,
                    300 * MiB,
                    host - 300 * MiB,
                    rng.randrange(0, 16) * MiB,
                    weights,
                    None if failed else alloc - weights,
                    device - reserved if seen else None,
                    t,
                    t * 1.1,
                    t * 0.95,
                    2.0 + t * 6,
                )
            )
            if i % 10 == 0 and not failed:  # the gate checked every tenth run
                budget = int(peak * 1.15)
                verdicts.append(
                    (
                        run_id,
                        case_id(workload, params),
                        workload,
                        "allocated",
                        "over_budget" if alloc > budget else "ok",
                        int(alloc > budget),
                        0,
                        alloc,
                        0.0,
                        3.0,
                        512.0,
                        alloc + 4 * MiB,
                        alloc,
                        0.0,
                        0.0,
                        budget,
                        "fits the serving GPU",
                        20,
                        "ok",
                        at,
                        "base" if branch == "main" else "pull_request",
                    )
                )
            if seen:
                device_rows.append(
                    (
                        next_mid,
                        0,
                        "GPU-0",
                        env[2],
                        141 * GiB,
                        600 * MiB,
                        device + 600 * MiB,
                        device,
                        "pid",
                        alloc,
                        reserved,
                        100,
                    )
                )
            next_mid += 1
    conn.executemany(
        "insert into runs (run_id, started_at, finished_at, recorded_at, suite_hash, "
        "config_path, shard, schema_version, env_id, fingerprint, git_commit, git_branch, "
        "git_parent, git_subject, git_committed_at, git_dirty, git_base_branch, "
        "git_merge_base, git_shallow, git_notes) values "
        "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        runs,
    )
    conn.executemany(
        "insert into measurements (id, run_id, workload, case_id, params, seed, device, dtype, "
        "warmup, repeats, status, message, peak_allocated_bytes, peak_reserved_bytes, "
        "device_peak_bytes, host_peak_rss_bytes, host_file_rss_bytes, host_bytes, "
        "host_step_bytes, weights_bytes, intermediates_bytes, "
        "workspace_bytes, time_median_s, time_p95_s, time_min_s, duration_s) values "
        "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        meas,
    )
    conn.executemany(
        'insert into device_measurements (measurement_id, "index", uuid, name, total_bytes, '
        "used_before_bytes, peak_device_used_bytes, peak_process_bytes, process_view, "
        "peak_allocated_bytes, peak_reserved_bytes, samples) values (?,?,?,?,?,?,?,?,?,?,?,?)",
        device_rows,
    )
    conn.executemany(
        "insert into verdicts (run_id, case_id, workload, metric, kind, blocking, provisional, "
        "baseline_value, spread, factor, floor, threshold, candidate_value, delta, delta_pct, "
        "budget_bytes, budget_reason, baseline_runs, message, checked_at, context) values "
        "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        verdicts,
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return len(meas)


def script_time(db: Path, query_params: dict[str, str]) -> float:
    """Seconds for the page's script alone, in-process (AppTest), empty caches."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    st.cache_resource.clear()
    sys.argv = [str(APP), "--db", str(db)]
    at = AppTest.from_file(str(APP), default_timeout=120)
    for k, v in query_params.items():
        at.query_params[k] = v
    t0 = time.perf_counter()
    at.run()
    took = time.perf_counter() - t0
    if at.exception:
        raise SystemExit(f"the app raised: {at.exception[0].message}")
    return took


EMPTY_APP = 'import streamlit as st\nst.title("Empty")\n'
"""The floor: what Streamlit alone costs a new visitor on this machine, now."""
TABLE_APP = (
    "import pandas as pd\nimport streamlit as st\nst.title('Table')\n"
    "st.dataframe(pd.DataFrame({'a': range(6), 'b': list('abcdef')}), hide_index=True)\n"
    "st.write('Done')\n"
)
"""A second floor: one small `st.dataframe`, whose code a new visitor's browser loads."""


def serve(app: Path, args: list[str], port: int, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "STREAMLIT_SERVER_HEADLESS": "true",
        "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
        "STREAMLIT_SERVER_ADDRESS": "127.0.0.1",
        "STREAMLIT_SERVER_PORT": str(port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(app), "--", *args],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"streamlit did not start:\n{log.read_text()}")


DRAWN = """([done, charts]) => {
  if (!document.body || !document.body.textContent.includes(done)) return false;
  const has = (e) => e.textContent.includes(done);
  const el = [...document.body.querySelectorAll("*")].find(
    (e) => has(e) && ![...e.children].some(has));
  if (!el || !el.checkVisibility() || el.getBoundingClientRect().height === 0) return false;
  if (document.querySelectorAll("svg.panel").length < charts) return false;
  if (document.querySelector("[data-testid='stStatusWidgetRunningIcon'], "
      + "[data-testid='stSkeleton']")) return false;
  return performance.now();
}"""
"""Tested by the page itself on every animation frame: the page's last element (`done`)
shown, `charts` panels drawn and the script finished. It returns the page's own clock,
milliseconds since the navigation started."""


def visit(browser: Any, url: str, done: str, charts: int) -> tuple[float, float, int]:
    """A new visitor: seconds until `done` is shown, `charts` panels are drawn and the
    script has stopped, by the page's own clock, tested every frame; the same moment as
    wall time from the navigation's start here (Playwright's round trips included); and
    the bytes received over the websocket.

    Earlier runs of this script waited with Playwright's locator (`get_by_text().wait_for`),
    which polls after 0, 20, 50, 100 and 100 ms, then every 500 ms: a page drawn at 1.02 s
    read 1.45 s, so its figures came in steps of up to half a second."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    received = [0]

    def on_ws(ws: Any) -> None:
        ws.on("framereceived", lambda payload: received.__setitem__(0, received[0] + len(payload)))

    page.on("websocket", on_ws)
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    drawn_ms = page.wait_for_function(
        DRAWN, arg=[done, charts], polling="raf", timeout=120_000
    ).json_value()
    wall = time.perf_counter() - t0
    if page.locator("[data-testid='stException']").count():
        raise SystemExit(
            f"{url}: the app raised: {page.locator('[data-testid=stException]').first.inner_text()}"
        )
    context.close()
    return drawn_ms / 1000, wall, received[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--db", type=Path, help="Seed (or reuse, with --keep) this file.")
    parser.add_argument("--keep", action="store_true", help="Reuse --db if it exists.")
    parser.add_argument("--repeat", type=int, default=5, help="New visitors per page.")
    parser.add_argument(
        "--one-commit", action="store_true", help="Seed reruns of one commit on the base branch."
    )
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "bench.db"
    if not (args.keep and db.exists()):
        db.unlink(missing_ok=True)
        t0 = time.perf_counter()
        n = seed(db, args.runs, random.Random(0), args.one_commit)
        print(
            f"seeded {args.runs:,} runs{' of one commit' if args.one_commit else ''}, "
            f"{n:,} measurements in "
            f"{time.perf_counter() - t0:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)"
        )
    case = case_id(CASES[1][0], CASES[1][1])
    pages = [  # name, query, text of the page's last element, charts drawn
        ("overview", {}, "A case's name opens its history", 0),
        ("history", {"page": "History", "case": case}, "Where the series moved", 2),
    ]
    logging.disable(logging.WARNING)  # cache clearing outside a server warns on every run
    for name, qp, _, _ in pages:
        took = min(script_time(db, qp) for _ in range(2))
        print(f"{name:8}: script run alone (AppTest, empty caches) {took:.2f} s")

    from playwright.sync_api import sync_playwright

    subjects = []  # name, what, app, its arguments, query, done, charts
    for name, text, done, what in (
        ("empty", EMPTY_APP, "Empty", "an empty Streamlit page"),
        ("table", TABLE_APP, "Done", "one small st.dataframe"),
    ):
        path = Path(tmp.name) / f"{name}.py"
        path.write_text(text)
        subjects.append((name, what, path, [], {}, done, 0))
    for name, qp, done, charts in pages:
        subjects.append((name, name, APP, ["--db", str(db)], qp, done, charts))
    log = Path(tmp.name) / "streamlit.log"
    servers = []
    try:
        urls = {}
        for name, _, app, app_args, qp, _, _ in subjects:
            port = free_port()
            if not any(s_app == app for s_app, _, _ in servers):
                servers.append((app, port, serve(app, app_args, port, log)))
            port = next(p for s_app, p, _ in servers if s_app == app)
            urls[name] = f"http://127.0.0.1:{port}/" + (
                f"?{urllib.parse.urlencode(qp)}" if qp else ""
            )
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--no-first-run",
                ],
            )
            # The first visitor of each page, after the server started (its caches cold).
            first = {n: visit(browser, urls[n], d, c) for n, _, _, _, _, d, c in subjects}
            # Then new visitors, the pages taken in turn round by round, so that a busy
            # moment of the machine falls on the floors and the pages alike.
            drawn: dict[str, list[float]] = {n: [] for n, *_ in subjects}
            walls: dict[str, list[float]] = {n: [] for n, *_ in subjects}
            for _ in range(args.repeat):
                for name, _, _, _, _, done, charts in subjects:
                    d, w, _ = visit(browser, urls[name], done, charts)
                    drawn[name].append(d)
                    walls[name].append(w)
            browser.close()
    finally:
        for _, _, proc in servers:
            proc.terminate()
            proc.wait(timeout=30)
    med = {n: statistics.median(v) for n, v in drawn.items()}
    med_wall = {n: statistics.median(v) for n, v in walls.items()}
    print(
        f"new visitors in Chromium, {args.repeat} per page, the pages in turn; the time until "
        "the page's last element is shown and the script has finished, by the page's own "
        "clock tested every frame (wall: the same moment seen from here, from the navigation):"
    )
    for name, what, *_ in subjects:
        times = drawn[name]
        line = (
            f"  {what:24}: {med[name]:.2f} s (best {min(times):.2f}, worst {max(times):.2f}; "
            f"wall {med_wall[name]:.2f} s)"
        )
        if name not in ("empty", "table"):
            line += (
                f"; {med[name] - med['empty']:+.2f} s over the empty page (goal +0.50 s; "
                f"wall {med_wall[name] - med_wall['empty']:+.2f} s); first visitor "
                f"after start {first[name][0]:.2f} s; {first[name][2] / 1024:.0f} KiB over "
                "the websocket"
            )
        print(line)
    tmp.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
