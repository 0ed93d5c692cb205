"""Repositories as a dimension of one history: a fork and its upstream share every commit,
record into one database (a file, or a server's), and each is judged against its own runs
only; runs recorded before repositories were count as the one repository's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from factories import MiB, commit_all, git, init_repo, make_measurement, make_run

from memtrack.machine.provenance import remote_identity, repository_identity
from memtrack.store.opening import open_store
from memtrack.store.url import parse_database

UPSTREAM, FORK = "github.com/acme/model", "github.com/someone/model"
CASE = "decoder[batch=1]"


def test_a_remote_is_one_identity_whichever_way_it_is_written() -> None:
    for url in (
        "https://github.com/acme/model.git",
        "https://x-access-token:ghs_abcdef@github.com/acme/model",
        "git@github.com:acme/model.git",
        "ssh://git@GitHub.com:22/acme/model.git",
    ):
        assert remote_identity(url) == UPSTREAM, url
    assert remote_identity("/srv/git/model.git") is None
    assert remote_identity("file:///srv/git/model.git") is None
    env = {"GITHUB_REPOSITORY": "acme/model", "GITHUB_SERVER_URL": "https://github.com"}
    assert repository_identity(Path("/nonexistent"), None, env) == UPSTREAM
    assert repository_identity(Path("/nonexistent"), "gitlab.example/ml/model", env) == (
        "gitlab.example/ml/model"
    )


def _database(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if engine == "sqlite":
        return str(tmp_path / "shared.db")
    return str(request.getfixturevalue("pg_url"))


def _cli(repo: Path, db: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`memtrack ARGS` in `repo` on the database `db`, no CI's or user's settings seen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MEMTRACK_"))}
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=repo,
        env={**env, "MEMTRACK_DB": db},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _check(repo: Path, db: str, *args: str) -> dict[str, Any]:
    out = repo.parent / f"{repo.name}-check.json"
    done = _cli(repo, db, "check", *args, "--json", str(out))
    assert done.returncode in (0, 1), done.stderr
    return json.loads(out.read_text())


def _allocated(report: dict[str, Any]) -> dict[str, Any]:
    (v,) = [v for v in report["verdicts"] if v["case_id"] == CASE and v["metric"] == "allocated"]
    return v


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_fork_and_its_upstream_in_one_database_never_share_a_baseline(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = _database(engine, tmp_path, request)
    upstream = init_repo(tmp_path / "upstream")
    shas = []
    for i in range(6):
        (upstream / "model.py").write_text(f"VERSION = {i}\n")
        shas.append(commit_all(upstream, f"commit {i}"))
    git(upstream, "remote", "add", "origin", "https://github.com/acme/model.git")
    fork = tmp_path / "fork"
    subprocess.run(["git", "clone", "-q", str(upstream), str(fork)], check=True)
    git(fork, "remote", "set-url", "origin", "git@github.com:someone/model.git")
    git(fork, "checkout", "-q", "-B", "main", shas[-1])

    def run(i: int, repository: str | None, peak: int) -> Any:
        r = make_run(
            [make_measurement("decoder", {"batch": 1}, peak=peak)],
            commit=shas[i],
            started_at=f"2026-03-0{1 + i}T{10 if repository == UPSTREAM else 11}:00:00+00:00",
        )
        return replace(r, git=replace(r.git, repository=repository))

    with open_store(parse_database(db, "db")) as store:
        store.write_run(run(0, None, 100 * MiB))  # recorded before repositories were
        for i in range(1, 5):
            store.write_run(run(i, UPSTREAM, 100 * MiB))
            store.write_run(run(i, FORK, 300 * MiB))
        store.write_run(run(5, UPSTREAM, 100 * MiB))
        store.write_run(run(5, FORK, 330 * MiB))

    mine = _allocated(_check(upstream, db))
    assert mine["kind"] == "ok" and mine["baseline_value"] == 100 * MiB
    assert mine["baseline_runs"] == 5  # its own four, and the one that records none
    theirs = _allocated(_check(fork, db))
    assert theirs["baseline_value"] == 300 * MiB and theirs["baseline_runs"] == 4
    assert theirs["candidate_value"] == 330 * MiB

    history = _cli(upstream, db, "history", "decoder")
    assert history.returncode == 0, history.stderr
    assert "300.00 MiB" not in history.stdout and "330.00 MiB" not in history.stdout
    assert history.stdout.count("100.00 MiB") == 6


def test_the_dashboard_shows_one_repository_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apptables import drawn

    db = tmp_path / "shared.db"
    with open_store(db) as store:
        for i, (repository, peak) in enumerate([(UPSTREAM, 100), (FORK, 300)] * 3):
            r = make_run(
                [make_measurement("decoder", {"batch": 1}, peak=peak * MiB)],
                started_at=f"2026-03-01T1{i}:00:00+00:00",
            )
            store.write_run(replace(r, git=replace(r.git, repository=repository)))
    config = tmp_path / "memtrack.toml"
    config.write_text(f'repository = "{FORK}"\n')
    app = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), "--db", str(db), "--config", str(config)])

    def page(**query: str) -> Any:
        return drawn(str(app), **query)

    def shown(at: Any) -> str:
        return "\n".join(m.value for m in at.markdown)

    at = page()  # the config's repository first
    (chooser,) = [s for s in at.selectbox if s.label == "Repository"]
    assert chooser.value == FORK and set(chooser.options) == {UPSTREAM, FORK}
    assert "300.00 MiB" in shown(at) and "100.00 MiB" not in shown(at)
    at = page(repo=UPSTREAM)  # a shared link names the other
    assert "100.00 MiB" in shown(at) and "300.00 MiB" not in shown(at)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_history_names_and_suggests_this_repository_s_cases_only(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = _database(engine, tmp_path, request)
    with open_store(parse_database(db, "db")) as store:
        for repository, workload in ((UPSTREAM, "tiny"), (FORK, "small")):
            r = make_run([make_measurement(workload, {"n": n}) for n in (1, 4)])
            store.write_run(replace(r, git=replace(r.git, repository=repository)))
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "memtrack.toml").write_text(f'repository = "{FORK}"\n')
    done = _cli(fork, db, "history", "tiny")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no case or workload 'tiny'" in done.stderr and "tiny[" not in done.stderr
    done = _cli(fork, db, "history", "smal")
    assert done.returncode == 2 and "did you mean small" in done.stderr, done.stderr
    assert _cli(fork, db, "history", "small[n=4]").returncode == 0


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_nul_in_a_record_s_text_is_refused_by_either_engine_naming_file_and_field(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SQLite would store it and PostgreSQL refuse it: one rule for both, before anything is
    written, and the history stays one that `db copy` can carry to either."""
    from memtrack.records import to_dict

    db = _database(engine, tmp_path, request)
    for field, value in (("subject", "fix\x00"), ("message", "boom\x00")):
        r = make_run([make_measurement(status="error" if field == "message" else "ok")])
        data = to_dict(r)
        if field == "subject":
            data["git"]["subject"] = value
        else:
            data["measurements"][0]["message"] = value
        record = tmp_path / f"{field}.json"
        record.write_text(json.dumps(data))
        done = _cli(tmp_path, db, "ingest", str(record))
        assert done.returncode == 2, done.stdout + done.stderr
        assert str(record) in done.stderr and "NUL character" in done.stderr, done.stderr
        where = "git.subject" if field == "subject" else "measurements[0].message"
        assert where in done.stderr, done.stderr
    with open_store(parse_database(db, "db")) as store:
        assert store.run_ids() == []  # nothing written
