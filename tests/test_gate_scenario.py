"""A history played end to end: a real git repository, real `memtrack run`s of a small CPU
workload, `memtrack check` after each, as a team's CI would.

main is recorded three times; a +1 MiB regression PR blocks (acceptances in its commit that
misspell the workload or give no amount are said, and guard nothing); it is merged and main runs
once at the new level (reported, not blocking); a second identical growth blocks and is
judged against the new level; a comment-only PR passes; a PR that accepts its growth in a
commit trailer passes as `accepted`, one that grows past what it accepted blocks; a fix
shows as an improvement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from factories import GIT_ENV, commit_all, git, init_repo

MiB = 2**20

WORKLOAD = """\
import torch
import memtrack
from growth import EXTRA_MIB

@memtrack.workload
def decode(ctx):
    torch.set_num_threads(1)
    w = torch.nn.Linear(256, 256)
    ctx.mark(w)
    x = ctx.randn(32, 256)

    def step():
        extra = torch.ones(EXTRA_MIB * 2**18)  # float32: EXTRA_MIB MiB kept alive in the step
        return w(x).sum() + extra.sum()

    return step
"""

CONFIG = """\
modules = ["workloads.py"]
base_branch = "main"
repeats = 3
time_regression = "off"
"""


class Project:
    def __init__(self, repo: Path, db: Path):
        self.repo, self.db = repo, db
        self.minute = 0

    def commit(self, message: str, extra: int | None = None, note: str | None = None) -> str:
        if extra is not None:
            (self.repo / "growth.py").write_text(f"EXTRA_MIB = {extra}\n")
        if note is not None:
            with open(self.repo / "workloads.py", "a") as f:
                f.write(f"# {note}\n")
        self.minute += 1
        stamp = f"2026-01-01T00:{self.minute:02d}:00+00:00"
        os.environ["GIT_COMMITTER_DATE"] = os.environ["GIT_AUTHOR_DATE"] = stamp
        return commit_all(self.repo, message)

    def memtrack(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **GIT_ENV, "MEMTRACK_DB": str(self.db)}
        return subprocess.run(
            [sys.executable, "-m", "memtrack.cli", *args],
            cwd=self.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def run_and_check(self) -> tuple[int, dict, dict]:
        run = self.memtrack("run")
        assert run.returncode == 0, run.stderr
        out = self.repo.parent / "verdict.json"
        checked = self.memtrack("check", "--json", str(out))
        assert checked.returncode in (0, 1), checked.stderr
        report = json.loads(out.read_text())
        (allocated,) = [v for v in report["verdicts"] if v["metric"] == "allocated"]
        return checked.returncode, allocated, report


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    for k in ("GIT_COMMITTER_DATE", "GIT_AUTHOR_DATE"):
        monkeypatch.setenv(k, "2026-01-01T00:00:00+00:00")
    repo = init_repo(tmp_path / "repo")
    (repo / "workloads.py").write_text(WORKLOAD)
    (repo / "memtrack.toml").write_text(CONFIG)
    (repo / ".gitignore").write_text("data/\n")
    return Project(repo, tmp_path / "memtrack.db")


@pytest.mark.slow
def test_a_history_of_merges_keeps_the_gate_sharp(project: Project):
    p = project
    for i in range(3):
        p.commit(f"main {i}", extra=0, note=f"main {i}")
        assert p.memtrack("run").returncode == 0

    git(p.repo, "checkout", "-q", "-b", "grow")
    # Its acceptances are malformed or misdirected (a workload misspelt, no amount): each is
    # said, and neither guards anything
    p.commit(
        "keep 1 MiB more alive\n\nMemtrack-Accept: decod allocated +1 MiB typo in the name\n"
        "Memtrack-Accept: decode allocated lots no amount",
        extra=1,
    )
    code, v, report = p.run_and_check()
    assert (code, v["kind"], v["delta"]) == (1, "regression", MiB)
    notes = " ".join(report["notes"])
    assert "names 'decod', which is no workload or case of this run (nearest: decode)" in notes
    assert "'decode allocated lots no amount' is not" in notes

    git(p.repo, "checkout", "-q", "main")
    git(p.repo, "merge", "-q", "--no-ff", "-m", "merge grow", "grow")
    code, v, report = p.run_and_check()  # main runs once at the new level
    assert (code, report["context"], v["kind"], v["blocking"]) == (0, "base", "regression", False)

    git(p.repo, "checkout", "-q", "-b", "grow-again")
    p.commit("keep 2 MiB alive", extra=2)
    code, v, _ = p.run_and_check()
    assert (code, v["kind"], v["delta"], v["baseline_runs"]) == (1, "regression", MiB, 1)
    assert v["baseline_value"] == v["candidate_value"] - MiB  # judged against the new level
    assert v["threshold"] == v["baseline_value"] + 512  # not widened by the step

    git(p.repo, "checkout", "-q", "main")
    git(p.repo, "checkout", "-q", "-b", "comment")
    p.commit("explain the workload", note="a comment only")
    code, v, report = p.run_and_check()
    assert (code, v["kind"]) == (0, "ok"), report["summary"]

    git(p.repo, "checkout", "-q", "main")
    git(p.repo, "checkout", "-q", "-b", "accepted")
    p.commit(
        "a longer context\n\nMemtrack-Accept: decode allocated +1 MiB longer context "
        "is the feature",
        extra=2,
    )
    code, v, _ = p.run_and_check()
    assert (code, v["kind"], v["blocking"]) == (0, "accepted", False)
    assert v["accepted_reason"] == "longer context is the feature"

    git(p.repo, "checkout", "-q", "main")
    git(p.repo, "checkout", "-q", "-b", "too-much")
    p.commit(
        "a much longer context\n\nMemtrack-Accept: decode allocated +1 MiB longer context", extra=3
    )
    code, v, _ = p.run_and_check()
    assert (code, v["kind"], v["delta"]) == (1, "regression", 2 * MiB)
    assert "beyond the +1.00 MiB accepted" in v["message"]

    git(p.repo, "checkout", "-q", "main")
    git(p.repo, "checkout", "-q", "-b", "fix")
    p.commit("free the buffer", extra=0)
    code, v, _ = p.run_and_check()
    assert (code, v["kind"], v["delta"]) == (0, "improvement", -MiB)
