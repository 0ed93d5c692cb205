"""What does `pytest --memtrack` cost a suite of small tests? A generated suite of 200 small
torch tests (a small model's forward, a few MiB each) in a fresh git repository is run
three ways, alternately, each run a fresh pytest process: without memtrack's plugin, with
it loaded but not asked (as an installed memtrack loads it in every pytest session), and
with `--memtrack` (every test measured, one run recorded). The medians are printed side by
side with their ratios to the run without the plugin. Goal: at most +10 %.

    python scripts/bench_plugin.py              # 200 tests, 10 rounds
    python scripts/bench_plugin.py --tests 500 --rounds 5

Two figures per run: the session as pytest times it ("N passed in X s": collection, the
tests and, with --memtrack, recording the run at the session's end) and the process's
wall time (Python's and torch's imports included, and what the plugin does before the
session: the config, the database and the git facts).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SUITE = """\
import pytest
import torch

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))


@pytest.mark.parametrize("case", range({tests}))
def test_small(case):
    x = torch.randn(32 + case % 8, 64)
    with torch.no_grad():
        y = MODEL(x)
    assert y.shape == (x.shape[0], 64)
    assert torch.isfinite(y).all()
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_project(folder: Path, tests: int) -> Path:
    repo = folder / "suite"
    repo.mkdir()
    (repo / "test_suite.py").write_text(SUITE.format(tests=tests))
    (repo / "memtrack.toml").write_text('database = "data/memtrack.db"\n')
    (repo / ".gitignore").write_text("data/\n__pycache__/\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(
        repo,
        "-c",
        "user.name=bench",
        "-c",
        "user.email=bench@example.invalid",
        "commit",
        "-qm",
        "a suite",
    )
    return repo


WAYS = {
    "without": [],
    "loaded": ["-p", "memtrack.plugin.hooks"],
    "--memtrack": ["-p", "memtrack.plugin.hooks", "--memtrack"],
}
"""The three ways a run is made: without the plugin, loaded but not asked, measuring."""


def run_once(repo: Path, way: str) -> tuple[float, float]:
    """(pytest's session seconds, the process's wall seconds)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *WAYS[way]]
    start = time.perf_counter()
    out = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    found = re.search(r"(\d+) passed in ([0-9.]+)s", out.stdout)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"the suite did not pass:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return float(found.group(2)), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-plugin-") as tmp:
        repo = make_project(Path(tmp), a.tests)
        run_once(repo, "--memtrack")  # a first run warms the page cache and makes the db
        runs: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for _ in range(a.rounds):
            for way in WAYS:  # side by side: the machine's load falls on every way
                runs[way].append(run_once(repo, way))
    print(f"{a.tests} small tests, {a.rounds} rounds; medians, and the median of each round's")
    print("ratio to the run without the plugin (the runs of a round are side by side):")
    print(f"{'':24} {'without':>9} {'loaded':>9} {'--memtrack':>11} {'loaded':>8} {'--mt':>8}")
    for i, what in enumerate(("pytest's session (s)", "process wall time (s)")):
        plain, loaded, tracked = (statistics.median(r[i] for r in runs[w]) for w in WAYS)
        ratio = {
            w: statistics.median(b[i] / a[i] for a, b in zip(runs["without"], runs[w], strict=True))
            for w in ("loaded", "--memtrack")
        }
        print(
            f"{what:24} {plain:9.3f} {loaded:9.3f} {tracked:11.3f} "
            f"{ratio['loaded']:8.3f} {ratio['--memtrack']:8.3f}"
        )
    session = {w: statistics.median(r[0] for r in runs[w]) for w in WAYS}
    per_test = (session["--memtrack"] - session["without"]) / a.tests
    print(f"cost per test, session: {per_test * 1e3:.2f} ms (goal: ratios <= 1.10)")


if __name__ == "__main__":
    main()
