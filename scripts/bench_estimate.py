"""`memtrack estimate` against `memtrack run`: every shipped example case, on the CPU.

In a temporary git repository using the shipped suite (memtrack/examples) and a temporary
database, `memtrack run` measures every case, then `memtrack estimate` estimates them at
the same commit; then one more commit (a file that no workload reads) is estimated
again. Prints, per case: the measured framework peak, the estimate without kernel scratch
(the fake tensors alone), the estimate calibrated at the same commit (the measured peak
less the fake tensors: equal to the measured figure by construction wherever the fake
tensors do not exceed it), and calibrated from other code (the run's own scratch beyond
the tensors it tracked: what a later commit's estimate adds), each as a ratio to the
measured peak. Goal: every calibrated ratio within 5 % of 1.

    python scripts/bench_estimate.py [-k PATTERN ...] [--keep]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from memtrack.records import Measurement, RunRecord
from memtrack.store.database import Store
from memtrack.units import format_size

CONFIG = """\
[tool.memtrack]
modules = ["memtrack.examples"]
database = "memtrack.db"
device = "cpu"
"""
GOAL = 0.05


def memtrack(repo: Path, *args: str) -> None:
    """One memtrack command in the repository, as a user runs it; its output on failure."""
    done = subprocess.run(
        [sys.executable, "-c", "from memtrack.cli import main; main()", *args],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"memtrack {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", message)


def runs(db: Path) -> tuple[RunRecord, RunRecord, RunRecord]:
    """The measured run, the estimate of its commit and the estimate of the next commit."""
    with Store.open(db, readonly=True) as store:
        found = [store.get_run(r) for r in reversed(store.run_ids())]
    measured = [r for r in found if r.measurements and r.measurements[0].kind == "measured"]
    estimates = [r for r in found if r.measurements and r.measurements[0].kind == "estimate"]
    return measured[-1], estimates[0], estimates[-1]


def ratio(figure: int | None, measured: int | None) -> str:
    return "-" if figure is None or not measured else f"{figure / measured:.3f}"


def row(m: Measurement, same: Measurement | None, later: Measurement | None) -> list[str]:
    def uncalibrated(e: Measurement | None) -> int | None:
        if e is None or e.peak_allocated_bytes is None:
            return None
        return e.peak_allocated_bytes - (e.scratch_bytes or 0)

    def calibrated(e: Measurement | None) -> int | None:
        ok = e is not None and e.scratch_bytes is not None
        return e.peak_allocated_bytes if ok and e is not None else None

    peak = m.peak_allocated_bytes
    fake, at, after = uncalibrated(same), calibrated(same), calibrated(later)
    return [
        m.case_id.replace("d_model=128,dtype=float32,", ""),
        format_size(peak),
        format_size(fake) if fake is not None else (same.message or "-")[:40] if same else "-",
        format_size(at),
        format_size(after),
        ratio(fake, peak),
        ratio(at, peak),
        ratio(after, peak),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="patterns", action="append", default=[], help="case pattern")
    ap.add_argument("--keep", action="store_true", help="keep the repository and database")
    args = ap.parse_args()
    patterns = [a for p in args.patterns for a in ("-k", p)]
    folder = Path(tempfile.mkdtemp(prefix="memtrack-bench-estimate-"))
    repo = folder / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "pyproject.toml").write_text(CONFIG)
    (repo / ".gitignore").write_text("memtrack.db*\n")
    commit(repo, "the shipped suite")
    memtrack(repo, "run", *patterns)
    memtrack(repo, "estimate", *patterns)
    (repo / "NOTES.md").write_text("a change no workload reads\n")
    commit(repo, "other code")
    memtrack(repo, "estimate", *patterns)
    measured, same, later = runs(repo / "memtrack.db")
    by_case = [
        (m, {e.case_id: e for e in same.measurements}, {e.case_id: e for e in later.measurements})
        for m in measured.measurements
        if m.status == "ok"
    ]
    head = [
        "case",
        "measured",
        "estimate (tensors)",
        "calibrated",
        "calibrated (other code)",
        "tensors / m",
        "calibrated / m",
        "other code / m",
    ]
    rows = [head] + [row(m, s.get(m.case_id), o.get(m.case_id)) for m, s, o in by_case]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    misses = [
        r[0] for r in rows[1:] if any(x == "-" or abs(float(x) - 1) > GOAL for x in (r[6], r[7]))
    ]
    print(f"goal: calibrated within {GOAL:.0%} of the measured peak on every case")
    print("met" if not misses else f"missed on {len(misses)}: {', '.join(misses)}")
    for m in later.measurements:
        if m.status != "ok":
            print(f"not estimated: {m.case_id}: {m.message}")
    if args.keep:
        print(f"kept: {repo}")


if __name__ == "__main__":
    main()
