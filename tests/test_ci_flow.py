"""The CI flow, played locally with GitHub Actions' variables, on a real git repository and
real `memtrack` processes measuring a tiny CPU workload suite:

1. two merges to main, each recorded by `memtrack run` as a push job would;
2. a pull request whose step allocates an extra buffer: `memtrack check` exits 1, the job
   summary names the blocking case;
3. a pull request that fixes it, measured as two shards on two "runners" and collected by
   one job (through the composite action's own scripts): ingested together, checked, exit 0;
4. a regression pushed straight to main: the push job checks it against the previous level,
   reports and records it as a regression, and does not fail.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from factories import commit_all, git, init_repo
from gha import run_composite

from memtrack.store.database import Store

pytestmark = pytest.mark.slow

ACTION = Path(__file__).resolve().parents[1] / ".github" / "actions" / "memtrack" / "action.yml"
REPOSITORY = "octo/app"

WORKLOADS = """\
import torch

import memtrack

EXTRA_FLOATS = {extra}  # a scratch buffer the step allocates on top of the model's own


@memtrack.workload(params={{"batch": 4}})
def mlp(ctx):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    ctx.mark(model)
    x = ctx.randn(ctx["batch"], 64)

    def step():
        out = model(x)
        if EXTRA_FLOATS:
            out = out + torch.ones(EXTRA_FLOATS).sum()
        return out

    return step


@memtrack.workload(params={{"batch": 4}})
def embed(ctx):
    table = torch.nn.Embedding(256, 32)
    ctx.mark(table)
    idx = ctx.randint(256, ctx["batch"], 8)
    return lambda: table(idx).sum()
"""

CONFIG = """\
modules = ["workloads.py"]
base_branch = "main"
warmup = 1
repeats = 2
timeout = "2 min"
"""

MLP, EMBED = "mlp[batch=4]", "embed[batch=4]"
REGRESSION_FLOATS = 4_000_000  # 16 MB: far past the headroom of a ~70 KiB step


def _write_suite(repo: Path, extra: int) -> None:
    (repo / "workloads.py").write_text(WORKLOADS.format(extra=extra))


def _ci_env(tmp: Path, job: str, **github: str) -> dict[str, str]:
    """The variables a GitHub Actions job on a self-hosted runner sees."""
    job_dir = tmp / "jobs" / job
    (job_dir / "temp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update(
        CI="true",
        GITHUB_ACTIONS="true",
        GITHUB_REPOSITORY=REPOSITORY,
        GITHUB_SERVER_URL="https://github.com",
        GITHUB_RUN_ID="4242",
        GITHUB_JOB=job,
        RUNNER_NAME="gpu-runner-1",
        RUNNER_TEMP=str(job_dir / "temp"),
        GITHUB_STEP_SUMMARY=str(job_dir / "summary.md"),
    )
    env.update(github)
    return env


def _push_env(tmp: Path, job: str, sha: str) -> dict[str, str]:
    return _ci_env(
        tmp,
        job,
        GITHUB_EVENT_NAME="push",
        GITHUB_REF="refs/heads/main",
        GITHUB_REF_NAME="main",
        GITHUB_SHA=sha,
    )


def _pr_env(tmp: Path, job: str, number: int, branch: str) -> dict[str, str]:
    # GITHUB_SHA of a pull_request event is the merge commit GitHub makes; the workflow
    # checks out (and memtrack measures) the head instead.
    return _ci_env(
        tmp,
        job,
        GITHUB_EVENT_NAME="pull_request",
        GITHUB_REF=f"refs/pull/{number}/merge",
        GITHUB_REF_NAME=f"{number}/merge",
        GITHUB_SHA="e" * 40,
        GITHUB_HEAD_REF=branch,
        GITHUB_BASE_REF="main",
    )


def _memtrack(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _checkout(repo: Path, sha: str) -> None:
    """What actions/checkout leaves: a detached HEAD at the commit, full history."""
    git(repo, "checkout", "-q", "--detach", sha)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A repository with two merges to main, each recorded by a push job."""
    tmp = tmp_path_factory.mktemp("ci")
    repo = init_repo(tmp / "repo")
    (repo / "memtrack.toml").write_text(CONFIG)
    (repo / ".gitignore").write_text("__pycache__/\n")
    _write_suite(repo, 0)
    first = commit_all(repo, "add the memory suite")
    (repo / "README.md").write_text("the app\n")
    second = commit_all(repo, "docs")
    db = tmp / "runner" / "memtrack.db"  # the persistent path on the runner, outside the checkout
    db.parent.mkdir()  # made once by whoever sets the runner up (docs/ci.md), as is its owner
    for n, sha in enumerate([first, second]):
        _checkout(repo, sha)
        out = _memtrack(
            repo,
            _push_env(tmp, f"push-{n}", sha),
            "run",
            "--db",
            str(db),
            "--json",
            str(tmp / f"push-{n}.json"),
        )
        assert out.returncode == 0, out.stdout + out.stderr
    git(repo, "checkout", "-q", "main")
    return {"tmp": tmp, "repo": repo, "db": db, "main": second}


def test_merges_are_recorded_as_the_base_branch_history(baseline: dict[str, Any]) -> None:
    with Store.open(baseline["db"], readonly=True) as store:
        runs = [store.get_run(r) for r in store.run_ids()]
    assert len(runs) == 2
    for run in runs:
        assert run.git.branch == "main", "a detached push checkout is recorded on its branch"
        assert run.ci.event == "push" and run.ci.runner_name == "gpu-runner-1"
        assert run.ci.run_url == f"https://github.com/{REPOSITORY}/actions/runs/4242"
        assert {m.case_id for m in run.measurements} == {MLP, EMBED}
        assert all(m.status == "ok" for m in run.measurements)


def test_a_regressing_pull_request_is_blocked(baseline: dict[str, Any]) -> None:
    tmp, repo, db = baseline["tmp"], baseline["repo"], baseline["db"]
    git(repo, "checkout", "-q", "-b", "grow", baseline["main"])
    _write_suite(repo, REGRESSION_FLOATS)
    head = commit_all(repo, "keep a scratch buffer in the step")
    _checkout(repo, head)
    env = _pr_env(tmp, "pr-7", 7, "grow")

    recorded = _memtrack(repo, env, "run", "--db", str(db))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    checked = _memtrack(
        repo, env, "check", "--db", str(db), "--base", "main", "--json", str(tmp / "pr-7.json")
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr

    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert "BLOCK" in summary and MLP in summary
    blocking = [v for v in json.loads((tmp / "pr-7.json").read_text())["verdicts"] if v["blocking"]]
    assert {v["case_id"] for v in blocking} == {MLP}, "only the grown case blocks"
    assert any(v["metric"] == "allocated" and v["kind"] == "regression" for v in blocking)
    with Store.open(db, readonly=True) as store:
        run = store.get_run(store.run_ids(commit=head)[0])
    # The PR head was measured, with its PR context and its merge-base with main.
    assert run.git.commit == head and run.git.branch == "grow"
    assert run.git.merge_base == baseline["main"]
    assert run.ci.pr_number == 7 and run.ci.sha == "e" * 40 and run.ci.base_ref == "main"
    git(repo, "checkout", "-q", "main")


def _bin_dir(tmp: Path) -> Path:
    """Stands in for the action's virtual environment: this interpreter, and memtrack."""
    bin_dir = tmp / "venv" / "bin"
    if bin_dir.is_dir():
        return bin_dir
    bin_dir.mkdir(parents=True)
    for name, command in (("python", ""), ("memtrack", "-m memtrack.cli ")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command}"$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _action(tmp: Path, repo: Path, env: dict[str, str], event: str, **inputs: str) -> Any:
    job = env["GITHUB_JOB"]
    out = Path(env["RUNNER_TEMP"]) / "memtrack-out"
    out.mkdir()
    setup = {"bin": str(_bin_dir(tmp)), "out": str(out), "artifact": f"memtrack-{job}"}
    github = {
        "event_name": event,
        "base_ref": env.get("GITHUB_BASE_REF", ""),
        "event": {"pull_request": {"number": 8}},
    }
    return run_composite(
        ACTION,
        inputs=inputs,
        github=github,
        env=env,
        cwd=repo,
        workdir=tmp / "jobs" / job / "steps",
        given={"environment": {}, "setup": setup},
    )


def test_shards_on_two_runners_are_collected_and_checked_together(
    baseline: dict[str, Any],
) -> None:
    tmp, repo, db = baseline["tmp"], baseline["repo"], baseline["db"]
    git(repo, "checkout", "-q", "-b", "tidy", baseline["main"])
    (repo / "CHANGES.md").write_text("- tidy\n")
    head = commit_all(repo, "tidy up")
    _checkout(repo, head)

    # The matrix: each shard job runs `memtrack run --shard i/2 --no-db --json ...` and
    # uploads its record; download-artifact (merge-multiple) puts them in one folder.
    records = tmp / "records"
    records.mkdir()
    for i in (1, 2):
        env = _pr_env(tmp, f"shard-{i}", 8, "tidy")
        shard = _action(tmp, repo, env, "pull_request", shard=f"{i}/2")
        assert shard.failed_step is None, shard.log
        assert shard.steps["check"]["outcome"] == "skipped", "a shard job does not check"
        record = Path(env["RUNNER_TEMP"]) / "memtrack-out" / f"run-{i}-of-2.json"
        assert json.loads(record.read_text())["shard"] == f"{i}/2"
        shutil.copy(record, records / record.name)
    with Store.open(db, readonly=True) as store:
        assert store.run_ids(commit=head) == [], "shard jobs never write the database"

    # The collecting job: ingest both records into the canonical database, then check.
    env = _pr_env(tmp, "gate", 8, "tidy")
    env["MEMTRACK_DB"] = str(db)
    gate = _action(tmp, repo, env, "pull_request", records=str(records))
    assert gate.failed_step is None, gate.log
    check = gate.steps["check"]["outputs"]
    assert check["exit-code"] == "0", gate.log
    with Store.open(db, readonly=True) as store:
        runs = [store.get_run(r) for r in store.run_ids(commit=head)]
    assert sorted(r.shard or "" for r in runs) == ["1/2", "2/2"]
    assert {m.case_id for r in runs for m in r.measurements} == {MLP, EMBED}
    # One check of the commit, both shards' runs its evidence: the summary and the verdict
    # (for the PR comment) hold one outcome naming both runs, the JSON every verdict.
    (checked,) = gate.steps["record"]["outputs"]["runs"].split()
    assert checked in {r.run_id for r in runs}
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    verdict = Path(check["verdict"]).read_text()
    for text in (summary, verdict):
        assert text.count("### ✅ memtrack: nothing blocks") == 1, text
        assert all(r.run_id[:12] in text for r in runs) and "BLOCK" not in text
    report = Path(check["verdict"]).parent / f"verdict-{checked}.json"
    judged = {v["case_id"] for v in json.loads(report.read_text())["verdicts"]}
    assert judged == {MLP, EMBED}
    # Ingesting the same records again (a re-run of the job) adds nothing.
    again = _action(
        tmp,
        repo,
        _pr_env(tmp, "gate-rerun", 8, "tidy") | {"MEMTRACK_DB": str(db)},
        "pull_request",
        records=str(records),
        check="false",
    )
    assert again.failed_step is None and "0 run(s) added" in again.log
    git(repo, "checkout", "-q", "main")


def test_a_regression_pushed_to_main_is_reported_and_recorded_not_blocked(
    baseline: dict[str, Any],
) -> None:
    tmp, repo, db = baseline["tmp"], baseline["repo"], baseline["db"]
    git(repo, "checkout", "-q", "-b", "direct", baseline["main"])
    _write_suite(repo, REGRESSION_FLOATS)
    head = commit_all(repo, "a buffer, pushed without review")
    _checkout(repo, head)
    env = _push_env(tmp, "push-direct", head)
    env["MEMTRACK_DB"] = str(db)
    job = _action(tmp, repo, env, "push")
    assert job.failed_step is None, job.log  # reported, never blocking
    check = job.steps["check"]["outputs"]
    assert check["exit-code"] == "0", job.log
    assert "REPORT regression" in Path(check["verdict"]).read_text()
    with Store.open(db, readonly=True) as store:
        (run_id,) = store.run_ids(commit=head)
        rows = store.conn.execute(
            "select case_id, kind, context, blocking from verdicts where "
            "run_id = ? and metric = 'allocated'",
            [run_id],
        ).fetchall()
    assert {tuple(r) for r in rows} == {(MLP, "regression", "base", 0), (EMBED, "ok", "base", 0)}
    git(repo, "checkout", "-q", "main")
