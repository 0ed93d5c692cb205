"""`memtrack check` on real git histories: a base branch with recorded commits and a PR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import CPU_ENV, MiB, commit_all, git, init_repo, make_measurement, make_run

from memtrack.cli import main
from memtrack.store.database import Store

SMALL = {"batch": 1}
BIG = {"batch": 8}
SMALL_ID = "decoder[batch=1]"
BIG_ID = "decoder[batch=8]"
HOST_NOISE = (0, MiB, -MiB, 2 * MiB, 0)  # what an unchanged worker's RSS does run to run

CONFIG = """\
base_branch = "main"
min_baseline_runs = 3

[[budgets]]
workload = "decoder"
metric = "allocated"
limit = "{limit}"
reason = "two sessions must fit a 24 GiB card"
"""


def _commit(repo: Path, monkeypatch: pytest.MonkeyPatch, minute: int, message: str) -> str:
    stamp = f"2026-01-01T00:{minute:02d}:00+00:00"
    monkeypatch.setenv("GIT_COMMITTER_DATE", stamp)
    monkeypatch.setenv("GIT_AUTHOR_DATE", stamp)
    return commit_all(repo, message)


def _cases(small: int = 100 * MiB, big: int = 300 * MiB, host: int = 0, **kw):
    return [make_measurement(params=SMALL, peak=small, host=400 * MiB + host, **kw),
            make_measurement(params=BIG, peak=big, host=500 * MiB + host)]


def _record(db: Path, repo: Path, sha: str, measurements, *, branch: str, minute: int,
            merge_base: str | None = None, env=CPU_ENV, shallow: bool = False) -> str:
    run = make_run(measurements, commit=sha, branch=branch, env=env,
                   started_at=f"2026-01-01T00:{minute:02d}:30+00:00", merge_base=merge_base)
    committed, subject = git(repo, "show", "-s", "--format=%cI%n%s", sha).splitlines()
    run = replace(run, git=replace(run.git, committed_at=committed, shallow=shallow,
                                   merge_base=merge_base, subject=subject))
    with Store.open(db) as store:
        store.write_run(run)
    return run.run_id


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """main: five recorded commits; then a PR branch 'feature' from the fifth; then main
    moves on with a commit whose figures are 50 % higher (not an ancestor of the PR)."""
    repo = init_repo(tmp_path / "repo")
    db = tmp_path / "memtrack.db"
    (repo / "memtrack.toml").write_text(CONFIG.format(limit="1 GiB"))
    (repo / "model.py").write_text("LAYERS = 2\n")
    shas = []
    for i, noise in enumerate(HOST_NOISE):
        (repo / "model.py").write_text(f"LAYERS = 2\nVERSION = {i}\n")
        sha = _commit(repo, monkeypatch, i, f"main {i}")
        _record(db, repo, sha, _cases(host=noise), branch="main", minute=i, merge_base=sha)
        shas.append(sha)
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "model.py").write_text("# a comment\nLAYERS = 2\nVERSION = 4\n")
    pr = _commit(repo, monkeypatch, 10, "a comment only")
    git(repo, "checkout", "-q", "main")
    (repo / "model.py").write_text("LAYERS = 3\nVERSION = 5\n")
    later = _commit(repo, monkeypatch, 20, "main moves on")
    _record(db, repo, later, _cases(small=150 * MiB, big=450 * MiB), branch="main", minute=20,
            merge_base=later)
    git(repo, "checkout", "-q", "feature")
    monkeypatch.chdir(repo)
    return repo, db, shas, pr


def _check(repo: Path, db: Path, *args: str):
    return CliRunner().invoke(
        main, ["check", "--config", str(repo / "memtrack.toml"), "--db", str(db), *args])


def test_two_percent_growth_in_one_case_blocks_and_names_it(project, tmp_path, monkeypatch):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases(small=int(100 * MiB * 1.02)), branch="feature", minute=11,
            merge_base=shas[-1])
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    res = _check(repo, db, "--json", str(tmp_path / "v.json"), "--markdown",
                 str(tmp_path / "v.md"))
    assert res.exit_code == 1, res.output
    assert f"BLOCK regression · {SMALL_ID} · allocated: baseline 100.00 MiB (median of 5 runs)" \
        in res.output
    assert "+2.00%" in res.output and f"at or before merge-base {shas[-1][:12]}" in res.output
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["exit_code"] == 1
    blocking = [v for v in data["verdicts"] if v["blocking"]]
    assert [(v["case_id"], v["metric"], v["kind"]) for v in blocking] == [
        (SMALL_ID, "allocated", "regression")]
    md = summary.read_text()
    assert md == (tmp_path / "v.md").read_text() + "\n"
    assert md.index("### Blocking") < md.index("<details>") and SMALL_ID in md
    with Store.open(db, readonly=True) as store:
        rows = store.conn.execute(
            "select case_id, kind, blocking from verdicts where blocking = 1").fetchall()
    assert [tuple(r) for r in rows] == [(SMALL_ID, "regression", 1)]


def test_the_pr_comment_links_each_case_to_its_history_on_the_dashboard(
        project, tmp_path, monkeypatch):
    repo, db, shas, pr = project
    cfg = repo / "memtrack.toml"
    cfg.write_text('dashboard_url = "https://mem.example/team/"\n' + CONFIG.format(limit="1 GiB"))
    _record(db, repo, pr, _cases(small=int(100 * MiB * 1.02)), branch="feature", minute=11,
            merge_base=shas[-1])
    res = _check(repo, db, "--markdown", str(tmp_path / "v.md"))
    assert res.exit_code == 1, res.output
    md = (tmp_path / "v.md").read_text()
    link = "https://mem.example/team/?page=History&case=decoder%5Bbatch%3D1%5D"
    assert f"[`{SMALL_ID}`]({link})" in md
    assert "[dashboard](https://mem.example/team/)" in md

    # The link's query is a deep link the dashboard opens on that case's History.
    from urllib.parse import parse_qsl, urlsplit

    from streamlit.testing.v1 import AppTest

    app = Path(__file__).parent.parent / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), "--db", str(db), "--config", str(cfg)])
    at = AppTest.from_file(str(app), default_timeout=60)
    for k, v in parse_qsl(urlsplit(link).query):
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.radio(key="page").value == "History"
    assert at.selectbox(key="case").value == SMALL_ID


def test_without_a_dashboard_url_the_comment_has_no_links(project, tmp_path):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases(small=int(100 * MiB * 1.02)), branch="feature", minute=11,
            merge_base=shas[-1])
    res = _check(repo, db, "--markdown", str(tmp_path / "v.md"))
    md = (tmp_path / "v.md").read_text()
    assert res.exit_code == 1 and f"`{SMALL_ID}`" in md and "](http" not in md


def test_a_comment_only_change_passes(project, tmp_path):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases(host=MiB), branch="feature", minute=11, merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 0, res.output
    assert "passed: nothing blocks" in res.output
    assert "regression" not in res.output


def test_a_case_left_out_of_the_candidate_is_named(project):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases()[:1], branch="feature", minute=11, merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 0, res.output
    assert (f"note: 1 case(s) of the newest baseline run are not in this run (removed, or left "
            f"out with -k/--shard), so not checked: {BIG_ID}") in res.output


def test_a_budget_breach_blocks_without_a_baseline(project, tmp_path, monkeypatch):
    repo, db, shas, pr = project
    (repo / "memtrack.toml").write_text(CONFIG.format(limit="2 GiB"))
    git(repo, "add", "-A")
    sha = _commit(repo, monkeypatch, 12, "raise the budget, add a case")
    new_case = make_measurement(params={"batch": 64}, peak=3 * 2**30)
    _record(db, repo, sha, _cases() + [new_case], branch="feature", minute=13,
            merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 1, res.output
    assert "BLOCK over budget · decoder[batch=64] · allocated 3.00 GiB: new: no baseline on main" \
        in res.output
    assert "OVER by 1.00 GiB" in res.output
    assert ("budget raised: decoder (allocated) 1.00 GiB -> 2.00 GiB (two sessions must fit "
            "a 24 GiB card)") in res.output


def test_an_environment_change_is_reported_not_compared(project):
    repo, db, shas, pr = project
    env = replace(CPU_ENV, fingerprint="cpu-env-2", torch="2.14.0+cpu", python="3.12.1")
    _record(db, repo, pr, _cases(small=200 * MiB), branch="feature", minute=11,
            merge_base=shas[-1], env=env)
    res = _check(repo, db)
    assert res.exit_code == 0, res.output
    assert "warn environment changed" in res.output
    assert "torch: 2.13.0+cpu -> 2.14.0+cpu" in res.output and "Python: 3.11.7 -> 3.12.1" \
        in res.output
    assert "not compared" in res.output and "regression" not in res.output


def test_a_failed_candidate_blocks(project):
    repo, db, shas, pr = project
    crashed = make_measurement(params=SMALL, status="crashed", message="killed by SIGSEGV")
    _record(db, repo, pr, [crashed, *_cases()[1:]], branch="feature", minute=11,
            merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 1, res.output
    assert (f"BLOCK failed · {SMALL_ID} · status: crashed (killed by SIGSEGV); the baseline "
            "passed (5 of 5 runs ok)") in res.output


def test_a_shallow_clone_degrades_to_time_with_a_note(project, tmp_path):
    repo, db, shas, pr = project
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", "feature",
                    f"file://{repo}", str(clone)], check=True)
    _record(db, repo, pr, _cases(host=MiB), branch="feature", minute=11, shallow=True)
    res = CliRunner().invoke(main, ["check", "--config", str(clone / "memtrack.toml"),
                                    "--db", str(db), "--commit", pr])
    assert res.exit_code == 0, res.output
    assert "note: shallow clone: baseline chosen by time, not ancestry" in res.output
    assert "fetch-depth: 0" in res.output
    assert "median of 5 runs" in res.output  # main's later commit is newer than the PR's


def test_no_candidate_run_is_a_usage_error_that_says_what_to_do(project):
    repo, db, shas, pr = project
    res = _check(repo, db)
    assert res.exit_code == 2
    assert f"no run of the current commit {pr[:12]}" in res.output
    assert "memtrack run" in res.output


def test_history_finds_the_step_and_the_creep(tmp_path, monkeypatch):
    repo = init_repo(tmp_path / "repo")
    db = tmp_path / "memtrack.db"
    (repo / "memtrack.toml").write_text('base_branch = "main"\ncreep_anchor = "v1"\n')
    level, step_sha = 100 * MiB, None
    for i in range(30):
        (repo / "f.txt").write_text(str(i))
        sha = _commit(repo, monkeypatch, i, f"change {i}")
        if i == 0:
            git(repo, "tag", "v1")
        if i == 17:
            level += 10 * MiB  # one commit steps the big case's allocated peak
            step_sha = sha
        # The small case's host peak creeps +200 KiB a commit under +-1 MiB of noise: no
        # commit is out of line, 30 of them are.
        host = 200 * 1024 * i + ((i * 7) % 5 - 2) * 512 * 1024
        ms = [make_measurement(params=SMALL, host=400 * MiB + host),
              make_measurement(params=BIG, peak=level)]
        _record(db, repo, sha, ms, branch="main", minute=i, merge_base=sha)
    res = CliRunner().invoke(main, ["check", "--config", str(repo / "memtrack.toml"), "--db",
                                    str(db), "--history"])
    assert res.exit_code == 1, res.output
    out = res.output
    assert "1 step(s), 2 series grown past the tolerance since the anchor" in out
    assert step_sha[:12] in out and "change 17" in out
    assert f"CREEP · {SMALL_ID} · host:" in out and "no single step: slow creep" in out
    assert f"GROWTH · {BIG_ID} · allocated:" in out and "1 step(s) between" in out
    assert "creep against v1 (" in out


def test_check_does_not_import_torch(project):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases(), branch="feature", minute=11, merge_base=shas[-1])
    code = textwrap.dedent(f"""
        import sys
        from memtrack.cli import main
        try:
            main(["check", "--config", {str(repo / "memtrack.toml")!r}, "--db", {str(db)!r}])
        except SystemExit as exc:
            heavy = [m for m in ("torch", "sqlite_utils", "pandas") if m in sys.modules]
            print("exit", exc.code, "heavy", heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                         env={**os.environ})
    assert out.stdout.strip().splitlines()[-1] == "exit 0 heavy []", out.stdout + out.stderr


WORKLOAD = """\
import torch
import memtrack

FLOATS = {floats}

@memtrack.workload
def tiny(ctx):
    weights = torch.ones(1024)
    ctx.mark()

    def step():
        x = torch.ones(FLOATS)
        return (x * weights.sum()).sum()

    return step
"""


@pytest.mark.slow
def test_end_to_end_a_real_run_of_a_grown_workload_is_blocked(tmp_path, monkeypatch):
    repo = init_repo(tmp_path / "proj")
    (repo / "memtrack.toml").write_text(
        'modules = ["workloads.py"]\nwarmup = 1\nrepeats = 2\nmin_baseline_runs = 2\n'
        'time_regression = "off"\n')
    (repo / ".gitignore").write_text("data/\n__pycache__/\n")
    (repo / "workloads.py").write_text(WORKLOAD.format(floats=64 * 1024))
    commit_all(repo, "a tiny workload")
    monkeypatch.chdir(repo)
    memtrack = [sys.executable, "-m", "memtrack.cli"]
    cli = Path(sys.executable).with_name("memtrack")
    if cli.exists():
        memtrack = [str(cli)]
    for _ in range(2):
        subprocess.run([*memtrack, "run"], check=True, capture_output=True)
    git(repo, "checkout", "-q", "-b", "grow")
    (repo / "workloads.py").write_text(WORKLOAD.format(floats=80 * 1024))  # +64 KiB
    commit_all(repo, "a bigger buffer")
    subprocess.run([*memtrack, "run"], check=True, capture_output=True)
    out = subprocess.run([*memtrack, "check"], capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BLOCK regression · tiny · allocated" in out.stdout
    assert "median of 2 runs" in out.stdout


@pytest.mark.parametrize("line, key", [('creep_tolerance = "lots"', "memtrack.creep_tolerance"),
                                       ("creep_anchor = 0", "memtrack.creep_anchor")])
def test_a_bad_history_setting_is_a_config_error_naming_file_and_key(tmp_path, line, key):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text(line + "\n")
    (tmp_path / "m.db").write_bytes(b"")
    res = CliRunner().invoke(main, ["check", "--config", str(cfg), "--db",
                                    str(tmp_path / "m.db"), "--history"])
    assert res.exit_code == 2
    assert f"{cfg}: {key}:" in res.output


def test_shards_of_one_commit_are_checked_together(project, tmp_path):
    """Two runners each measured half of the suite: a plain `memtrack check` judges both
    halves, and records each verdict against the run that holds the case."""
    repo, db, shas, pr = project
    small, big = _cases(big=int(300 * MiB * 1.05))
    ids = []
    for i, m in enumerate((small, big), start=1):
        ids.append(_record(db, repo, pr, [m], branch="feature", minute=10 + i,
                           merge_base=shas[-1]))
        with Store.open(db) as store:
            store.conn.execute("update runs set shard = ? where run_id = ?", [f"{i}/2", ids[-1]])
    res = _check(repo, db)
    assert res.exit_code == 1, res.output
    assert f"BLOCK regression · {BIG_ID}" in res.output  # in shard 2, the newest run's sibling
    assert "not in this run" not in res.output
    assert "checked together with the newest run of each other shard" in res.output
    with Store.open(db, readonly=True) as store:
        rows = store.conn.execute(
            "select distinct run_id, case_id from verdicts order by case_id").fetchall()
    assert sorted(tuple(r) for r in rows) == sorted([(ids[1], BIG_ID), (ids[0], SMALL_ID)])


def test_a_budget_of_a_workload_a_partial_run_left_out_is_noted_and_a_typo_refused(
        tmp_path, monkeypatch):
    """`memtrack run -k decoder` into a new database, then `memtrack check`: the budget of
    a workload that was never recorded is not checked (and says so), not an error; a name
    close to a recorded one is a typo and still refused."""
    repo = init_repo(tmp_path / "repo")
    budgets = CONFIG.format(limit="1 GiB") + (
        '\n[[budgets]]\nworkload = "{name}"\nlimit = "1 GiB"\nreason = "fits a T4"\n')
    (repo / "memtrack.toml").write_text(budgets.format(name="vision_forward"))
    sha = _commit(repo, monkeypatch, 1, "first")
    db = tmp_path / "m.db"
    _record(db, repo, sha, _cases(), branch="main", minute=1, merge_base=sha)
    monkeypatch.chdir(repo)
    res = _check(repo, db, "--no-record")
    assert res.exit_code == 0, res.output
    assert ("budgets[1].workload: 'vision_forward': no measurement of it is recorded yet "
            "(a run that left it out with -k or --shard): its budget is not checked"
            ) in res.output.replace("\n", " ")
    (repo / "memtrack.toml").write_text(budgets.format(name="decodr"))
    res = _check(repo, db, "--no-record")
    assert res.exit_code == 2
    assert "budgets[1].workload: 'decodr' names no known workload or case; nearest: decoder" \
        in res.output
