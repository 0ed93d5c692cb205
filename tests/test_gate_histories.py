"""The gate across the histories real teams make, on a real git repository and real
`memtrack run` processes measuring a small CPU suite: a regression merged, reverted and
re-landed (twice); a growth merged as the new level, then acceptances in pull requests'
commits (misspelt, without an amount, exact, exceeded) and a fix; an accepted step; a torch
upgrade (another environment); a leak; a changed param; a busy runner; concurrent sessions.

Each main commit is recorded and checked as the merge job does (`memtrack run`, then
`memtrack check`, which records the base branch's verdicts); a pull request is a branch
off main, checked as the gate checks it. Every test starts from one shared history of four
main commits (`main4`), and one that changes main does so in a copy of its own (`fresh`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import processes
import pytest
from factories import commit_all, git, init_repo

from memtrack.store.database import Store

pytestmark = pytest.mark.slow

WORKLOADS = """\
import torch

import memtrack

SCRATCH = {scratch}  # floats each step holds through its whole work
LEAK = {leak}  # floats each call keeps in a module-level list
WORK = {work}  # matrix products per step (its time)
SESSION = {session}  # floats each concurrent session allocates
KEPT = []


@memtrack.workload(params={{"batch": {batch}}})
def mlp(ctx):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    ctx.mark(model)
    x = ctx.randn(ctx["batch"], 64)
    a = ctx.randn(96, 96)

    def step():
        with torch.no_grad():
            pad = torch.ones(SCRATCH) if SCRATCH else None
            out = model(x)
            for _ in range(WORK):
                out = out + (a @ a).sum()
            if pad is not None:
                out = out + pad.sum()
            if LEAK:
                KEPT.append(torch.ones(LEAK))
        return out

    return step
{more}"""

EMBED = """

@memtrack.workload(params={"batch": 4})
def embed(ctx):
    table = torch.nn.Embedding(256, 32)
    ctx.mark(table)
    idx = ctx.randint(256, ctx["batch"], 8)
    return lambda: table(idx).sum()
"""

SERVE = """

@memtrack.workload(params={"concurrency": 4})
def serve(ctx):
    model = torch.nn.Linear(64, 64)
    ctx.mark(model)
    x = ctx.randn(8, 64)

    def session():
        with torch.no_grad():
            return (model(x).sum() + torch.ones(SESSION).sum())

    return session
"""

CONFIG = """\
modules = ["workloads.py"]
base_branch = "main"
warmup = 1
repeats = 3
timeout = "2 min"
"""

MORE = EMBED + SERVE  # the suite's other workloads
SESSION = 64 * 1024  # floats: 256 KiB per session
MLP, EMBED_CASE, SERVE_CASE = "mlp[batch=16]", "embed[batch=4]", "serve[concurrency=4]"
MiB = 2**20


class History:
    """A repository whose main branch is recorded commit by commit, and its database."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = root / "repo"
        self.db = root / "memtrack.db"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
        self.commits = 0
        self.report: dict[str, Any] = {}
        """The JSON report of the newest main commit's check."""

    def write(self, **code: Any) -> None:
        kw = {"scratch": 0, "leak": 0, "work": 1, "session": SESSION, "batch": 16, "more": MORE}
        kw.update(code)
        (self.repo / "workloads.py").write_text(WORKLOADS.format(**kw))
        self.commits += 1
        (self.repo / "CHANGES").write_text(f"change {self.commits}\n")  # a commit each time

    def memtrack(self, *args: str, env: dict[str, str] | None = None) -> Any:
        return subprocess.run(
            [sys.executable, "-m", "memtrack.cli", *args, "--db", str(self.db)],
            cwd=self.repo,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    def merge(self, message: str = "a change", env: dict[str, str] | None = None, **code: Any):
        """One commit on main, recorded and checked as the merge job does."""
        self.write(**code)
        sha = commit_all(self.repo, message)
        return sha, self.record_main(env)

    def record_main(self, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """main's newest commit recorded and checked as the merge job does."""
        run = self.memtrack("run", env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        report = self.root / f"main-{self.commits}.json"
        checked = self.memtrack("check", "--json", str(report), env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr  # main never blocks
        self.report = json.loads(report.read_text())
        return checked

    def pull_request(
        self,
        branch: str,
        message: str = "a change",
        env: dict[str, str] | None = None,
        **code: Any,
    ) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
        """A branch off main, measured and checked as the gate does: its exit status and
        the JSON report."""
        git(self.repo, "checkout", "-q", "-B", branch, "main")
        self.write(**code)
        commit_all(self.repo, message)
        run = self.memtrack("run", env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        report = self.root / f"{branch}.json"
        checked = self.memtrack("check", "--json", str(report), env=env)
        git(self.repo, "checkout", "-q", "main")
        assert checked.returncode in (0, 1), checked.stdout + checked.stderr
        return checked, json.loads(report.read_text())

    def copy(self, root: Path) -> History:
        shutil.copytree(self.repo, root / "repo")
        shutil.copy(self.db, root / "memtrack.db")
        other = History(root)
        other.commits = self.commits
        return other


def _verdicts(report: dict[str, Any], case: str = MLP, metric: str | None = None) -> list:
    return [
        v
        for v in report["verdicts"]
        if v["case_id"] == case and (metric is None or v["metric"] == metric)
    ]


def _one(report: dict[str, Any], metric: str, case: str = MLP) -> dict[str, Any]:
    (v,) = _verdicts(report, case, metric)
    return v


@pytest.fixture(scope="module")
def main4(tmp_path_factory: pytest.TempPathFactory) -> History:
    """Four commits of unchanged code on main, each recorded and checked."""
    h = History(tmp_path_factory.mktemp("main4"))
    init_repo(h.repo)
    (h.repo / "memtrack.toml").write_text(CONFIG)
    (h.repo / ".gitignore").write_text("__pycache__/\n")
    for _ in range(4):
        h.merge()
    return h


@pytest.fixture
def fresh(main4: History, tmp_path: Path) -> Iterator[History]:
    """A copy of `main4` of this test's own, to change main in."""
    yield main4.copy(tmp_path)


def test_a_reverted_regression_blocks_when_it_is_re_landed_every_time(fresh: History) -> None:
    h = fresh
    grown = 2 * MiB  # floats: 8 MiB kept beside the step's output
    _, merged = h.merge("keep a scratch buffer", scratch=grown)
    assert "REPORT regression" in merged.stdout  # the merge job reported it on main
    _, reverted = h.merge("Revert: keep a scratch buffer")
    assert "fixed by this run" in reverted.stdout
    for cycle in (1, 2):
        checked, report = h.pull_request(f"reland-{cycle}", "keep a scratch buffer", scratch=grown)
        v = _one(report, "allocated")
        assert checked.returncode == 1, checked.stdout
        assert (v["kind"], v["blocking"]) == ("regression", True), v["message"]
        # the step up and its revert are levels: the headroom is the allocator's floor
        assert v["threshold"] - v["baseline_value"] == 512, v["message"]
        assert v["delta"] == 8 * MiB
        if cycle == 1:  # merged again, and reverted again: the second cycle
            h.merge("Reland: keep a scratch buffer", scratch=grown)
            h.merge("Revert again")
    history = h.memtrack("check", "--history", "--json", str(h.root / "history.json"))
    steps = json.loads((h.root / "history.json").read_text())["steps"]
    moves = [s["delta"] for s in steps if s["case_id"] == MLP and s["metric"] == "allocated"]
    assert len(moves) == 4, history.stdout  # up, down, up, down
    assert [m > 0 for m in moves].count(True) == 2


def test_an_accepted_step_is_a_level_and_leaves_no_wide_headroom(fresh: History) -> None:
    h = fresh
    big = 16 * MiB  # floats: 64 MiB
    trailer = "grow the buffer\n\nMemtrack-Accept: mlp allocated +70 MiB the buffer is the feature"
    _, accepted = h.merge(trailer, scratch=big)
    assert "accepted" in accepted.stdout
    h.merge("docs", scratch=big)  # the first main run after the accepted step
    for metric in ("allocated", "host", "host_step"):
        v = _one(h.report, metric)
        # the accepted 64 MiB step is a level, not noise: no wide window opens behind it
        assert v["kind"] != "noisy" and v["threshold"] - v["baseline_value"] < 16 * MiB, v
    checked, report = h.pull_request("more", "grow it a little more", scratch=big + 256 * 1024)
    v = _one(report, "allocated")
    assert (v["kind"], v["blocking"]) == ("regression", True), v["message"]
    assert v["threshold"] - v["baseline_value"] == 512
    for metric in ("host", "host_step"):
        v = _one(report, metric)
        # the accepted 64 MiB step is a level, not noise: the headroom stays small
        assert v["threshold"] - v["baseline_value"] < 16 * MiB, v["message"]


def test_after_an_environment_change_a_small_growth_blocks_on_the_first_run(
    fresh: History,
) -> None:
    h = fresh
    upgraded = {**h.env, "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}  # another fingerprint
    h.merge("upgrade the runner", env=upgraded)
    # +2 % of the step's ~105 KiB peak: a figure that never varied is no noisier after it
    checked, report = h.pull_request("grow", "a little more", env=upgraded, scratch=512)
    v = _one(report, "allocated")
    assert checked.returncode == 1, v["message"]
    assert (v["kind"], v["blocking"], v["provisional"]) == ("regression", True, False)
    assert "other environments" in v["message"]
    assert 0.01 < v["delta_pct"] / 100 < 0.05


def test_a_leak_blocks_as_a_leak_and_is_not_noise(main4: History) -> None:
    checked, report = main4.pull_request("leak", "keep every logit", leak=1600)  # 6,400 B
    assert checked.returncode == 1
    (v,) = [v for v in _verdicts(report) if v["kind"] == "leak"]
    assert v["blocking"] and "+6,400 B per iteration" in v["message"], v["message"]
    # the leak's growth from repeat to repeat is not the repeat spread of the allocated view
    assert _one(report, "allocated")["noise"] == 0  # the leak is not noise


def test_a_changed_param_is_compared_with_the_case_it_replaces(main4: History) -> None:
    checked, report = main4.pull_request("batch", "double the batch", batch=32, more=SERVE)
    assert checked.returncode == 1
    v = _one(report, "allocated", "mlp[batch=32]")
    assert (v["kind"], v["blocking"]) == ("regression", True), v["message"]
    assert v["compared_with"] == MLP and v["param_change"] == "batch 16 -> 32"
    assert "mlp batch 16 -> 32: allocated +" in report["summary"]
    assert "mlp batch 16 -> 32" in checked.stdout
    # the workload that went away is said, not folded into a note
    (gone,) = _verdicts(report, EMBED_CASE)
    assert (gone["kind"], gone["blocking"]) == ("removed", False)
    assert "removed" in checked.stdout


def test_time_is_not_judged_on_a_contended_machine(main4: History) -> None:
    # 0.5 s: let them take the cores before the case starts
    with processes.busy_loops(2 * (os.cpu_count() or 1) + 2, settle_s=0.5):
        checked, report = main4.pull_request("docs", "a docstring")
    v = _one(report, "time")
    assert (v["kind"], v["blocking"]) == ("abstained", False), v["message"]
    assert "contended" in v["message"]
    assert checked.returncode == 0


def test_a_concurrent_case_is_judged_on_the_sum_of_its_sessions(main4: History) -> None:
    _, same = main4.pull_request("same", "a docstring")
    assert not any(v["blocking"] for v in same["verdicts"])
    for metric in ("allocated", "sessions"):  # judged, not waved through as noisy
        v = _one(same, metric, SERVE_CASE)
        assert v["kind"] in ("ok", "improvement"), v["message"]
    checked, report = main4.pull_request("grow", "ten per cent more", session=SESSION * 11 // 10)
    assert checked.returncode == 1
    v = _one(report, "sessions", SERVE_CASE)
    assert (v["kind"], v["blocking"]) == ("regression", True), v["message"]
    with Store.open(main4.db) as store:
        run = store.get_run(store.run_ids(limit=1)[0])
    (m,) = [m for m in run.measurements if m.case_id == SERVE_CASE]
    assert m.session_peak_bytes <= m.peak_allocated_bytes <= m.sessions_sum_bytes


def test_a_merged_growth_is_the_level_that_acceptances_and_a_fix_are_judged_against(
    fresh: History,
) -> None:
    h, floats = fresh, MiB // 4  # floats: 1 MiB
    # A pull request keeping 1 MiB more blocks. Its acceptances are misdirected (a workload
    # misspelt) or malformed (no amount): each is said, and neither guards anything.
    trailers = (
        "Memtrack-Accept: mlps allocated +1 MiB typo in the name\n"
        "Memtrack-Accept: mlp allocated lots no amount"
    )
    checked, report = h.pull_request("grow", f"keep 1 MiB more\n\n{trailers}", scratch=floats)
    v = _one(report, "allocated")
    assert (checked.returncode, v["kind"], v["delta"]) == (1, "regression", MiB), v["message"]
    notes = " ".join(report["notes"])
    assert "names 'mlps', which is no workload or case of this run (nearest: mlp)" in notes
    assert "'mlp allocated lots no amount' is not" in notes

    # merged all the same: main runs once at the new level, reported and not blocking
    git(h.repo, "merge", "-q", "--no-ff", "-m", "merge grow", "grow")
    h.record_main()
    v = _one(h.report, "allocated")
    assert (h.report["context"], v["kind"], v["blocking"]) == ("base", "regression", False)

    # the same growth again is judged against the new level, its one run, not widened by the step
    checked, report = h.pull_request("grow-again", "keep 2 MiB", scratch=2 * floats)
    v = _one(report, "allocated")
    assert (checked.returncode, v["kind"], v["delta"], v["baseline_runs"]) == (
        1,
        "regression",
        MiB,
        1,
    ), v["message"]
    assert v["baseline_value"] == v["candidate_value"] - MiB
    assert v["threshold"] == v["baseline_value"] + 512

    accept = "Memtrack-Accept: mlp allocated +1 MiB longer context is the feature"
    checked, report = h.pull_request(
        "accepted", f"a longer context\n\n{accept}", scratch=2 * floats
    )
    v = _one(report, "allocated")
    assert (checked.returncode, v["kind"], v["blocking"]) == (0, "accepted", False), v["message"]
    assert v["accepted_reason"] == "longer context is the feature"

    accept = "Memtrack-Accept: mlp allocated +1 MiB longer context"
    checked, report = h.pull_request("too-much", f"much longer\n\n{accept}", scratch=3 * floats)
    v = _one(report, "allocated")
    assert (checked.returncode, v["kind"], v["delta"]) == (1, "regression", 2 * MiB)
    assert "beyond the +1.00 MiB accepted" in v["message"]

    checked, report = h.pull_request("fix", "free the buffer")
    v = _one(report, "allocated")
    assert (checked.returncode, v["kind"], v["delta"]) == (0, "improvement", -MiB), v["message"]
