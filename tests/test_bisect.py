"""`memtrack bisect` on a real repository of 9 commits, the 6th of which keeps 2 MiB more:
real `memtrack run`s of the recorded ends, the bisection's own measurements in worktrees,
the user's tree untouched; and the search itself over a noisy series drawn from real
reruns of a concurrent case, where it must never name a wrong commit."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from factories import (
    CPU_ENV,
    commit_all,
    git,
    init_repo,
    make_run,
    memtrack_cli,
    read_reruns,
)

from memtrack.config import Config
from memtrack.judge.gather.bisect import bisect
from memtrack.store.database import Store

WORKLOAD = """\
import torch

import memtrack

BLOCKS = {blocks}  # MiB kept alive at once


@memtrack.workload
def keep(ctx):
    def step():
        kept = [torch.ones(256 * 1024) for _ in range(BLOCKS)]
        return sum(float(k[0]) for k in kept)

    return step
"""
CONFIG = 'modules = ["wl.py"]\nrepeats = 2\nwarmup = 1\ntime_regression = "off"\n'


def _cli(repo: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memtrack_cli(repo, *args, "--db", str(db))


def _recorded(
    root: Path, workloads: str, commits: int, grown_from: int, env: dict[str, str] | None = None
) -> tuple[Path, list[str], Path]:
    """A repository of `commits` commits of `workloads` (2 MiB more kept from the
    `grown_from`-th on), its first and last commits recorded by `memtrack run`: the
    repository, its commits oldest first, and the database."""
    repo, db = init_repo(root / "repo"), root / "memtrack.db"
    (repo / "memtrack.toml").write_text(CONFIG)
    shas = []
    for i in range(1, commits + 1):
        (repo / "wl.py").write_text(workloads.format(blocks=4 if i < grown_from else 6))
        (repo / "NOTES.md").write_text(f"change {i}\n")
        shas.append(commit_all(repo, f"change {i}"))
    for sha in (shas[0], shas[-1]):
        git(repo, "checkout", "-q", sha)
        ran = memtrack_cli(repo, "run", "--db", str(db), env=env)
        assert ran.returncode == 0, ran.stderr
    git(repo, "checkout", "-q", "main")
    return repo, shas, db


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, list[str], Path]:
    """9 commits (the 6th keeps 2 MiB more), the first and last recorded as CI records
    them (a detached checkout, the branch named by GitHub)."""
    root = tmp_path_factory.mktemp("bisect")
    return _recorded(root, WORKLOAD, 9, 6, env={"GITHUB_REF_NAME": "main"})


def _bisect(repo: Path, db: Path, good: str, bad: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = repo.parent / "bisect.json"
    done = _cli(repo, db, "bisect", "keep", good, bad, "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())


@pytest.mark.slow
def test_bisect_names_the_commit_that_kept_2_mib_more_measuring_only_what_it_needs(
    history, tmp_path
):
    repo, shas, recorded = history
    db = tmp_path / "memtrack.db"
    shutil.copy(recorded, db)
    status_before = git(repo, "status", "--porcelain")
    done, found = _bisect(repo, db, shas[0], "main")
    assert found["first_bad"] == shas[5], done.stdout
    assert len(found["measured"]) <= 4  # log2 of the range; the ends were recorded
    assert f"first bad commit: {shas[5][:12]} change 6" in done.stdout
    assert "+2.00 MiB" in done.stdout and "step: allocated:" in done.stdout
    # the user's tree and branch as they were; no worktree left behind
    assert git(repo, "status", "--porcelain") == status_before
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(repo, "worktree", "list").strip().count("\n") == 0
    # what it measured is in the history, as runs of those commits
    listed = _cli(repo, db, "history", "keep").stdout
    for sha in found["measured"]:
        assert sha[:7] in listed, listed

    # with a middle commit recorded too, two measurements decide it
    again = tmp_path / "again.db"
    shutil.copy(recorded, again)
    git(repo, "checkout", "-q", shas[4])
    assert _cli(repo, again, "run").returncode == 0
    git(repo, "checkout", "-q", "main")
    _, found = _bisect(repo, again, shas[0], shas[-1])
    assert found["first_bad"] == shas[5] and len(found["measured"]) == 2


def test_check_history_offers_the_bisection_of_a_step_that_spans_several_commits(history):
    repo, shas, db = history
    done = memtrack_cli(repo, "check", "--history", "--db", str(db))
    assert done.returncode in (0, 1), done.stderr
    command = f"memtrack bisect keep {shas[0][:12]} {shas[-1][:12]} --metric allocated"
    text = " ".join(done.stdout.split())
    assert f"the step spans 8 commits; which one: {command}" in text, done.stdout


def test_bad_input_is_one_line_exit_2(history, tmp_path):
    repo, shas, recorded = history
    db = tmp_path / "memtrack.db"
    shutil.copy(recorded, db)
    for args, said in [
        (("keep", "nosuchref", "main"), "GOOD: 'nosuchref' is no commit"),
        (("keep", shas[-1], shas[0]), "is not an ancestor of BAD"),
        (("keep", shas[0], shas[0]), "GOOD and BAD are the same commit"),
        (("--", "keep", "--output=x", "main"), "is not a revision"),
        (("nosuch", shas[0], shas[-1]), "no case or workload 'nosuch'"),
    ]:
        done = memtrack_cli(repo, "bisect", "--db", str(db), *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], (args, done.stderr)


NAMED = """\
import torch

import memtrack

BLOCKS = {blocks}  # MiB kept alive at once


def keep(ctx):
    def step():
        kept = [torch.ones(256 * 1024) for _ in range(BLOCKS)]
        return sum(float(k[0]) for k in kept)

    return step


infer = memtrack.workload(keep, name="infer", params={{"batch": 1}})
tagged = memtrack.workload(keep, name="tagged", params={{"tag": ["one\\ntwo"]}})
"""


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> tuple[Path, list[str], Path]:
    """3 commits of two workloads of one case each (`infer[batch=1]`, and `tagged`, whose
    case id holds a newline), the 2nd keeping 2 MiB more; the 1st and 3rd recorded."""
    return _recorded(tmp_path_factory.mktemp("named"), NAMED, 3, 2)


def test_bisect_takes_a_workload_name_with_one_case_as_history_does(named, tmp_path):
    """The README's own form, `memtrack bisect WORKLOAD GOOD BAD`: the workload's one case is
    bisected; a name that is no workload gets history's "did you mean"."""
    repo, shas, recorded = named
    db = tmp_path / "m.db"
    shutil.copy(recorded, db)
    assert "infer" in _cli(repo, db, "history", "infer").stdout
    out = tmp_path / "found.json"
    done = _cli(repo, db, "bisect", "infer", shas[0], shas[-1], "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(out.read_text())
    assert found["case_id"] == "infer[batch=1]" and found["first_bad"] == shas[1], done.stdout
    assert f"first bad commit: {shas[1][:12]} change 2" in done.stdout
    wrong = _cli(repo, db, "bisect", "infre", shas[0], shas[-1])
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        f"memtrack: error: {db}: no case or workload 'infre'; did you mean infer?"
    ]


def test_a_relative_database_gets_every_run_the_bisection_measures(named, tmp_path):
    """`--db data/m.db` (and MEMTRACK_DB) relative to where bisect was started: the commit
    measured in a worktree is recorded there, in the database given, never in the
    worktree's own folder, and what is said to be recorded is."""
    repo, shas, recorded = named
    for how in ("--db", "MEMTRACK_DB"):
        data = repo / "data"
        data.mkdir(exist_ok=True)
        db = data / "m.db"
        shutil.copy(recorded, db)
        args = ("--db", "data/m.db") if how == "--db" else ()
        env = {"MEMTRACK_DB": "data/m.db"} if how == "MEMTRACK_DB" else None
        done = memtrack_cli(repo, "bisect", "infer[batch=1]", shas[0], shas[-1], *args, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"first bad commit: {shas[1][:12]}" in done.stdout, done.stdout
        assert f"measured 1 commit (recorded as runs of those commits): {shas[1][:12]}" in (
            done.stdout
        )
        with Store.open(db, readonly=True) as store:
            assert store.run_ids(commit=shas[1], measured=True), how
        shutil.rmtree(data)
    # nothing left in the checkout but Python's own bytecode cache of the workload module
    left = git(repo, "status", "--porcelain", "--ignored").splitlines()
    assert [line for line in left if line != "!! __pycache__/"] == []


def test_a_case_id_holding_a_newline_is_shown_on_one_line(named, tmp_path):
    repo, shas, recorded = named
    db = tmp_path / "m.db"
    shutil.copy(recorded, db)
    done = _cli(repo, db, "bisect", "tagged[tag=one\ntwo]", shas[0], shas[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("bisect tagged[tag=one two] allocated: 2 commits"), done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("two]")]
    assert f"first bad commit: {shas[1][:12]}" in done.stdout


HANGS = """\
import sys
import time

if "memtrack.machine.environment" in sys.orig_argv:
    time.sleep(3600)  # the environment probe, as a hung GPU driver holds it
"""


def test_good_and_bad_are_resolved_before_the_environment_probe(named, tmp_path):
    """A wrong GOOD or BAD is said at once, even where the probe would hang."""
    repo, shas, db = named
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(HANGS)
    env = {"PYTHONPATH": os.pathsep.join([str(hang), *sys.path])}
    for args, said in [
        (("infer", "nosuchref", "main"), "GOOD: 'nosuchref' is no commit"),
        (("infer", shas[-1], shas[0]), "is not an ancestor of BAD"),
        (("infre", shas[0], shas[-1]), "no case or workload 'infre'"),
    ]:
        done = memtrack_cli(repo, "bisect", "--db", str(db), *args, env=env, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], (args, done.stderr)


def test_an_environment_probe_that_hangs_is_one_error_line(tmp_path):
    """The probe's timeout (a hung driver) is a ProbeError of one line, not a traceback."""
    from memtrack.errors import ProbeError
    from memtrack.machine.environment import probe

    (tmp_path / "sitecustomize.py").write_text(HANGS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    with pytest.raises(ProbeError) as caught:
        probe(timeout_s=0.5, env=env)
    said = str(caught.value)
    assert "\n" not in said and "environment probe" in said and "within 0.5 s" in said


def test_a_noisy_concurrent_case_is_found_or_undecided_never_wrong(tmp_path):
    """Nine commits recorded from real reruns of a concurrent case (its peak moves with
    how the sessions interleave), the 6th 8 MiB heavier: over 10 draws of the reruns, the
    bisection names the 6th or says it cannot decide, and never another commit."""
    reruns = [
        m
        for run in read_reruns()
        for m in run.measurements
        if m.case_id.startswith("decoder_generate[") and "sessions=4" in m.case_id
    ]
    assert len(reruns) >= 8
    repo = init_repo(tmp_path / "repo")
    shas = []
    for i in range(1, 10):
        (repo / "NOTES.md").write_text(f"change {i}\n")
        shas.append(commit_all(repo, f"change {i}"))
    config = Config(path=None, root=repo)
    outcomes = []
    for draw in range(10):
        rng = random.Random(draw)
        with Store.open(tmp_path / f"{draw}.db") as store:
            for i, sha in enumerate(shas):
                for k in range(2):
                    m = rng.choice(reruns)
                    if i >= 5:
                        m = replace(
                            m,
                            peak_allocated_bytes=m.peak_allocated_bytes + 8 * 2**20,
                            allocated_samples=tuple(s + 8 * 2**20 for s in m.allocated_samples),
                        )
                    store.write_run(
                        make_run(
                            [m],
                            commit=sha,
                            branch="main",
                            started_at=f"2026-01-01T00:{i:02d}:{k:02d}+00:00",
                            env=CPU_ENV,
                        )
                    )

            def unmeasured(commit: str) -> str:
                raise AssertionError(f"{commit} was recorded: nothing to measure")

            found = bisect(
                store,
                config,
                repo,
                reruns[0].case_id,
                "allocated",
                shas[0],
                shas[-1],
                CPU_ENV.fingerprint,
                unmeasured,
            )
        assert found.first_bad in (shas[5], None), found.message
        assert found.first_bad is not None or shas[5] in found.among, found.message
        outcomes.append(found.first_bad)
    assert shas[5] in outcomes  # it decides, where the runs allow


def test_the_dashboard_history_offers_the_bisection_of_a_step_over_several_commits(
    history, monkeypatch
):
    pytest.importorskip("streamlit")
    import sys

    from apptables import table
    from streamlit.testing.v1 import AppTest

    repo, shas, db = history
    app = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), "--db", str(db)])
    at = AppTest.from_file(str(app), default_timeout=120)
    at.query_params["page"] = "History"
    at.query_params["case"] = "keep"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    events = table(at, "h_events")
    steps = [str(w) for w in events["what"] if "+2.00 MiB" in str(w)]
    command = f"memtrack bisect keep {shas[0][:12]} {shas[-1][:12]} --metric allocated"
    assert any(command in w for w in steps), steps
