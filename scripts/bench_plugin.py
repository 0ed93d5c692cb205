"""What does `pytest --memtrack` cost a suite of small tests? A generated suite of 200 small
torch tests (a small model's forward, a few MiB each) in a fresh git repository is run
with and without `--memtrack`, alternately, each run a fresh pytest process, and the
medians are printed side by side with their ratio. Goal: at most +10 %.

    python scripts/bench_plugin.py              # 200 tests, 3 rounds
    python scripts/bench_plugin.py --tests 500 --rounds 5

Two figures per run: the session as pytest times it ("N passed in X s": collection, the
tests and, with --memtrack, recording the run) and the process's wall time (torch's import
included, which the plugin does not change). The environment probe that `--memtrack`
starts runs beside the tests, in its own process.
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


def run_once(repo: Path, memtrack: bool) -> tuple[float, float]:
    """(pytest's session seconds, the process's wall seconds)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    args += ["-p", "memtrack.plugin.hooks", *(["--memtrack"] if memtrack else [])]
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
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-plugin-") as tmp:
        repo = make_project(Path(tmp), a.tests)
        run_once(repo, False)  # a first run warms the page cache for both
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(a.rounds):
            for memtrack in (False, True):  # side by side: the machine's load falls on both
                runs[memtrack].append(run_once(repo, memtrack))
    print(f"{a.tests} small tests, {a.rounds} rounds, median of each:")
    print(f"{'':28} {'plain':>10} {'--memtrack':>12} {'ratio':>8}")
    for i, what in enumerate(("pytest's session (s)", "process wall time (s)")):
        plain = statistics.median(r[i] for r in runs[False])
        tracked = statistics.median(r[i] for r in runs[True])
        print(f"{what:28} {plain:10.2f} {tracked:12.2f} {tracked / plain:8.3f}")
    per_test = (
        statistics.median(r[0] for r in runs[True]) - statistics.median(r[0] for r in runs[False])
    ) / a.tests
    print(f"cost per test: {per_test * 1e3:.2f} ms (goal: session ratio <= 1.10)")


if __name__ == "__main__":
    main()
