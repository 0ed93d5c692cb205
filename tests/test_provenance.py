from __future__ import annotations

import subprocess
import sys

from factories import commit_all, git, init_repo

from memtrack.machine.provenance import ci_info, git_info
from memtrack.store.database import Store

TINY = (
    "import torch, memtrack\n@memtrack.workload\ndef tiny(ctx):\n"
    "    w = torch.nn.Linear(8, 8)\n    ctx.mark(w)\n    x = ctx.randn(2, 8)\n"
    "    return lambda: w(x)\n"
)


def _run(cwd, db):
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "run", "--db", str(db)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _repo_with_history(path):
    repo = init_repo(path)
    (repo / "wl.py").write_text(TINY)
    (repo / "memtrack.toml").write_text('modules=["wl.py"]\nwarmup=0\nrepeats=1\n')
    first = commit_all(repo, "add the workload")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "notes.txt").write_text("x\n")
    second = commit_all(repo, "a feature commit")
    return repo, first, second


def test_git_info_of_a_branch_names_commit_parent_and_merge_base(tmp_path):
    repo, first, second = _repo_with_history(tmp_path / "repo")
    info = git_info(repo, "main", env={})
    assert (info.commit, info.parent, info.merge_base) == (second, first, first)
    assert info.branch == "feature" and info.subject == "a feature commit"
    assert info.dirty is False and info.shallow is False and info.notes == ()
    (repo / "wl.py").write_text(TINY + "\n# edited\n")
    assert git_info(repo, "main", env={}).dirty is True


def test_a_run_outside_a_git_repository_is_refused_as_its_facts_say(tmp_path):
    (tmp_path / "wl.py").write_text(TINY)
    (tmp_path / "memtrack.toml").write_text('modules=["wl.py"]\nwarmup=0\nrepeats=1\n')
    result = _run(tmp_path, tmp_path / "m.db")
    assert result.returncode == 2, result.stderr
    assert "not inside a git repository with a commit" in result.stderr
    assert not (tmp_path / "m.db").exists()  # a run of no commit is no point of a series
    info = git_info(tmp_path, "main")
    assert info.commit is None and "not inside a git repository" in info.notes[0]


def test_a_run_in_a_shallow_clone_is_recorded_with_a_clear_note(tmp_path):
    origin, first, second = _repo_with_history(tmp_path / "origin")
    clone = tmp_path / "clone"
    git(
        tmp_path,
        "clone",
        "-q",
        "--depth",
        "1",
        "--branch",
        "feature",
        f"file://{origin}",
        str(clone),
    )
    result = _run(clone, tmp_path / "m.db")
    assert result.returncode == 0, result.stderr
    with Store.open(tmp_path / "m.db", readonly=True) as store:
        run = store.get_run(store.run_ids()[0])
    assert run.git.commit == second and run.git.shallow is True
    assert run.git.parent == first  # named in the commit object, though not fetched
    assert run.git.merge_base is None
    notes = " ".join(run.git.notes)
    assert "shallow clone" in notes and "merge-base unknown" in notes


def test_ci_context_from_github_actions_variables():
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REF": "refs/pull/42/merge",
        "GITHUB_SHA": "abc",
        "GITHUB_HEAD_REF": "feature",
        "GITHUB_BASE_REF": "main",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "org/repo",
        "GITHUB_RUN_ID": "7",
        "RUNNER_NAME": "gpu-1",
    }
    ci = ci_info(env)
    assert (ci.event, ci.pr_number, ci.head_ref, ci.base_ref) == (
        "pull_request",
        42,
        "feature",
        "main",
    )
    assert ci.run_url == "https://github.com/org/repo/actions/runs/7"
    assert ci.runner_name == "gpu-1"
    assert ci_info({}).provider is None


def test_detached_head_in_ci_takes_the_branch_from_github(tmp_path):
    repo, _, second = _repo_with_history(tmp_path / "repo")
    git(repo, "checkout", "-q", "--detach", second)
    assert git_info(repo, "main", env={"GITHUB_HEAD_REF": "feature"}).branch == "feature"
    info = git_info(repo, "main", env={})
    assert info.branch is None and "detached HEAD" in info.notes[0]
