"""The history on a PostgreSQL server, as teams with many runners keep it: a real server
started by the tests (tests/pgcluster.py), the real CLI in subprocesses, the same verdicts
as the SQLite file, concurrent writers losing and duplicating nothing, and the password
never shown or stored."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pgcluster
import pytest
from factories import commit_all, git, init_repo, make_measurement, make_run, story_history

from memtrack.errors import ConfigError, StoreError
from memtrack.records import write_json
from memtrack.store.opening import open_store
from memtrack.store.url import ServerUrl, parse_database

SECRETS = (pgcluster.PASSWORD, urllib.parse.quote(pgcluster.PASSWORD, safe=""))


def _memtrack(
    *args: str, cwd: Path, url: str | None = None, env: dict[str, str] | None = None, **kw: Any
) -> Any:
    """`memtrack ARGS` with none of the user's or CI's settings but the test session's spool
    and server wait (tests/conftest.py), the database `url` and `env`."""
    session = ("MEMTRACK_SPOOL", "MEMTRACK_SERVER_RETRY_S")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MEMTRACK_"))},
        **{k: os.environ[k] for k in session if k in os.environ},
        **(env or {}),
    }
    if url is not None:
        env["MEMTRACK_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        **kw,
    )


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def _every_text_cell(url: str) -> str:
    """Every text value of every table of the server database, joined."""
    import psycopg

    out = []
    with psycopg.connect(url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "select table_name from information_schema.tables "
                "where table_schema = current_schema()"
            )
        ]
        for table in tables:
            for row in conn.execute(f'select * from "{table}"'):
                out.extend(str(v) for v in row if isinstance(v, str))
    return "\n".join(out)


# -- naming a database ---------------------------------------------------------------------


def test_a_database_is_a_path_an_sqlite_url_or_a_server_url() -> None:
    assert parse_database("data/memtrack.db", "--db") == Path("data/memtrack.db")
    assert parse_database("sqlite:///data/m.db", "--db") == Path("data/m.db")
    assert parse_database("sqlite:////abs/m.db", "--db") == Path("/abs/m.db")
    url = parse_database("postgresql+psycopg://ci:hunter2pass@db.internal:5432/perf", "--db")
    assert isinstance(url, ServerUrl)
    assert url.url == "postgresql://ci:hunter2pass@db.internal:5432/perf"
    assert str(url) == "postgresql://ci:***@db.internal:5432/perf"
    assert "hunter2pass" not in repr(url)
    query = parse_database("postgres://ci@db/perf?sslmode=verify-full&password=hunter2pass", "x")
    assert "hunter2pass" not in str(query) and "sslmode=verify-full" in str(query)
    for bad, words in (
        ("mysql://u:hunter2pass@h/x", "unknown database scheme 'mysql'"),
        ("postgresql://u:hunter2pass@h:port/x", "not a valid URL"),
        ("postgresql://u:hunter2pass@h/", "names no database"),
        ("sqlite:///", "names no file"),
    ):
        with pytest.raises(ConfigError) as caught:
            parse_database(bad, "--db")
        assert words in str(caught.value) and "hunter2pass" not in str(caught.value)


def test_a_password_a_url_parser_would_split_is_refused_and_never_shown() -> None:
    # an unencoded '/' or '?' ends a URL's authority: a parser then finds no password, and
    # what reads as a host and a port would be shown whole
    for url in ("postgresql://u:ab/cd@host/db", "postgresql://u:99/secretpw@host/db"):
        with pytest.raises(ConfigError) as caught:
            parse_database(url, "--db")
        assert "percent-encode" in str(caught.value)
        assert "cd@" not in str(caught.value) and "secretpw" not in str(caught.value)
    # a driver may quote the password as written, decoded or encoded: none is shown
    url = parse_database("postgresql://u:x%41yz%ZZ@h/db", "--db")
    assert isinstance(url, ServerUrl)
    assert url.redact('invalid token "x%41yz%ZZ", xAyz%ZZ') == 'invalid token "***", ***'


def test_the_store_sql_is_translated_outside_literals_and_comments_only() -> None:
    from memtrack.store.server import translate

    assert translate("select 'a%', ?") == "select 'a%%', %s"
    assert translate("select 1 where x = 'this is %' and y is ?") == (
        "select 1 where x = 'this is %%' and y is not distinct from %s"
    )
    assert translate("select 'a [b] c', [c] from t -- a ? here") == (
        "select 'a [b] c', \"c\" from t -- a ? here"
    )
    assert translate("select x::text from t where a = :a") == (
        "select x::text from t where a = %(a)s"
    )
    assert translate("insert or ignore into t (a) values (?);") == (
        "insert into t (a) values (%s) on conflict do nothing"
    )
    assert translate("select 1 from a cross join t as r on r.x = a.x") == (
        "select 1 from a join t as r on r.x = a.x"
    )


def test_a_write_inside_a_read_snapshot_is_refused_and_the_snapshot_kept(pg_url: str) -> None:
    with open_store(parse_database(pg_url, "url")) as store:
        with store.reading():
            with pytest.raises(StoreError, match="a write inside a read"):
                store.write_run(make_run([make_measurement()]))
            assert store.conn.execute("select count(*) from runs").fetchone()[0] == 0
            assert store.pg.in_transaction  # type: ignore[attr-defined]


def test_a_bad_database_url_is_one_line_and_exit_2_without_its_password(tmp_path: Path) -> None:
    done = _memtrack("check", "--db", "mysql://ci:hunter2pass@h/perf", cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "mysql" in done.stderr and "hunter2pass" not in done.stderr
    (tmp_path / "memtrack.toml").write_text('database = "oracle://ci:hunter2pass@h/perf"\n')
    done = _memtrack("history", "x", cwd=tmp_path)
    assert done.returncode == 2
    assert "memtrack.toml" in done.stderr and "database" in done.stderr
    assert "hunter2pass" not in done.stderr


# -- the shipped suite on a server ---------------------------------------------------------


@pytest.mark.slow
def test_the_storage_pages_socket_url_works_as_written_and_a_missing_database_says_createdb(
    pg_cluster: Any, pg_url: str, tmp_path: Path
) -> None:
    """The unix-socket URL of docs/storage.md, as written there, but for this cluster's socket
    folder, its database and its role (the page's server authenticates by peer, this one by
    password): a history goes in and comes back. A database not made first is one line
    naming it, with the `createdb` that makes it."""
    import re

    page = (Path(__file__).resolve().parent.parent / "docs" / "storage.md").read_text()
    (written,) = set(re.findall(r"'(postgresql:///memtrack\?host=/var/run/postgresql)'", page))
    name = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    url = written.replace("/memtrack?", f"/{name}?").replace(
        "/var/run/postgresql", str(pg_cluster.root)
    )
    url += f"&user={pgcluster.USER}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MEMTRACK_"))}
    env.update(PGPASSWORD=pgcluster.PASSWORD, MEMTRACK_DATABASE_URL=url)

    def memtrack(*args: str, **more: str) -> Any:
        return subprocess.run(
            [sys.executable, "-m", "memtrack.cli", *args],
            cwd=tmp_path,
            env={**env, **more},
            capture_output=True,
            text=True,
            timeout=300,
        )

    record = tmp_path / "run.json"
    write_json(make_run([make_measurement("decoder", {"batch": 1})]), record)
    assert memtrack("ingest", str(record)).returncode == 0
    shown = memtrack("history", "decoder")
    assert shown.returncode == 0 and "decoder" in shown.stdout, shown.stderr
    missing = memtrack("history", "decoder", MEMTRACK_DATABASE_URL=url.replace(name, "nosuch"))
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert 'database "nosuch" does not exist (make it first: createdb nosuch)' in line, line
    _no_secret(missing.stderr)


def test_the_shipped_suite_is_run_checked_ingested_and_shown_on_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "repo")
    (repo / "README").write_text("a model\n")
    commit_all(repo, "a model")
    record = tmp_path / "run.json"
    outputs = []

    run = _memtrack("run", "--json", str(record), cwd=repo, url=pg_url)
    outputs.append(run.stdout + run.stderr)
    assert run.returncode == 0, run.stderr
    assert "recorded in postgresql://memtrack:***@/" in run.stdout
    run_id = json.loads(record.read_text())["run_id"]

    checked = _memtrack("check", "--json", str(tmp_path / "check.json"), cwd=repo, url=pg_url)
    outputs.append(checked.stdout + checked.stderr)
    assert checked.returncode == 0, checked.stderr
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["run_id"] == run_id and {v["kind"] for v in report["verdicts"]} == {"new"}

    shown = _memtrack("show", run_id[:12], cwd=repo, url=pg_url)
    history = _memtrack("history", "train_step", cwd=repo, url=pg_url)
    again = _memtrack("ingest", str(record), cwd=repo, url=pg_url)  # a retried upload
    doctor = _memtrack("doctor", cwd=repo, url=pg_url)
    for done in (shown, history, again, doctor):
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stderr
    assert "train_step" in shown.stdout and run_id[:12] in history.stdout
    assert again.stdout.startswith("0 run(s) added, 1 already present")

    # a second commit, its run and the gate's diff against the first
    (repo / "README").write_text("a model, documented\n")
    commit_all(repo, "docs")
    second = _memtrack("run", "-k", "train_step", cwd=repo, url=pg_url)
    diff = _memtrack("diff", run_id[:12], "main", "train_step", cwd=repo, url=pg_url)
    for done in (second, diff):
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stderr

    with open_store(parse_database(pg_url, "url"), readonly=True) as store:
        assert store.get_run(run_id) == store.find_run(run_id)  # read back whole
        assert len(store.run_ids()) == 2
    _no_secret("\n".join(outputs))
    _no_secret(_every_text_cell(pg_url))


@pytest.mark.slow
def test_the_pytest_plugin_records_a_test_into_postgres(pg_url: str, tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    (repo / "test_model.py").write_text(
        "import torch\n\n\ndef test_forward():\n"
        "    x = torch.ones(256, 256)\n    assert (x @ x).sum() > 0\n"
    )
    commit_all(repo, "a test")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MEMTRACK_"))}
    env["MEMTRACK_DATABASE_URL"] = pg_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--memtrack"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _no_secret(done.stdout + done.stderr)
    with open_store(parse_database(pg_url, "url"), readonly=True) as store:
        (run,) = [store.get_run(r) for r in store.run_ids()]
    assert [m.case_id for m in run.measurements] == ["test_model.py::test_forward"]


# -- the same verdicts ---------------------------------------------------------------------


def _as_checked(result: Any) -> str:
    from memtrack.report.check import to_json

    return json.dumps(to_json(dataclasses.replace(result, checked_at="")), sort_keys=True)


@pytest.mark.slow
def test_a_messy_history_gets_the_same_verdicts_on_sqlite_and_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    # A revert, a re-land, an accepted step and a leak, every run recorded and checked in
    # both databases in the same order (each check recording its verdicts, as CI does).
    server = parse_database(pg_url, "url")
    story = story_history(tmp_path, 19, also=(server,), messier=True)
    from memtrack.config import load_config
    from memtrack.judge.check import check

    config = load_config(story["config"], cwd=story["repo"])
    kinds = set()
    for run_id in story["runs"]:
        judged = []
        for db in (story["db"], server):
            with open_store(db, readonly=True) as store:
                result = check(store, config, run_id=run_id, root=story["repo"])
            judged.append(_as_checked(result))
            kinds |= {v.kind for v in result.verdicts}
        assert judged[0] == judged[1], run_id
    assert {"regression", "accepted", "leak"} <= kinds

    # and the CLI's reports, byte for byte but for the time each check was made
    outputs = {}
    for name, db in (("sqlite", str(story["db"])), ("postgres", pg_url)):
        for args in (("check", "--no-record"), ("check", "--history")):
            out = tmp_path / f"{name}-{args[1]}.json"
            done = _memtrack(*args, "--json", str(out), cwd=story["repo"], url=db)
            assert done.returncode in (0, 1), done.stderr
            text = out.read_text()
            stamp = json.loads(text).get("checked_at")
            outputs[name, args[1]] = text.replace(stamp, "") if stamp else text
    for kind in ("--no-record", "--history"):
        assert outputs["sqlite", kind] == outputs["postgres", kind]


# -- many writers --------------------------------------------------------------------------


def _records(folder: Path, n: int, tag: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        run = make_run(
            [make_measurement("decoder", {"batch": 1}, peak=(100 + i) * 2**20)],
            commit=f"{tag}{i:04d}".ljust(40, "a"),
            started_at=f"2026-03-01T{i // 60:02d}:{i % 60:02d}:00+00:00",
        )
        path = folder / f"{run.run_id}.json"
        write_json(run, path)
        paths.append(path)
    return paths


@pytest.mark.slow
def test_concurrent_writers_lose_nothing_and_duplicate_nothing(pg_url: str, tmp_path: Path) -> None:
    shared = _records(tmp_path / "shared", 5, "5")  # every writer uploads these too
    writers = []
    for w in range(4):
        own = _records(tmp_path / f"w{w}", 10, str(w))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTRACK_")}
        env["MEMTRACK_DATABASE_URL"] = pg_url
        writers.append(
            subprocess.Popen(
                [sys.executable, "-m", "memtrack.cli", "ingest", *map(str, own + shared)],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300) for p in writers]
    assert [p.returncode for p in writers] == [0] * 4, outs
    added = sum(int(out.split()[0]) for out, _ in outs)
    assert added == 4 * 10 + 5  # each shared record written once, by whichever came first
    with open_store(parse_database(pg_url, "url"), readonly=True) as store:
        ids = store.run_ids(limit=1000)
        assert len(ids) == len(set(ids)) == 45
        (count,) = store.conn.execute("select count(*) from measurements").fetchone()
        assert count == 45


# -- a server that is down -----------------------------------------------------------------


def test_a_server_that_is_down_is_one_line_and_a_measured_run_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pgcluster.unavailable():
        pytest.skip(f"no PostgreSQL for the server tests: {pgcluster.unavailable()}")
    from memtrack.store.save import save_run

    cluster = pgcluster.Cluster()
    try:
        url = parse_database(cluster.database(), "url")
        store = open_store(url)
        cluster.stop()  # the server goes away while the run is being measured
        run = make_run([make_measurement()])
        monkeypatch.chdir(tmp_path)
        saved, failures = save_run(run, store, None)
        assert len(saved) == 1 and Path(saved[0]).name.startswith("memtrack-run-")
        assert failures[0].startswith("postgresql://memtrack:***@/")
        _no_secret("\n".join(failures))
        with pytest.raises(StoreError) as caught:
            open_store(url)
        assert "***" in str(caught.value) and "\n" not in str(caught.value)
        _no_secret(str(caught.value))
    finally:
        cluster.stop()


# -- moving a history ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_history_moves_to_postgres_and_back_row_for_row(pg_url: str, tmp_path: Path) -> None:
    story = story_history(tmp_path, 19, messier=True)
    back = tmp_path / "back" / "memtrack.db"
    back.parent.mkdir()
    there = _memtrack("db", "copy", str(story["db"]), pg_url, cwd=tmp_path)
    again = _memtrack("db", "copy", str(story["db"]), pg_url, cwd=tmp_path)
    home = _memtrack("db", "copy", pg_url, str(back), cwd=tmp_path)
    assert there.returncode == 0 and home.returncode == 0, there.stderr + home.stderr
    assert "verified row for row: 1 environments, 20 runs, 40 measurements" in there.stdout
    assert again.returncode == 2 and "holds a history already" in again.stderr  # never merged
    _no_secret(there.stdout + again.stderr + home.stdout)

    # a backup of the server is an SQLite file of the same history; an export its records
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    saved = _memtrack("backup", str(snapshots), cwd=tmp_path, url=pg_url)
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith("20 run(s), ")
    (snapshot,) = snapshots.iterdir()
    exported = _memtrack("export", str(tmp_path / "records"), cwd=tmp_path, url=pg_url)
    assert exported.returncode == 0, exported.stderr
    assert len(list((tmp_path / "records").glob("*.json"))) == 20
    _no_secret(saved.stdout + saved.stderr + exported.stdout + exported.stderr)

    reports = []
    for db in (str(story["db"]), pg_url, str(back), str(snapshot)):
        out = tmp_path / f"history-{len(reports)}.json"
        done = _memtrack("check", "--history", "--json", str(out), cwd=story["repo"], url=db)
        assert done.returncode in (0, 1), done.stderr  # 1: the story's creep is flagged
        reports.append((done.returncode, out.read_text()))
    assert reports[0] == reports[1] == reports[2] == reports[3]
    import sqlite3

    def rows(path: Path) -> list[tuple]:
        conn = sqlite3.connect(path)
        try:
            return conn.execute("select * from runs order by run_id").fetchall()
        finally:
            conn.close()

    assert rows(story["db"]) == rows(back)  # recorded_at and every other column kept

    # the server's ids continue after the copied ones: a new run and its check add rows
    with open_store(parse_database(pg_url, "url")) as store:
        store.write_run(make_run([make_measurement()], branch="feature/next"))
        (n,) = store.conn.execute("select count(*) from measurements").fetchone()
    assert n == 41


def _recorded_commit(tmp_path: Path, pg_url: str) -> Path:
    """A repository of one commit, whose run is recorded in the server's database."""
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    sha = commit_all(repo, "a model")
    record = tmp_path / "run.json"
    write_json(make_run([make_measurement()], commit=sha), record)
    assert _memtrack("ingest", str(record), cwd=repo, url=pg_url).returncode == 0
    return repo


def test_a_select_only_user_sees_the_verdicts_and_one_warning(pg_url: str, tmp_path: Path) -> None:
    """A reader of the team's history (SELECT only) checks a commit: the verdicts are shown
    and written, exit status the verdict's; that they were not recorded is one warning."""
    import psycopg

    repo = _recorded_commit(tmp_path, pg_url)
    reader, secret = "reader", "r3ad:only"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"create role {reader} login password '{secret}'")
        conn.execute(f"grant select on all tables in schema public to {reader}")
    quoted = urllib.parse.quote(secret, safe="")
    as_reader = pg_url.replace(
        f"{pgcluster.USER}:{urllib.parse.quote(pgcluster.PASSWORD, safe='')}@",
        f"{reader}:{quoted}@",
    )
    assert as_reader != pg_url
    checked = _memtrack("check", "--json", str(tmp_path / "check.json"), cwd=repo, url=as_reader)
    assert checked.returncode == 0, checked.stderr
    assert "new · decoder[batch=1] · allocated" in checked.stdout  # a push: judged, shown
    (warning,) = checked.stderr.strip().splitlines()
    assert warning.startswith("warning: verdicts not recorded: ") and "verdicts" in warning
    assert json.loads((tmp_path / "check.json").read_text())["verdicts"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("select count(*) from verdicts").fetchone() == (0,)


def test_the_dashboard_reads_a_server_through_one_connection_per_session(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overview's first draw and its reruns read through one connection, which names itself
    to the server; ended by the server (a restart, an idle-session reaper), the next rerun
    opens another and draws the page all the same."""
    from apptables import drawn

    with open_store(parse_database(pg_url, "url")) as store:
        store.write_run(make_run([make_measurement("decoder", {"batch": b}) for b in (1, 4)]))
    app = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
    monkeypatch.setattr(sys, "argv", [str(app), "--db", pg_url])
    name = urllib.parse.urlsplit(pg_url).path.lstrip("/")

    def server(sql: str) -> list[tuple[Any, ...]]:
        with open_store(parse_database(pg_url, "url"), readonly=True) as s:
            return [tuple(r) for r in s.conn.execute(sql, [name]).fetchall()]

    def dashboards() -> list[int]:
        return [
            pid
            for (pid,) in server(
                "select pid from pg_stat_activity where datname = ? "
                "and application_name = 'memtrack dashboard'"
            )
        ]

    def ended() -> int:  # sessions of the database that have ended, every one counted
        return int(server("select sessions from pg_stat_database where datname = ?")[0][0])

    at = drawn(str(app))
    (first,) = dashboards()
    before = ended()
    mine = ended() - before  # what one look of this test's own adds
    for _ in range(3):
        at.run()
        assert not at.exception
    assert dashboards() == [first]
    assert ended() - before == 3 * mine, mine  # this test's own looks only
    ended_by_server = "select pg_terminate_backend(pid) from pg_stat_activity where datname = ?"
    server(f"{ended_by_server} and pid = {first}")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    (again,) = dashboards()
    assert again != first
    assert "decoder" in "\n".join(str(m.value) for m in at.markdown)


# -- a server that restarts, fills up or goes away -----------------------------------------

WAITS = """\
import os
import pathlib
import time

import torch

import memtrack


@memtrack.workload
def waits(ctx):
    here = pathlib.Path(os.environ["HANDSHAKE"])

    def step():
        (here / "measuring").touch()
        deadline = time.monotonic() + 300
        while not (here / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return torch.ones(4).sum()

    return step
"""


def _measuring(tmp_path: Path, url: str, **env: str) -> tuple[Path, Path, subprocess.Popen]:
    """`memtrack run --db URL` started in a new repository whose one case waits, once it is
    measuring, until the test creates `go` in the handshake folder. The repository, the
    handshake folder and the process; returns once the case is measuring."""
    repo = init_repo(tmp_path / "repo")
    (repo / "wl.py").write_text(WAITS)
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nrepeats = 1\nwarmup = 1\n')
    (repo / ".gitignore").write_text("__pycache__/\n")
    commit_all(repo, "a case that waits")
    handshake = tmp_path / "handshake"
    handshake.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memtrack.cli", "run", "--db", url],
        cwd=repo,
        env={**os.environ, "HANDSHAKE": str(handshake), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (handshake / "measuring").exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return repo, handshake, proc


def _sessions(url: str, application: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name="the test") as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where application_name = %s", [application]
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_run_holds_no_connection_while_it_measures_and_a_restart_changes_nothing(
    tmp_path: Path,
) -> None:
    """Restarted (`pg_ctl restart -m fast`) while `run --db` measures, under an
    idle-session timeout shorter than the measurement: the run is recorded with no manual
    step, and nothing is left in the checkout."""
    if pgcluster.unavailable():
        pytest.skip(f"no PostgreSQL for the server tests: {pgcluster.unavailable()}")
    import psycopg

    cluster = pgcluster.Cluster()
    try:
        url = cluster.database()
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"alter database \"{name}\" set idle_session_timeout = '1s'")
        repo, handshake, proc = _measuring(tmp_path, url, MEMTRACK_SERVER_RETRY_S="60")
        assert _sessions(url, "memtrack") == 0  # measuring, no connection held
        cluster.restart()
        time.sleep(1.5)  # past the idle-session timeout too
        (handshake / "go").touch()
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out + err
        with open_store(parse_database(url, "url"), readonly=True) as store:
            assert len(store.run_ids()) == 1
        assert git(repo, "status", "--porcelain") == ""  # no run kept in the checkout
    finally:
        cluster.stop()


def test_a_run_the_server_cannot_take_is_spooled_and_the_next_check_records_it(
    tmp_path: Path,
) -> None:
    """The server down when the run is measured and for longer than memtrack waits: the run
    is kept in the spool, outside the checkout, and the next `check` against that database
    records it, once."""
    if pgcluster.unavailable():
        pytest.skip(f"no PostgreSQL for the server tests: {pgcluster.unavailable()}")
    cluster = pgcluster.Cluster()
    spooled = tmp_path / "spool"
    env = {"MEMTRACK_SERVER_RETRY_S": "1", "MEMTRACK_SPOOL": str(spooled)}
    try:
        url = cluster.database()
        repo, handshake, proc = _measuring(tmp_path, url, **env)
        cluster.halt()
        (handshake / "go").touch()
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 2, out + err
        assert "trying again in 1 s" in err and "the run is kept in" in err, err
        (kept,) = spooled.glob("*/memtrack-run-*.json")
        assert git(repo, "status", "--porcelain") == ""
        cluster.resume()
        checked = _memtrack("check", cwd=repo, url=url, env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "kept in the spool since it was measured: recorded" in checked.stderr
        assert not kept.exists()
        with open_store(parse_database(url, "url"), readonly=True) as store:
            assert len(store.run_ids()) == 1
        again = _memtrack("check", cwd=repo, url=url, env=env)
        assert "spool" not in again.stderr
    finally:
        cluster.stop()


def test_a_check_at_the_connection_limit_waits_for_a_slot(pg_url: str, tmp_path: Path) -> None:
    """The server full for this role (its CONNECTION LIMIT reached): the gate says each wait
    in one line and passes once a slot frees."""
    import psycopg

    repo = _recorded_commit(tmp_path, pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("create role limited login password 'one' connection limit 1")
        conn.execute("grant all on all tables in schema public to limited")
        conn.execute("grant all on all sequences in schema public to limited")
    as_limited = pg_url.replace(
        f"{pgcluster.USER}:{urllib.parse.quote(pgcluster.PASSWORD, safe='')}@", "limited:one@"
    )
    held = psycopg.connect(as_limited)  # the one slot, taken
    env = {**os.environ, "MEMTRACK_DB": as_limited, "MEMTRACK_SERVER_RETRY_S": "300"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memtrack.cli", "check"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # waits for the slot, and says so
    held.close()
    out, err = proc.communicate(timeout=600)
    assert "too many connections" in first and "trying again in 1 s" in first, first
    assert "one" not in first.replace("connections", "")  # no password in it
    assert proc.returncode == 0, out + err
    assert "new · decoder[batch=1] · allocated" in out


def test_a_writer_stuck_in_one_repository_does_not_hold_up_another_s(
    pg_url: str, tmp_path: Path
) -> None:
    """A writer of repository A holds its transaction open (a slow ingest, a hung runner):
    repository B's runs are recorded and its check records its verdicts meanwhile; a reader
    of A waits for nothing either."""
    upstream, other = "github.com/acme/a", "github.com/acme/b"
    repo = init_repo(tmp_path / "b")
    (repo / "memtrack.toml").write_text(f'base_branch = "main"\nrepository = "{other}"\n')
    sha = commit_all(repo, "a model")
    mine = make_run([make_measurement()], commit=sha)
    record = tmp_path / "b.json"
    write_json(replace_repository(mine, other), record)
    with open_store(parse_database(pg_url, "url")) as stuck:
        stuck.write_run(replace_repository(make_run([make_measurement()]), upstream))
        with stuck._writing():  # A's writer, stuck inside its transaction
            stuck.claim(upstream)
            # each would wait out the lock's timeout and fail, were it A's lock it waited on
            ingested = _memtrack("ingest", str(record), cwd=repo, url=pg_url)
            assert ingested.returncode == 0, ingested.stderr
            checked = _memtrack("check", cwd=repo, url=pg_url)
            assert checked.returncode == 0, checked.stdout + checked.stderr
            assert "warning" not in checked.stderr  # its verdicts recorded
            shown = _memtrack("history", "decoder", cwd=repo, url=pg_url)
            assert shown.returncode == 0, shown.stderr
    with open_store(parse_database(pg_url, "url"), readonly=True) as store:
        (count,) = store.conn.execute("select count(*) from verdicts").fetchone()
        assert count > 0


def replace_repository(run: Any, repository: str) -> Any:
    return dataclasses.replace(run, git=dataclasses.replace(run.git, repository=repository))


def test_only_a_server_that_may_answer_later_is_waited_for() -> None:
    """A restart, a full server, a lost connection: waited for. A missing password, a host
    name that does not resolve, no such database: said at once."""
    import psycopg

    from memtrack.store.server import transient

    socket = 'connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed: '
    for text in (
        socket + "No such file or directory",
        socket + 'FATAL:  too many connections for role "ci"',
        socket + "FATAL:  the database system is starting up",
        "connection failed: server closed the connection unexpectedly",
    ):
        assert transient(psycopg.OperationalError(text)), text
    for text in (
        socket + "fe_sendauth: no password supplied",
        'connection failed: failed to resolve host "db.intrenal": Name or service not known',
        socket + 'FATAL:  database "memtrack" does not exist',
        socket + 'FATAL:  password authentication failed for user "ci"',
    ):
        assert not transient(psycopg.OperationalError(text)), text
