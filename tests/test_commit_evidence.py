"""The gate judges commits, not runs: every run recorded for a commit is its evidence (the
suite, the tests under `pytest --memtrack`, re-runs), baselines walk the base branch's
commits in git's order (never the clock of a run), `removed` means removed, a test keeps one
series whatever pytest's rootdir, a failure is never silence, and a concurrent case reads no
improvement inside its own noise. On real git repositories, real `memtrack run` and pytest
processes, and `memtrack check` as CI runs it."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from factories import commit_all, git, init_repo, make_measurement, make_run

from memtrack.store.database import Store

MiB = 2**20

WORKLOADS = """\
import torch

import memtrack

WIDTH = {width}  # MiB the step holds


@memtrack.workload(params={{"batch": 1}})
def step(ctx):
    model = torch.nn.Linear(8, 8)
    ctx.mark(model)

    def run():
        held = torch.ones(WIDTH * 256 * 1024)
        return float(held[0])

    return run
"""

MODEL = """\
import torch


def work(blocks):
    kept = [torch.ones(256 * 1024) for _ in range(blocks)]  # 1 MiB each, all alive at once
    return sum(float(k[0]) for k in kept)
"""

TESTS = """\
from model import work


def test_work():
    assert work({blocks}) == {blocks}


def test_small():
    assert work(1) == 1
"""

CONFIG = """\
modules = ["perf/workloads.py"]
database = "data/m.db"
base_branch = "main"
min_baseline_runs = 2
time_regression = "off"
warmup = 1
repeats = 3
"""

STEP = "step[batch=1]"
WORK = "tests/test_model.py::test_work"


class Project:
    """A repository whose main branch is measured by its suite and by its tests."""

    def __init__(self, root: Path):
        self.repo = init_repo(root / "repo")
        self.db = self.repo / "data" / "m.db"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
        self.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        # the tested module, from any folder
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(self.repo), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        (self.repo / "perf").mkdir()
        (self.repo / "tests").mkdir()
        (self.repo / "memtrack.toml").write_text(CONFIG)
        (self.repo / ".gitignore").write_text("data/\n__pycache__/\n*.json\n*.md\n")
        (self.repo / "model.py").write_text(MODEL)
        self.write(width=2, blocks=4)

    def write(self, *, width: int, blocks: int) -> None:
        (self.repo / "perf" / "workloads.py").write_text(WORKLOADS.format(width=width))
        (self.repo / "tests" / "test_model.py").write_text(TESTS.format(blocks=blocks))

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=cwd or self.repo,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def suite(self, *args: str) -> None:
        done = self.run("-m", "memtrack.cli", "run", *args)
        assert done.returncode == 0, done.stderr

    def tests(self, *args: str, cwd: Path | None = None) -> None:
        plugin = ("-m", "pytest", "-p", "memtrack.plugin.hooks", "-p", "no:cacheprovider")
        db = ("--memtrack-db", str(self.db), "--memtrack-config", str(self.repo / "memtrack.toml"))
        done = self.run(*plugin, "--memtrack", *db, *args, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr

    def check(self, *args: str) -> tuple[int, dict[str, Any], str]:
        out = self.repo / "verdict.json"
        done = self.run("-m", "memtrack.cli", "check", "--json", str(out), *args)
        assert done.returncode in (0, 1), done.stderr
        return done.returncode, json.loads(out.read_text()), done.stdout

    def main(self, message: str, **code: int) -> str:
        """A commit on main, measured by the suite and by the tests, checked as a push."""
        if code:
            self.write(**code)
        (self.repo / "CHANGES").write_text(message)
        sha = commit_all(self.repo, message)
        self.suite()
        self.tests("tests")
        self.check()
        return sha


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """Two commits on main, each measured by `memtrack run` and `pytest --memtrack`."""
    p = Project(tmp_path_factory.mktemp("evidence"))
    p.main("a suite and its tests")
    p.main("a second commit")
    return p


@pytest.fixture
def branch(project: Project) -> Any:
    """A pull request's branch off main, back to main afterwards."""
    made: list[str] = []

    def checkout(name: str) -> Project:
        git(project.repo, "checkout", "-q", "-b", name, "main")
        made.append(name)
        return project

    yield checkout
    git(project.repo, "checkout", "-q", "-f", "main")
    for name in made:
        git(project.repo, "branch", "-q", "-D", name)


def _verdicts(report: dict[str, Any], kind: str | None = None) -> list[dict[str, Any]]:
    return [v for v in report["verdicts"] if kind is None or v["kind"] == kind]


def test_a_test_run_after_the_suite_does_not_hide_the_suites_regression(branch) -> None:
    # 1: the suite records +1 MiB, then the CI step `pytest --memtrack` records the tests
    # as a second run of the same commit: the commit is judged, both runs its evidence.
    p = branch("widen")
    p.write(width=3, blocks=4)
    commit_all(p.repo, "widen the step")
    p.suite()
    p.tests("tests")
    code, report, out = p.check()
    assert code == 1, out
    (grew,) = [v for v in _verdicts(report, "regression") if v["case_id"] == STEP]
    assert grew["metric"] == "allocated" and grew["blocking"] and grew["delta"] >= MiB
    # 2: and nothing of either kind of run reads as removed
    assert _verdicts(report, "removed") == [], out
    assert {v["case_id"] for v in report["verdicts"]} >= {STEP, WORK}
    assert report["summary"].startswith("BLOCKED: 1 blocking verdict (1 regression)")
    # whichever ran last: the tests again (a re-run job), the same verdict
    p.tests("tests")
    code, again, out = p.check()
    assert code == 1 and again["summary"] == report["summary"], out


def test_the_other_kind_of_run_or_a_selection_is_not_measured_here_never_removed(branch):
    # 2: a pull request measured by its tests only, then by the suite with -k: none of
    # main's cases reads as removed; what was not measured is said once, in a note
    p = branch("tests-only")
    (p.repo / "CHANGES").write_text("a comment")
    commit_all(p.repo, "a comment")
    p.tests("tests")
    code, report, out = p.check()
    assert code == 0 and _verdicts(report, "removed") == [], out
    assert any(STEP in n and "not in this" in n for n in report["notes"]), report["notes"]
    p.suite("-k", "step")
    code, report, out = p.check()
    assert code == 0 and _verdicts(report, "removed") == [], out
    # a test deleted from a file the tests still ran: removed, for that file only
    (p.repo / "tests" / "test_model.py").write_text(
        "from model import work\n\n\ndef test_work():\n    assert work(4) == 4\n"
    )
    commit_all(p.repo, "drop a test")
    p.suite()
    p.tests("tests")
    code, report, out = p.check()
    assert [v["case_id"] for v in _verdicts(report, "removed")] == [
        "tests/test_model.py::test_small"
    ], out


def test_a_test_keeps_its_series_whatever_pytests_rootdir(branch, project) -> None:
    # 3: the same tests from the parent folder, pytest's rootdir there: still the
    # repository's ids, so a doubling of a test's memory is judged against its series
    p = branch("rootdir")
    p.write(width=2, blocks=8)
    commit_all(p.repo, "double the work")
    p.suite()
    p.tests(str(p.repo / "tests"), "--rootdir", str(p.repo.parent), cwd=p.repo.parent)
    code, report, out = p.check()
    assert code == 1, out
    assert _verdicts(report, "new") == [] and _verdicts(report, "removed") == [], out
    (grew,) = [v for v in _verdicts(report, "regression") if v["case_id"] == WORK]
    assert grew["delta"] == 4 * MiB


def test_older_records_of_a_test_under_another_rootdir_are_its_series(tmp_path) -> None:
    # 3: records made before tests were named by the repository hold pytest's node ids
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\nmin_baseline_runs = 2\n')
    db = tmp_path / "m.db"
    shas = []
    for i in range(3):
        (repo / "f").write_text(str(i))
        shas.append(commit_all(repo, f"c{i}"))
    old = f"repo/{WORK}"  # recorded with the parent folder as rootdir
    with Store.open(db) as store:
        for i, sha in enumerate(shas[:2]):
            m = replace(make_measurement(old, {}, peak=12 * MiB), case_id=old, params={})
            store.write_run(make_run([m], commit=sha, started_at=f"2026-01-0{i + 1}T00:00:00Z"))
        grown = replace(make_measurement(WORK, {}, peak=24 * MiB), case_id=WORK, params={})
        pr = make_run([grown], commit=shas[2], branch="pr", merge_base=shas[1])
        store.write_run(pr)
    done = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "check", "--run", pr.run_id, "--db", str(db)],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout
    assert f"BLOCK regression · {WORK} · allocated: baseline 12.00 MiB" in done.stdout


def _pull_request(repo: Path) -> str:
    """A commit on a branch off main's newest: the pull request's head."""
    git(repo, "checkout", "-q", "-b", "pr")
    (repo / "f").write_text("the pull request")
    return commit_all(repo, "the pull request")


def _history(tmp_path: Path, figures: list[tuple[int, list[int]]]) -> tuple[Path, Path, list]:
    """A repository of commits on main and a database holding, per commit, a run of each
    figure (in quarters of a MiB, of `w`), in the order given: (commit index, [figures])."""
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\nmin_baseline_runs = 2\n')
    shas = []
    for i in range(1 + max(c for c, _ in figures)):
        (repo / "f").write_text(str(i))
        shas.append(commit_all(repo, f"commit {i}"))
    db = tmp_path / "m.db"
    with Store.open(db) as store:
        for minute, (c, peaks) in enumerate(figures):
            for peak in peaks:
                run = make_run(
                    [make_measurement("w", peak=peak * MiB // 4)],
                    commit=shas[c],
                    started_at=f"2026-01-01T00:{minute:02d}:00+00:00",
                )
                store.write_run(run)
    return repo, db, shas


def _check(repo: Path, db: Path, run_id: str, *more: str) -> tuple[int, dict[str, Any], str]:
    out = repo.parent / "verdict.json"
    done = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "check", "--run", run_id, "--db", str(db)]
        + ["--json", str(out), *more],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(out.read_text()), done.stdout


def test_a_late_re_run_of_an_old_commit_joins_that_commit_never_the_newest_level(tmp_path):
    # 4: main at 1 MiB (commit 0), then +2 MiB (commits 1 and 2, two runs each), then a
    # re-run job of commit 0 started last: the level is still commit 2's
    repo, db, shas = _history(tmp_path, [(0, [4, 4]), (1, [12, 12]), (2, [12]), (0, [4])])
    with Store.open(db) as store:
        pr = make_run(
            [make_measurement("w", peak=16 * MiB // 4)],
            commit=_pull_request(repo),
            branch="pr",
            merge_base=shas[2],
            started_at="2026-01-01T01:00:00+00:00",
        )
        store.write_run(pr)
    code, report, out = _check(repo, db, pr.run_id)
    (v,) = [v for v in report["verdicts"] if v["metric"] == "allocated"]
    assert code == 1 and v["kind"] == "regression" and v["baseline_value"] == 3 * MiB, out
    assert v["noise"] == 0  # the re-run is its own commit's, not noise of the level


def test_a_case_that_fails_on_both_sides_is_named_in_every_headline(tmp_path) -> None:
    # 5: a timeout on main and on the pull request: not gated, and said at the top
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    (repo / "f").write_text("0")
    main = commit_all(repo, "main")
    head = _pull_request(repo)
    db = tmp_path / "m.db"
    timeout = dict(status="timeout", message="timed out after 600 s in phase 'warmup'")
    with Store.open(db) as store:
        store.write_run(make_run([make_measurement("generate", **timeout)], commit=main))
        pr = make_run(
            [make_measurement("generate", **timeout), make_measurement("other")],
            commit=head,
            branch="pr",
            merge_base=main,
            started_at="2026-01-01T01:00:00+00:00",
        )
        store.write_run(pr)
    md = tmp_path / "verdict.md"
    code, report, out = _check(repo, db, pr.run_id, "--markdown", str(md))
    said = "not gated: generate (timeout) fails on main too"
    assert code == 0 and said in report["summary"] and said in out.splitlines()[-1]
    assert (
        md.read_text()
        .splitlines()[0]
        .endswith("; not gated: `generate` (timeout) fails on main too")
    )


SLOW = """\
import time

import memtrack


@memtrack.workload(params={{"batch": 1}})
def slow(ctx):
    time.sleep({setup_s})  # loading a model that takes its time here

    def run():
        return 0

    return run
"""


def _slow_project(tmp_path: Path, setup_s: float, timeout: str) -> Path:
    repo = init_repo(tmp_path / "repo")
    (repo / "perf.py").write_text(SLOW.format(setup_s=setup_s))
    (repo / ".gitignore").write_text("data/\n*.json\n")
    (repo / "memtrack.toml").write_text(
        f'modules = ["perf.py"]\nwarmup = 0\nrepeats = 1\ntimeout = "{timeout}"\n'
    )
    commit_all(repo, "a slow setup")
    return repo


def _memtrack(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _measured(record: Path) -> dict[str, Any]:
    (m,) = json.loads(record.read_text())["measurements"]
    return m


def test_a_timeout_scales_with_the_cases_own_recorded_duration(tmp_path) -> None:
    # 5: a case recorded at ~1 s here gets 5x that, whatever its configured floor; with no
    # record of it here, the configured timeout is its limit
    repo = _slow_project(tmp_path, 1.0, "10 min")
    _memtrack(repo, "run")
    with Store.open(repo / "data" / "memtrack.db", readonly=True) as store:
        (first,) = [m for r in store.run_ids() for m in store.get_run(r).measurements]
    assert first.status == "ok" and first.duration_s >= 1.0
    config = (repo / "memtrack.toml").read_text().replace('"10 min"', '"0.5 s"')
    (repo / "memtrack.toml").write_text(config)
    _memtrack(repo, "run", "--json", "scaled.json")
    assert _measured(repo / "scaled.json")["status"] == "ok"
    _memtrack(repo, "run", "--no-db", "--json", "floor.json")
    floor = _measured(repo / "floor.json")
    assert floor["status"] == "timeout" and floor["message"].startswith("timed out after 0.5 s")


def test_a_timeout_on_a_contended_machine_is_measured_once_more(tmp_path) -> None:
    # 5: a case that hangs, past its timeout while other processes want every core twice
    # over: measured again before its timeout is recorded, and the record says so
    import processes

    repo = _slow_project(tmp_path, 3600, "1 s")
    with processes.busy_loops(2 * len(os.sched_getaffinity(0)) + 2, settle_s=0.5):
        _memtrack(repo, "run", "--no-db", "--json", "run.json")
    m = _measured(repo / "run.json")
    assert m["status"] == "timeout", m
    (note,) = [n for n in m["notes"] if n.startswith("the first try timed out after 1 s")]
    assert "while the machine was contended (the pass wanted" in note, note


def test_a_concurrent_case_reads_no_improvement_inside_its_own_noise(tmp_path) -> None:
    # 6: a peak set by how four sessions interleave moves by about 2 MB run to run; the sum
    # of its sessions bounds it from above, never narrower than what its runs reached, and
    # below, its own noise: -2 MiB is inside it
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    db = tmp_path / "m.db"
    peaks = [41.59, 43.15, 41.06, 42.63, 42.10, 41.30, 43.00, 41.80]
    shas = []

    def serve(peak_mb: float) -> Any:
        peak = int(peak_mb * 1e6)
        return make_measurement(
            "clf_serve",
            {"concurrency": 4},
            peak=peak,
            samples=(peak, peak - 300_000, peak - 600_000),
            session_peak_bytes=int(12e6),
            sessions_sum_bytes=int(43.5e6),  # just above every peak the case reached
        )

    with Store.open(db) as store:
        for i, mb in enumerate(peaks):
            (repo / "f").write_text(str(i))
            shas.append(commit_all(repo, f"c{i}"))
            store.write_run(
                make_run([serve(mb)], commit=shas[-1], started_at=f"2026-01-01T00:{i:02d}:00Z")
            )
        low = statistics.median(peaks) - 2 * MiB / 1e6
        pr = make_run(
            [serve(low)],
            commit=_pull_request(repo),
            branch="pr",
            merge_base=shas[-1],
            started_at="2026-01-01T01:00:00+00:00",
        )
        store.write_run(pr)
    code, report, out = _check(repo, db, pr.run_id)
    (v,) = [v for v in report["verdicts"] if v["metric"] == "allocated"]
    assert code == 0 and v["kind"] == "ok", v["message"]


def test_a_commits_runs_are_judged_together_each_figure_on_all_of_them(tmp_path) -> None:
    # a re-run of the candidate commit joins it: the lower median of its runs is judged
    repo, db, shas = _history(tmp_path, [(0, [4]), (1, [4]), (2, [4])])
    head = _pull_request(repo)
    with Store.open(db) as store:
        runs = []
        for k, peak in enumerate((8, 4)):  # one run saw a growth, its re-run did not
            runs.append(
                make_run(
                    [make_measurement("w", peak=peak * MiB // 4)],
                    commit=head,
                    branch="pr",
                    merge_base=shas[2],
                    started_at=f"2026-01-01T01:0{k}:00+00:00",
                )
            )
            store.write_run(runs[-1])
    code, report, out = _check(repo, db, runs[0].run_id)
    (v,) = [v for v in report["verdicts"] if v["metric"] == "allocated"]
    assert code == 0 and v["kind"] == "ok" and v["candidate_value"] == MiB, out
    assert any("this run and 1 more of the same commit" in n for n in report["notes"])
