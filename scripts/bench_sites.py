"""Do the sites at the peak move the gated figures, and do they sum to the peak?

Runs the shipped example suite (`memtrack run`, the CPU) with this checkout, which measures
each case's sites in a pass of its own after the measured ones, and with a commit before
that pass existed (--against, default eec0433), side by side, each into a fresh repository
and database; prints each case's gated figures from both (allocated is exact on the CPU;
a concurrent case's moves with how its threads interleave; the host step's peak moves run
to run by the heap's page reuse: both are printed, not compared), the
run's wall time from both, and how far each grouping of the sites is from the measured peak.

    python scripts/bench_sites.py [--against REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def _tree(work: Path, rev: str) -> Path:
    """The tracked files of commit `rev`, unpacked under `work`."""
    tree = work / f"tree-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def run_suite(work: Path, name: str, pythonpath: Path) -> tuple[dict[str, dict], float]:
    """The shipped suite's measurements by case id, and the run's wall seconds."""
    repo = work / f"repo-{name}"
    repo.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(pythonpath),
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True, env=env
    )
    out = work / f"{name}.json"
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "memtrack.cli",
            "run",
            "--json",
            str(out),
            "--db",
            str(work / f"{name}.db"),
        ],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    return {m["case_id"]: m for m in json.loads(out.read_text())["measurements"]}, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="eec0433", help="a commit before the sites pass")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-sites-") as tmp:
        work = Path(tmp)
        before, wall_before = run_suite(work, "before", _tree(work, args.against))
        after, wall_after = run_suite(work, "after", ROOT)
    print(f"{'case':<60} {'allocated':>24} {'host_step':>24}  sites / peak (module, source, pair)")
    same = True
    for case, m in after.items():
        b = before.get(case, {})
        alloc = (b.get("peak_allocated_bytes"), m.get("peak_allocated_bytes"))
        host = (b.get("host_step_peak_rss_bytes"), m.get("host_step_peak_rss_bytes"))
        if "concurrency" not in m.get("params", {}):  # sessions interleave run to run
            same &= alloc[0] == alloc[1]
        peak = m.get("peak_allocated_bytes") or 0
        ratios = []
        for grouping in ("module", "source", "pair"):
            total = sum(s["size_bytes"] for s in m.get("sites", []) if s["grouping"] == grouping)
            ratios.append(f"{total / peak:.4f}" if peak else "-")

        def mib(pair: tuple) -> str:
            return " -> ".join("-" if v is None else f"{v / MiB:.2f}" for v in pair)

        print(f"{case[:60]:<60} {mib(alloc):>24} {mib(host):>24}  {', '.join(ratios)}")
    print(
        "allocated the same with and without the sites pass, on every case but the "
        f"concurrent one (its threads interleave differently run to run): {same}"
    )
    print(
        f"wall time of the whole run: {wall_before:.1f} s -> {wall_after:.1f} s "
        f"({wall_after / wall_before:.2f}), the sites pass included"
    )


if __name__ == "__main__":
    main()
