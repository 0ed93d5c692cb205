"""What a case costs to start: `memtrack run` with the fork server against every case started as
a fresh interpreter (MEMTRACK_SPAWN=1), side by side in one run, against a bare torch import.

A suite of trivial cases (a 16x16 linear layer) runs with one case and with many (--cases
forked, five spawned, which take long), both ways, in interleaved rounds (so that the
machine's load hits every side alike), beside
`python -c "import torch"` and `python -c "import torch, <MemTracker>"` (what a CPU case
cannot skip: MemTracker pulls in much of torch.distributed). Printed: the medians, the cost
of each added case and of a one-case run, and their ratios to the torch import. Goals: an
added case at most a quarter of a torch import; a one-case run at most a torch import and
one second.

With --figures, the shipped suite also runs forked once and spawned twice, and every case's
figures are compared: allocated exact, host within its floor (records.metrics).

    python scripts/bench_start.py [--rounds 3] [--cases 21] [--figures]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL = """
import torch
import memtrack

@memtrack.workload(params={"i": list(range(CASES))})
def tiny(ctx):
    w = torch.nn.Linear(16, 16)
    ctx.mark(w)
    x = ctx.randn(4, 16)
    return lambda: w(x)
"""

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def _repo(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "suite"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True)
    return root


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
    return elapsed


def _run(out: Path, *patterns: str) -> list[str]:
    k = [a for p in patterns for a in ("-k", p)]
    return [sys.executable, "-m", "memtrack.cli", "run", "--no-db", "--json", str(out), *k]


def _env(spawn: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MEMTRACK_SPAWN"}
    if spawn:
        env["MEMTRACK_SPAWN"] = "1"
    return env


def _probe() -> float:
    from memtrack.measure.suite import probe_environment

    t0 = time.perf_counter()
    probe_environment()
    return time.perf_counter() - t0


def _git(repo: Path) -> float:
    from memtrack.machine.provenance import git_info

    t0 = time.perf_counter()
    git_info(repo, "main")
    return time.perf_counter() - t0


def _spawned(path: Path) -> int:
    record = json.loads(path.read_text())
    return sum(any("fresh interpreter" in n for n in m["notes"]) for m in record["measurements"])


def starts(rounds: int, cases: int, tmp: Path) -> None:
    suite = _repo(
        tmp / "trivial",
        {
            "wl.py": TRIVIAL.replace("CASES", str(cases)),
            "memtrack.toml": 'modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n',
        },
    )
    out = tmp / "run.json"
    many = {"fork": cases, "spawn": 5}
    sides = {
        "import torch": ([sys.executable, "-c", "import torch"], False),
        "import torch + MemTracker": (
            [sys.executable, "-c", "import torch, torch.distributed._tools.mem_tracker"],
            False,
        ),
        "fork: 1 case": (_run(out, "i=0]"), False),
        f"fork: {many['fork']} cases": (_run(out), False),
        "spawn: 1 case": (_run(out, "i=0]"), True),
        f"spawn: {many['spawn']} cases": (_run(out, *(f"i={i}]" for i in range(5))), True),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    case_s: list[float] = []
    fixed: dict[str, list[float]] = {
        "environment probe, fresh interpreter (before)": [],
        "git facts": [],
    }
    for r in range(rounds):
        for name, (cmd, spawn) in sides.items():
            times[name].append(_timed(cmd, suite, _env(spawn)))
            if name.startswith(("fork", "spawn")):
                record = json.loads(out.read_text())
                n = len(record["measurements"])
                want = 0 if name.startswith("fork") else n
                if _spawned(out) != want or not all(
                    m["status"] == "ok" for m in record["measurements"]
                ):
                    sys.exit(f"{name}: {_spawned(out)} of {n} case(s) spawned, expected {want}")
                if name == f"fork: {many['fork']} cases":
                    case_s.extend(m["duration_s"] for m in record["measurements"])
        fixed["environment probe, fresh interpreter (before)"].append(_probe())
        fixed["git facts"].append(_git(suite))
        print(
            f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.2f}" for n, t in times.items()),
            flush=True,
        )
    med = {n: statistics.median(t) for n, t in times.items()}
    torch_s = med["import torch"]
    print(
        f"\nmedians of {rounds} rounds (s), load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs:"
    )
    for name, value in med.items():
        print(f"  {name:<28} {value:8.2f}")
    print(
        f"  {'a forked case, fork to end':<28} {statistics.median(case_s):8.2f}"
        "   (its duration_s: the launcher's own view)"
    )
    print(
        "the run's fixed cost, medians (s): the probe now runs in a fork of the server, the "
        "git facts while the server imports"
    )
    for name, values in fixed.items():
        print(f"  {name:<48} {statistics.median(values):8.2f}")
    print()
    added = {}
    for way in ("fork", "spawn"):
        one, lots = med[f"{way}: 1 case"], med[f"{way}: {many[way]} cases"]
        added[way] = (lots - one) / (many[way] - 1)
        print(
            f"{way:>5}: each added case {added[way]:6.2f} s = {added[way] / torch_s:5.2f} x torch"
            f" import (goal <= 0.25); one-case run {one:6.2f} s = torch import"
            f" + {one - torch_s:5.2f} s (goal <= +1 s), = torch+MemTracker import"
            f" + {one - med['import torch + MemTracker']:5.2f} s"
        )
    print(
        f"fork / spawn: one-case run {med['fork: 1 case'] / med['spawn: 1 case']:.2f}, "
        f"each added case {added['fork'] / max(1e-9, added['spawn']):.3f}"
    )


def figures(tmp: Path) -> None:
    """The shipped suite forked once and spawned twice: each case's figures compared. A case
    whose allocated peak differs between its two spawned runs (concurrent sessions in threads
    interleave differently) is nondeterministic either way, and said to be."""
    from memtrack.records import metrics, read_json

    repo = _repo(tmp / "shipped", {"README.md": "the shipped suite\n"})
    records = {}
    for way in ("fork", "spawn", "spawn again"):
        out = tmp / f"{way.replace(' ', '-')}.json"
        spawn = way != "fork"
        wall = _timed(_run(out), repo, _env(spawn))
        records[way] = read_json(out)
        print(f"shipped suite, {way}: {wall:.1f} s, {_spawned(out)} case(s) spawned")
    bad = 0
    mib = 2**20
    print(
        f"{'case':<44} {'allocated fork / spawn / spawn again':>38} "
        f"{'host MiB fork / spawn':>22} {'floor':>6}"
    )
    runs = zip(*(records[w].measurements for w in records), strict=True)
    for f, s, s2 in runs:
        assert f.case_id == s.case_id == s2.case_id
        hf, hs = metrics.value(f, "host"), metrics.value(s, "host")
        floor = metrics.floor("host", hs or 0)
        near = hf is not None and hs is not None and abs(hf - hs) <= floor
        ok = f.status == s.status == s2.status == "ok"
        if s.peak_allocated_bytes != s2.peak_allocated_bytes:
            verdict = "nondeterministic when spawned too"
        elif f.peak_allocated_bytes == s.peak_allocated_bytes and near and ok:
            verdict = "same"
        else:
            verdict, bad = "DIFFERENT", bad + 1
        print(
            f"{f.case_id[:44]:<44} {f.peak_allocated_bytes:>12} / {s.peak_allocated_bytes:>10} /"
            f" {s2.peak_allocated_bytes:>10} {(hf or 0) / mib:>10.1f} / {(hs or 0) / mib:<9.1f}"
            f" {floor / mib:>5.1f}  {verdict}"
        )
    n = len(records["fork"].measurements)
    print(f"{n - bad} of {n} shipped cases: allocated as when spawned, host within its floor")
    if bad:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="0: the figures alone")
    ap.add_argument("--cases", type=int, default=21, help="cases of the forked many-case run")
    ap.add_argument("--figures", action="store_true", help="also compare the shipped suite")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-") as tmp:
        if args.rounds > 0:
            starts(args.rounds, args.cases, Path(tmp))
        if args.figures:
            print()
            figures(Path(tmp))


if __name__ == "__main__":
    main()
