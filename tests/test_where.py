"""Where it grew: the sites at each case's peak (probes.sites), stored per measurement and
diffed against the baseline in every verdict that says a figure grew. A real repository, real
`memtrack run`s of a small decoder, `memtrack check` as CI runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from factories import GIT_ENV, commit_all, git, init_repo

from memtrack.judge.where import diff
from memtrack.store.database import Store

SERVE = """\
import torch
from torch import nn

import memtrack


class Decoder(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.body = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        return self.body(self.embed(ids))


def generate(model, ids):
    h = model(ids)
    logits = model.lm_head(h[:, -1:])  # only the last position's logits
    return logits.argmax(-1)


@memtrack.workload(params={"vocab": 8192, "d": 64})
def serve(ctx):
    torch.set_num_threads(1)
    model = Decoder(ctx["vocab"], ctx["d"]).eval()
    ctx.mark(model)
    prompt = ctx.randint(ctx["vocab"], 4, 128)

    @torch.no_grad()
    def step():
        return generate(model, prompt)

    return step
"""

FULL_LOGITS = SERVE.replace(
    "logits = model.lm_head(h[:, -1:])  # only the last position's logits",
    "logits = model.lm_head(h)[:, -1:]  # every position's logits, kept",
)
MOVED = '"""A decoder served greedily."""\n\n\n' + SERVE  # every line three lines down

CASE = "serve[d=64,vocab=8192]"


def _memtrack(repo: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV, "MEMTRACK_DB": str(db)},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _run(repo: Path, db: Path) -> str:
    out = repo.parent / "run.json"
    done = _memtrack(repo, db, "run", "--json", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["run_id"]


def _check(repo: Path, db: Path) -> tuple[int, list[dict]]:
    out = repo.parent / "verdict.json"
    checked = _memtrack(repo, db, "check", "--json", str(out))
    assert checked.returncode in (0, 1), checked.stderr
    return checked.returncode, json.loads(out.read_text())["verdicts"]


@pytest.mark.slow
def test_a_pull_request_that_keeps_every_logit_is_blocked_where_it_grew(tmp_path):
    repo, db = init_repo(tmp_path / "repo"), tmp_path / "memtrack.db"
    (repo / "serve.py").write_text(SERVE)
    (repo / "memtrack.toml").write_text(
        'modules = ["serve.py"]\nrepeats = 2\nmin_baseline_runs = 1\ntime_regression = "off"\n'
    )
    (repo / ".gitignore").write_text("data/\n")
    commit_all(repo, "a decoder")
    main_run = _run(repo, db)

    git(repo, "checkout", "-q", "-b", "full-logits")
    (repo / "serve.py").write_text(FULL_LOGITS)
    commit_all(repo, "keep every position's logits")
    pr_run = _run(repo, db)
    code, verdicts = _check(repo, db)
    (allocated,) = [v for v in verdicts if v["metric"] == "allocated"]
    assert code == 1 and allocated["kind"] == "regression" and allocated["blocking"]
    # named by the output projection and the function that made it, with the file and line
    assert "where: +" in allocated["message"]
    assert "`lm_head` at serve.py:generate (line 20)" in allocated["message"]

    # the PR comment: one line under the table, the file linked at the pull request's commit
    comment = repo.parent / "comment.md"
    done = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "check", "--markdown", str(comment)],
        cwd=repo,
        env={**os.environ, **GIT_ENV, "MEMTRACK_DB": str(db), "GITHUB_REPOSITORY": "acme/chat"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    sha = git(repo, "rev-parse", "HEAD").strip()
    (line,) = [x for x in comment.read_text().splitlines() if x.startswith("- 📍")]
    assert "`serve` allocated" in line and "`lm_head` at [serve.py:generate (line 20)]" in line
    assert f"(https://github.com/acme/chat/blob/{sha}/serve.py#L20)" in line

    with Store.open(db, readonly=True) as store:
        before, after = store.sites(main_run, CASE), store.sites(pr_run, CASE)
    grew = allocated["candidate_value"] - allocated["baseline_value"]
    (top, *_) = diff(before, after, "pair")
    assert top.key == "lm_head at serve.py:generate" and top.delta >= 0.9 * grew
    # 4 x 128 x 8192 float32 logits alive at the new peak (the last position's were not
    # alive at the old one)
    assert top.delta == 4 * 128 * 8192 * 4
    # the sites sum to the peak: by module, by source, and by both
    with Store.open(db, readonly=True) as store:
        (m,) = store.get_run(pr_run).measurements
    for grouping in ("module", "source", "pair"):
        assert sum(s.size_bytes for s in m.sites if s.grouping == grouping) == pytest.approx(
            m.peak_allocated_bytes, rel=0.01
        )

    # a pull request from main that only moves lines: every site still matches
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "-b", "moved")
    (repo / "serve.py").write_text(MOVED)
    commit_all(repo, "a docstring")
    moved_run = _run(repo, db)
    code, verdicts = _check(repo, db)
    assert code == 0
    assert not any("where:" in v["message"] for v in verdicts)
    with Store.open(db, readonly=True) as store:
        moved = store.sites(moved_run, CASE)
    assert {s.key for s in moved} == {s.key for s in before}
    lines = {s.key: s.line for s in before if s.grouping == "source" and s.line}
    assert lines  # the workload's own sites, with their lines
    assert {s.key: s.line for s in moved if s.key in lines} == {k: v + 3 for k, v in lines.items()}
    assert all(c.delta == 0 for c in diff(before, moved, "pair"))
