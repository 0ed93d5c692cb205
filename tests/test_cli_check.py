"""`memtrack check` on real git histories: a base branch with recorded commits and a PR."""

from __future__ import annotations

import json
import os
import re
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
    return [
        make_measurement(params=SMALL, peak=small, host=400 * MiB + host, **kw),
        make_measurement(params=BIG, peak=big, host=500 * MiB + host),
    ]


def _record(
    db: Path,
    repo: Path,
    sha: str,
    measurements,
    *,
    branch: str,
    minute: int,
    merge_base: str | None = None,
    env=CPU_ENV,
    shallow: bool = False,
) -> str:
    run = make_run(
        measurements,
        commit=sha,
        branch=branch,
        env=env,
        started_at=f"2026-01-01T00:{minute:02d}:30+00:00",
        merge_base=merge_base,
    )
    committed, subject = git(repo, "show", "-s", "--format=%cI%n%s", sha).splitlines()
    run = replace(
        run,
        git=replace(
            run.git, committed_at=committed, shallow=shallow, merge_base=merge_base, subject=subject
        ),
    )
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
    _record(
        db,
        repo,
        later,
        _cases(small=150 * MiB, big=450 * MiB),
        branch="main",
        minute=20,
        merge_base=later,
    )
    git(repo, "checkout", "-q", "feature")
    monkeypatch.chdir(repo)
    return repo, db, shas, pr


def _check(repo: Path, db: Path, *args: str):
    return CliRunner().invoke(
        main, ["check", "--config", str(repo / "memtrack.toml"), "--db", str(db), *args]
    )


def test_two_percent_growth_in_one_case_blocks_and_names_it(project, tmp_path, monkeypatch):
    repo, db, shas, pr = project
    _record(
        db,
        repo,
        pr,
        _cases(small=int(100 * MiB * 1.02)),
        branch="feature",
        minute=11,
        merge_base=shas[-1],
    )
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    res = _check(repo, db, "--json", str(tmp_path / "v.json"), "--markdown", str(tmp_path / "v.md"))
    assert res.exit_code == 1, res.output
    assert (
        f"BLOCK regression · {SMALL_ID} · allocated: baseline 100.00 MiB (median of 5 runs)"
        in res.output
    )
    assert "+2.00%" in res.output and f"at or before merge-base {shas[-1][:12]}" in res.output
    # the terminal table lists what blocks; the ok verdicts are counted, each still a line
    rows = [line for line in res.output.splitlines() if line.startswith("│")]
    assert len(rows) == 1 and "BLOCK regression" in rows[0] and "allocated" in rows[0]
    assert "7 ok: not in the table; each has its line below" in res.output
    assert f"ok · {BIG_ID} · allocated: baseline" in res.output
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["exit_code"] == 1
    blocking = [v for v in data["verdicts"] if v["blocking"]]
    assert [(v["case_id"], v["metric"], v["kind"]) for v in blocking] == [
        (SMALL_ID, "allocated", "regression")
    ]
    md = summary.read_text()
    assert md == (tmp_path / "v.md").read_text() + "\n"
    outcome, *rest = md.splitlines()
    # one line of outcome, then the table of what blocks, the arithmetic folded
    assert outcome == (
        "### ❌ memtrack: blocked by `decoder[batch=1]` allocated +2.00 MiB "
        "(+2.0%), intermediates grew"
    )
    row = (
        "| 🔺 | decoder\\[batch=1\\] | allocated | 100.00 MiB | 102.00 MiB | "
        "+2.00 MiB (+2.0%) | +512 B |"
    )
    assert md.index(row) < md.index("🔺 regression: blocks") < md.index("<details>")
    assert "Not listed: ✅ 7 ok." in md and "batch=8" not in md  # ok verdicts: counted
    assert "**BLOCK regression** `decoder[batch=1]`: allocated: baseline 100.00 MiB" in md
    with Store.open(db, readonly=True) as store:
        rows = store.conn.execute(
            "select case_id, kind, blocking from verdicts where blocking = 1"
        ).fetchall()
    assert [tuple(r) for r in rows] == [(SMALL_ID, "regression", 1)]


def _follow(link: str, db: Path, cfg: Path, monkeypatch: pytest.MonkeyPatch):
    """The dashboard as the link opens it: its query string, in the real app (AppTest)."""
    from urllib.parse import parse_qsl, urlsplit

    from streamlit.testing.v1 import AppTest

    app = Path(__file__).parent.parent / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), "--db", str(db), "--config", str(cfg)])
    at = AppTest.from_file(str(app), default_timeout=60)
    for k, v in parse_qsl(urlsplit(link).query):
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_the_pr_comment_links_the_run_its_compare_with_the_merge_base_and_the_case(
    project, tmp_path, monkeypatch
):
    repo, db, shas, pr = project
    cfg = repo / "memtrack.toml"
    cfg.write_text('dashboard_url = "https://mem.example/team/"\n' + CONFIG.format(limit="1 GiB"))
    run_id = _record(
        db,
        repo,
        pr,
        _cases(small=int(100 * MiB * 1.02)),
        branch="feature",
        minute=11,
        merge_base=shas[-1],
    )
    res = _check(repo, db, "--markdown", str(tmp_path / "v.md"))
    assert res.exit_code == 1, res.output
    md = (tmp_path / "v.md").read_text()
    links = re.findall(r"\[([^\]]*(?:\\\][^\]]*)*)\]\((https://mem\.example/team/\?[^)]+)\)", md)
    by_text = {text: url for text, url in links}
    assert set(by_text) == {
        "run detail",
        f"compare with the merge-base {shas[-1][:10]}",
        "decoder\\[batch=1\\]",
    }, links
    assert md.index("run detail") < md.index("| 🔺 |")  # above the table

    at = _follow(by_text["run detail"], db, cfg, monkeypatch)
    assert at.radio(key="page").value == "Run detail"
    assert at.text_input(key="run").value == run_id
    assert "a comment only" in " ".join(m.value for m in at.markdown)

    at = _follow(by_text[f"compare with the merge-base {shas[-1][:10]}"], db, cfg, monkeypatch)
    assert at.radio(key="page").value == "Compare"
    table = at.dataframe[0].value
    row = table[(table["case id"] == SMALL_ID) & (table["view"] == "allocated")].iloc[0]
    assert (row["A"], row["B"], row["delta"]) == ("100.00 MiB", "102.00 MiB", "+2.00 MiB")
    assert row["verdict"] == "regression"

    at = _follow(by_text["decoder\\[batch=1\\]"], db, cfg, monkeypatch)
    assert at.radio(key="page").value == "History"
    assert at.selectbox(key="case").value == SMALL_ID


def test_without_a_dashboard_url_the_comment_has_no_links(project, tmp_path):
    repo, db, shas, pr = project
    _record(
        db,
        repo,
        pr,
        _cases(small=int(100 * MiB * 1.02)),
        branch="feature",
        minute=11,
        merge_base=shas[-1],
    )
    res = _check(repo, db, "--markdown", str(tmp_path / "v.md"))
    md = (tmp_path / "v.md").read_text()
    assert res.exit_code == 1 and f"`{SMALL_ID}`" in md and "](http" not in md


def _checked(repo: Path, db: Path, tmp_path: Path, run_id: str) -> tuple[int, dict, str]:
    out = tmp_path / f"{run_id}.json"
    res = _check(repo, db, "--run", run_id, "--json", str(out))
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(out.read_text()), res.output


def test_a_regression_on_main_stays_in_every_check_until_fixed_or_accepted(
    project, tmp_path, monkeypatch
):
    repo, db, shas, pr = project
    later = git(repo, "rev-parse", "main")
    (first,) = [
        r
        for (r,) in Store.open(db, readonly=True).conn.execute(
            "select run_id from runs where git_commit = ?", [later]
        )
    ]
    code, data, _ = _checked(repo, db, tmp_path, first)  # main's push: +50 %, reported
    assert (code, data["context"]) == (0, "base") and data["open_regressions"] == []
    assert "2 regressions reported" in data["summary"]

    git(repo, "checkout", "-q", "main")
    (repo / "model.py").write_text("LAYERS = 3\nVERSION = 6\n")
    sha = _commit(repo, monkeypatch, 21, "main again")
    again = _record(
        db,
        repo,
        sha,
        _cases(small=150 * MiB, big=450 * MiB),
        branch="main",
        minute=21,
        merge_base=sha,
    )
    code, data, out = _checked(repo, db, tmp_path, again)  # the next push: the new level
    kinds = {v["case_id"]: v["kind"] for v in data["verdicts"] if v["metric"] == "allocated"}
    assert code == 0 and kinds == {SMALL_ID: "ok", BIG_ID: "ok"}
    opened = {(o["case_id"], o["metric"], o["commit"]) for o in data["open_regressions"]}
    assert opened == {(SMALL_ID, "allocated", later), (BIG_ID, "allocated", later)}
    assert data["summary"].startswith("base branch: no new regression, 2 still open")
    assert f"OPEN on main · {SMALL_ID} · allocated +50.00 MiB (+50.00%) since {later[:12]}" in out

    git(repo, "checkout", "-q", "-b", "feature-2")
    (repo / "model.py").write_text("# docs\nLAYERS = 3\nVERSION = 6\n")
    pr2 = _commit(repo, monkeypatch, 22, "docs")
    run = _record(
        db,
        repo,
        pr2,
        _cases(small=150 * MiB, big=450 * MiB),
        branch="feature-2",
        minute=22,
        merge_base=sha,
    )
    code, data, _ = _checked(repo, db, tmp_path, run)  # a pull request: said, not blocking
    assert code == 0 and len(data["open_regressions"]) == 2
    md = tmp_path / "pr.md"
    _check(repo, db, "--run", run, "--markdown", str(md), "--no-record")
    assert "**Open on main, not caused here** (until fixed or accepted):" in md.read_text()

    git(repo, "checkout", "-q", "main")
    (repo / "model.py").write_text("LAYERS = 2\nVERSION = 7\n")
    fix = _commit(
        repo,
        monkeypatch,
        23,
        "restore the small case\n\nMemtrack-Accept: "
        "decoder[batch=8] allocated +60% the big case needs the longer context",
    )
    run = _record(
        db,
        repo,
        fix,
        _cases(small=100 * MiB, big=450 * MiB),
        branch="main",
        minute=23,
        merge_base=fix,
    )
    code, data, _ = _checked(repo, db, tmp_path, run)
    assert data["open_regressions"] == []
    notes = " ".join(data["notes"])
    assert f"{SMALL_ID}: allocated is back within the threshold of the regression" in notes
    (big,) = [v for v in data["verdicts"] if v["case_id"] == BIG_ID and v["metric"] == "allocated"]
    assert (big["kind"], big["accepted_reason"]) == (
        "accepted",
        "the big case needs the longer context",
    )

    (repo / "model.py").write_text("LAYERS = 2\nVERSION = 8\n")
    sha = _commit(repo, monkeypatch, 24, "main once more")
    run = _record(
        db,
        repo,
        sha,
        _cases(small=100 * MiB, big=450 * MiB),
        branch="main",
        minute=24,
        merge_base=sha,
    )
    code, data, _ = _checked(repo, db, tmp_path, run)
    assert data["open_regressions"] == [] and data["summary"].startswith(
        "base branch: no new regression"
    )


def test_a_branch_cut_before_a_regression_merged_is_said_to_predate_it_not_to_fix_it(
    project, tmp_path, monkeypatch
):
    """main's newest commit regressed (+50 %, reported on main); the PR branch was cut
    before it: within the threshold, it fixed nothing. A branch cut after it that brings
    the figures back is said to be back within it."""
    repo, db, shas, pr = project
    later = git(repo, "rev-parse", "main")
    (main_run,) = [
        r
        for (r,) in Store.open(db, readonly=True).conn.execute(
            "select run_id from runs where git_commit = ?", [later]
        )
    ]
    _checked(repo, db, tmp_path, main_run)  # main's push: the regressions are recorded
    old = _record(db, repo, pr, _cases(), branch="feature", minute=30, merge_base=shas[-1])
    code, data, out = _checked(repo, db, tmp_path, old)
    assert code == 0 and len(data["open_regressions"]) == 2
    assert all(o["predates"] and not o["fixed_here"] for o in data["open_regressions"])
    assert "this branch was cut before it merged: not in this change" in out
    assert "back within it" not in out
    md = tmp_path / "old.md"
    _check(repo, db, "--run", old, "--markdown", str(md), "--no-record")
    assert "— this branch was cut before it merged: not in this change" in md.read_text()
    assert "this change is back within it" not in md.read_text()

    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "-b", "fix")
    (repo / "model.py").write_text("LAYERS = 2\nVERSION = 9\n")
    fix = _commit(repo, monkeypatch, 31, "back to two layers")
    run = _record(db, repo, fix, _cases(), branch="fix", minute=31, merge_base=later)
    code, data, out = _checked(repo, db, tmp_path, run)
    assert all(o["fixed_here"] and not o["predates"] for o in data["open_regressions"])
    assert "this run is back within it" in out and "cut before it merged" not in out


def test_one_trailer_without_a_metric_accepts_one_change_and_the_comment_says_why(
    project, tmp_path, monkeypatch
):
    """One intentional change grows both cases' allocator view and their host peak: a
    trailer that names the workload and no metric accepts all of it, and the PR comment
    says so with its reason; a trailer naming one metric leaves the rest blocking, each
    saying which trailer would accept it."""
    repo, db, shas, pr = project
    grown = _cases(small=102 * MiB, big=306 * MiB, host=64 * MiB)
    (repo / "model.py").write_text("# a longer context\nLAYERS = 2\nVERSION = 4\n")
    one = _commit(
        repo,
        monkeypatch,
        12,
        "a longer context\n\nMemtrack-Accept: decoder +64 MiB the 8k context is the feature",
    )
    run = _record(db, repo, one, grown, branch="feature", minute=12, merge_base=shas[-1])
    md = tmp_path / "one.md"
    res = _check(repo, db, "--run", run, "--markdown", str(md), "--no-record")
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "☑️ 4 accepted" in text
    line = next(x for x in text.splitlines() if x.startswith("- ☑️ **accepted**"))
    assert line.startswith(f"- ☑️ **accepted** (commit `{one[:12]}`): the 8k context is the feature")
    assert "`decoder[batch=1]` allocated +2.00 MiB (+2.0%), host +64.00 MiB (+16.0%)" in line
    assert text.index("Not listed: ") < text.index(line)  # beside the count, said once

    git(repo, "checkout", "-q", "-b", "feature-2", shas[-1])
    (repo / "model.py").write_text("# a longer context, again\nLAYERS = 2\nVERSION = 4\n")
    only = _commit(
        repo,
        monkeypatch,
        13,
        "a longer context\n\nMemtrack-Accept: decoder allocated +6 MiB the allocator only",
    )
    run = _record(db, repo, only, grown, branch="feature", minute=13, merge_base=shas[-1])
    code, data, out = _checked(repo, db, tmp_path, run)
    kinds = {(v["case_id"], v["metric"]): v["kind"] for v in data["verdicts"]}
    assert code == 1, out
    assert kinds[(SMALL_ID, "allocated")] == kinds[(BIG_ID, "allocated")] == "accepted"
    assert kinds[(SMALL_ID, "host")] == kinds[(BIG_ID, "host")] == "regression"
    assert (
        f"the Memtrack-Accept trailer of commit {only[:12]} names allocated only; "
        "`Memtrack-Accept: decoder +64 MiB the allocator only` would accept this"
    ) in out


def test_a_comment_only_change_passes(project, tmp_path):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases(host=MiB), branch="feature", minute=11, merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 0, res.output
    assert "passed: nothing blocks" in res.output
    assert "regression" not in res.output
    assert "8 ok: nothing blocks or warns; each has its line below" in res.output
    assert not [line for line in res.output.splitlines() if line.startswith(("┏", "│"))]


def test_a_case_left_out_of_the_candidate_is_named(project):
    repo, db, shas, pr = project
    _record(db, repo, pr, _cases()[:1], branch="feature", minute=11, merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 0, res.output
    # a warning listed in the table and counted in the outcome, never a folded note
    line = f"warn removed · {BIG_ID} · removed: held by main's runs of the same kind"
    assert line in res.output
    assert "passed: nothing blocks (1 removed, " in res.output


def test_a_budget_breach_blocks_without_a_baseline(project, tmp_path, monkeypatch):
    repo, db, shas, pr = project
    (repo / "memtrack.toml").write_text(CONFIG.format(limit="2 GiB"))
    git(repo, "add", "-A")
    sha = _commit(repo, monkeypatch, 12, "raise the budget, add a case")
    new_case = make_measurement(params={"batch": 64}, peak=3 * 2**30)
    _record(db, repo, sha, _cases() + [new_case], branch="feature", minute=13, merge_base=shas[-1])
    res = _check(repo, db)
    assert res.exit_code == 1, res.output
    assert (
        "BLOCK over budget · decoder[batch=64] · allocated 3.00 GiB: new: no baseline on main"
        in res.output
    )
    assert "OVER by 1.00 GiB" in res.output
    assert (
        "budget raised: decoder (allocated) 1.00 GiB -> 2.00 GiB (two sessions must fit "
        "a 24 GiB card)"
    ) in res.output


def test_an_environment_change_is_reported_not_compared(project):
    repo, db, shas, pr = project
    env = replace(CPU_ENV, fingerprint="cpu-env-2", torch="2.14.0+cpu", python="3.12.1")
    _record(
        db,
        repo,
        pr,
        _cases(small=200 * MiB),
        branch="feature",
        minute=11,
        merge_base=shas[-1],
        env=env,
    )
    res = _check(repo, db)
    assert res.exit_code == 0, res.output
    assert "warn environment changed" in res.output
    assert (
        "torch: 2.13.0+cpu -> 2.14.0+cpu" in res.output and "Python: 3.11.7 -> 3.12.1" in res.output
    )
    assert "not compared" in res.output and "regression" not in res.output


def test_a_failed_candidate_blocks(project):
    repo, db, shas, pr = project
    crashed = make_measurement(params=SMALL, status="crashed", message="killed by SIGSEGV")
    _record(
        db, repo, pr, [crashed, *_cases()[1:]], branch="feature", minute=11, merge_base=shas[-1]
    )
    res = _check(repo, db)
    assert res.exit_code == 1, res.output
    assert (
        f"BLOCK failed · {SMALL_ID} · status: crashed (killed by SIGSEGV); the baseline "
        "passed (5 of 5 runs ok)"
    ) in res.output


def test_a_shallow_clone_degrades_to_time_with_a_note(project, tmp_path):
    repo, db, shas, pr = project
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", "--branch", "feature", f"file://{repo}", str(clone)],
        check=True,
    )
    _record(db, repo, pr, _cases(host=MiB), branch="feature", minute=11, shallow=True)
    res = CliRunner().invoke(
        main, ["check", "--config", str(clone / "memtrack.toml"), "--db", str(db), "--commit", pr]
    )
    assert res.exit_code == 0, res.output
    assert "note: shallow clone: baseline chosen by commit time, not ancestry" in res.output
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
        ms = [
            make_measurement(params=SMALL, host=400 * MiB + host),
            make_measurement(params=BIG, peak=level),
        ]
        _record(db, repo, sha, ms, branch="main", minute=i, merge_base=sha)
    res = CliRunner().invoke(
        main, ["check", "--config", str(repo / "memtrack.toml"), "--db", str(db), "--history"]
    )
    assert res.exit_code == 1, res.output
    out = res.output
    assert "1 step(s), 2 series grown past the tolerance since the anchor" in out
    assert step_sha[:12] in out and "change 17" in out
    assert f"CREEP · {SMALL_ID} · host:" in out and "no single step: slow creep" in out
    assert f"GROWTH · {BIG_ID} · allocated:" in out and "1 step(s) between" in out
    assert "creep against v1 (" in out


def _main_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures) -> tuple[Path, Path]:
    """A real repository with one recorded commit on main per (small peak, small host)."""
    repo = init_repo(tmp_path / "repo")
    db = tmp_path / "memtrack.db"
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    for i, (peak, host) in enumerate(figures):
        (repo / "f.txt").write_text(str(i))
        sha = _commit(repo, monkeypatch, i, f"change {i}")
        _record(
            db,
            repo,
            sha,
            [make_measurement(params=SMALL, peak=peak, host=host)],
            branch="main",
            minute=i,
            merge_base=sha,
        )
    return repo, db


def test_history_says_an_accepted_step_and_never_flags_it(tmp_path, monkeypatch):
    """A +10 MiB step on main that a reviewed trailer accepted (in the merged commit's
    message, read from git; or as main's recorded check accepted it): `check --history`
    says so with its reason and exits 0; the same step without a trailer is GROWTH, exit 1;
    a step past what its trailer allows is still GROWTH."""

    def history(trailer: str, folder: str, record: bool = False) -> tuple[int, str, str]:
        repo = init_repo(tmp_path / folder)
        db = tmp_path / f"{folder}.db"
        (repo / "memtrack.toml").write_text('base_branch = "main"\nmin_baseline_runs = 3\n')
        for i in range(12):
            (repo / "f.txt").write_text(str(i))
            message = f"change {i}" + (f"\n\n{trailer}" if i == 6 and trailer else "")
            sha = _commit(repo, monkeypatch, i, message)
            peak = 110 * MiB if i >= 6 else 100 * MiB
            run = _record(
                db,
                repo,
                sha,
                [make_measurement(params=SMALL, peak=peak)],
                branch="main",
                minute=i,
                merge_base=sha,
            )
            if record:  # main's check, as CI runs it on a push: its verdicts recorded
                assert _check(repo, db, "--run", run).exit_code == 0
        config = repo / "memtrack.toml"
        if record:  # read without git: what main's checks recorded is all there is
            config = tmp_path / f"{folder}-no-git" / "memtrack.toml"
            config.parent.mkdir()
            config.write_text((repo / "memtrack.toml").read_text())
        md = tmp_path / f"{folder}.md"
        res = CliRunner().invoke(
            main,
            ["check", "--config", str(config), "--db", str(db), "--history"]
            + ["--markdown", str(md)],
        )
        return res.exit_code, res.output, md.read_text()

    code, out, md = history("", "plain")
    assert code == 1 and f"GROWTH · {SMALL_ID} · allocated:" in out
    trailer = "Memtrack-Accept: decoder +10 MiB the longer context is the feature"
    code, out, md = history(trailer, "trailer")
    assert code == 0, out
    assert "0 series grown past the tolerance since the anchor, 1 grown by accepted steps" in out
    assert f"accepted · {SMALL_ID} · allocated:" in out
    assert "+10.00 MiB of it accepted (" in out and ": the longer context is the feature)" in out
    assert "### Accepted growth" in md and "the longer context is the feature |" in md
    code, out, _ = history(trailer, "recorded", record=True)
    assert code == 0 and "the longer context is the feature" in out, out
    code, out, _ = history(trailer.replace("+10 MiB", "+5 MiB"), "too-much")
    assert code == 1 and f"GROWTH · {SMALL_ID} · allocated:" in out


def test_history_measures_a_young_project_from_its_first_run(tmp_path, monkeypatch):
    # 12 commits, fewer than the default anchor (50 commits back): a +703 % step at 8
    figures = [(10 * MiB if i < 8 else int(80.3 * MiB), 400 * MiB) for i in range(12)]
    repo, db = _main_history(tmp_path, monkeypatch, figures)
    res = CliRunner().invoke(
        main, ["check", "--config", str(repo / "memtrack.toml"), "--db", str(db), "--history"]
    )
    assert res.exit_code == 1, res.output
    assert f"GROWTH · {SMALL_ID} · allocated: fitted 80.30 MiB" in res.output
    assert "(the series starts after the anchor)" in res.output and "+703.00%" in res.output


def test_history_judges_creep_on_a_fitted_trend_not_two_noisy_runs(tmp_path, monkeypatch):
    # host RSS with run-to-run noise of about a MiB and nothing added; the newest run is
    # the noisiest of all, 5 MiB above the anchor run (beyond 1 %, from two endpoints)
    noise = [0, 1, -1, 0, 2, -1, 0, 1, -2, 0] * 6
    figures = [(10 * MiB, 400 * MiB + d * MiB) for d in noise[:59]] + [(10 * MiB, 405 * MiB)]
    figures[9] = (10 * MiB, 400 * MiB)  # the anchor run, 50 commits back
    repo, db = _main_history(tmp_path, monkeypatch, figures)
    res = CliRunner().invoke(
        main,
        [
            "check",
            "--config",
            str(repo / "memtrack.toml"),
            "--db",
            str(db),
            "--history",
            "--anchor",
            "50",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "0 step(s), 0 series grown past the tolerance" in res.output
    # a real creep: +6 MiB (1.5 %) over the 50 commits, under the same noise, the newest
    # run at the trend
    creep = [
        (p, h + (i - 9) * 6 * MiB // 50 if i > 9 else h) for i, (p, h) in enumerate(figures[:59])
    ] + [(10 * MiB, 406 * MiB)]
    repo, db = _main_history(tmp_path / "creep", monkeypatch, creep)
    res = CliRunner().invoke(
        main,
        [
            "check",
            "--config",
            str(repo / "memtrack.toml"),
            "--db",
            str(db),
            "--history",
            "--anchor",
            "50",
        ],
    )
    assert res.exit_code == 1, res.output
    assert f"CREEP · {SMALL_ID} · host: fitted" in res.output
    assert "no single step: slow creep" in res.output


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
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, env={**os.environ}
    )
    assert out.stdout.strip().splitlines()[-1] == "exit 0 heavy []", out.stdout + out.stderr


@pytest.mark.parametrize(
    "line, key",
    [
        ('creep_tolerance = "lots"', "memtrack.creep_tolerance"),
        ("creep_anchor = 0", "memtrack.creep_anchor"),
    ],
)
def test_a_bad_history_setting_is_a_config_error_naming_file_and_key(tmp_path, line, key):
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text(line + "\n")
    (tmp_path / "m.db").write_bytes(b"")
    res = CliRunner().invoke(
        main, ["check", "--config", str(cfg), "--db", str(tmp_path / "m.db"), "--history"]
    )
    assert res.exit_code == 2
    assert f"{cfg}: {key}:" in res.output


def test_shards_of_one_commit_are_checked_together(project, tmp_path):
    """Two runners each measured half of the suite: a plain `memtrack check` judges both
    halves, and records each verdict against the run that holds the case."""
    repo, db, shas, pr = project
    small, big = _cases(big=int(300 * MiB * 1.05))
    ids = []
    for i, m in enumerate((small, big), start=1):
        ids.append(_record(db, repo, pr, [m], branch="feature", minute=10 + i, merge_base=shas[-1]))
        with Store.open(db) as store:
            store.conn.execute("update runs set shard = ? where run_id = ?", [f"{i}/2", ids[-1]])
    res = _check(repo, db)
    assert res.exit_code == 1, res.output
    assert f"BLOCK regression · {BIG_ID}" in res.output  # in shard 2, the newest run's sibling
    assert "not in this run" not in res.output
    said = f"the commit's evidence: this run and 1 more of the same commit ({ids[0][:12]})"
    assert said in res.output
    with Store.open(db, readonly=True) as store:
        rows = store.conn.execute(
            "select distinct run_id, case_id from verdicts order by case_id"
        ).fetchall()
    assert sorted(tuple(r) for r in rows) == sorted([(ids[1], BIG_ID), (ids[0], SMALL_ID)])


def test_a_budget_of_a_workload_a_partial_run_left_out_is_noted_and_a_typo_refused(
    tmp_path, monkeypatch
):
    """`memtrack run -k decoder` into a new database, then `memtrack check`: the budget of
    a workload that was never recorded is not checked (and says so), not an error; a name
    close to a recorded one is a typo and still refused."""
    repo = init_repo(tmp_path / "repo")
    budgets = CONFIG.format(limit="1 GiB") + (
        '\n[[budgets]]\nworkload = "{name}"\nlimit = "1 GiB"\nreason = "fits a T4"\n'
    )
    (repo / "memtrack.toml").write_text(budgets.format(name="vision_forward"))
    sha = _commit(repo, monkeypatch, 1, "first")
    db = tmp_path / "m.db"
    _record(db, repo, sha, _cases(), branch="main", minute=1, merge_base=sha)
    monkeypatch.chdir(repo)
    res = _check(repo, db, "--no-record")
    assert res.exit_code == 0, res.output
    assert (
        "budgets[1].workload: 'vision_forward': no measurement of it is recorded yet "
        "(a run that left it out with -k or --shard): its budget is not checked"
    ) in res.output.replace("\n", " ")
    (repo / "memtrack.toml").write_text(budgets.format(name="decodr"))
    res = _check(repo, db, "--no-record")
    assert res.exit_code == 2
    assert (
        "budgets[1].workload: 'decodr' names no known workload or case; nearest: decoder"
        in res.output
    )
