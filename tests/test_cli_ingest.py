"""`memtrack ingest`: records from other machines are checked, a batch is all or nothing, and
a new database survives many first users at once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import commit_all, init_repo, make_measurement, make_run

from memtrack.cli import main
from memtrack.records import RankMeasurement, to_dict, write_json
from memtrack.store.database import Store


def _ingest(db: Path, *files: Path):
    return CliRunner().invoke(main, ["ingest", "--db", str(db), *map(str, files)])


def _runs(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("select count(*) from runs").fetchone()[0]
    finally:
        conn.close()


def _records(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"{i:04d}.json"
        write_json(make_run([make_measurement("decoder", {"batch": b}) for b in (1, 8)]), path)
        paths.append(path)
    return paths


def test_a_batch_with_one_bad_file_writes_nothing_and_names_it(tmp_path):
    db = tmp_path / "m.db"
    first, second, third = _records(tmp_path / "in", 3)
    data = json.loads(second.read_text())
    data["measurements"][0]["peak_allocated_bytes"] = "lots"
    second.write_text(json.dumps(data))
    third.write_text("{")  # also bad: every file is read, the count says so
    res = _ingest(db, first, second, third)
    assert res.exit_code == 2
    assert f"{second}: " in res.output and "'lots'" in res.output
    assert "1 more bad file" in res.output and len(res.output.strip().splitlines()) == 1
    assert not db.exists()  # nothing written, not even an empty database
    assert _ingest(db, first).exit_code == 0 and _runs(db) == 1
    assert _ingest(db, first, second).exit_code == 2 and _runs(db) == 1  # an existing one stays
    res = _ingest(db, first, third.with_name("0000.json"))
    assert res.exit_code == 0 and _runs(db) == 1


def test_the_same_run_again_is_skipped_and_other_content_under_its_id_is_refused(tmp_path):
    db = tmp_path / "m.db"
    (path,) = _records(tmp_path / "in", 1)
    assert _ingest(db, path).exit_code == 0
    res = _ingest(db, path)
    assert res.exit_code == 0 and "0 run(s) added, 1 already present" in res.output
    data = json.loads(path.read_text())
    data["measurements"][0]["peak_allocated_bytes"] += 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    res = _ingest(db, other)
    assert res.exit_code == 2
    assert "already stored with different content" in res.output
    with Store.open(db, readonly=True) as store:
        stored = store.get_run(data["run_id"])
    assert to_dict(stored) == json.loads(path.read_text())


def test_a_merge_base_that_is_an_option_is_refused_and_never_reaches_git(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / "f").write_text("x")
    commit = commit_all(repo, "first")
    victim = tmp_path / "victim.txt"
    run = make_run([make_measurement()], commit=commit, branch="feature")
    data = to_dict(run)
    data["git"]["merge_base"] = f"--output={victim}"
    record = tmp_path / "evil.json"
    record.write_text(json.dumps(data))
    db = tmp_path / "m.db"
    res = _ingest(db, record)
    assert res.exit_code == 2 and "merge_base" in res.output
    assert not victim.exists()
    # A database written before records were checked can still hold such a value: check
    # must not hand it to git either; it names the run's value as damage.
    _ingest(db, *_records(tmp_path / "in", 1))
    with Store.open(db) as store:
        store.write_run(run)
        store.conn.execute(
            "update runs set git_merge_base = ? where run_id = ?",
            [f"--output={victim}", run.run_id],
        )
    res = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "check", "--db", str(db), "--run", run.run_id],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and f"{db}: damaged database" in res.stderr, res.stderr
    assert "git.merge_base" in res.stderr
    assert not victim.exists()


def test_eight_processes_ingesting_into_a_new_database_lose_nothing(tmp_path):
    db = tmp_path / "new" / "m.db"
    db.parent.mkdir()  # --db names a file, in a folder that is there
    folders = []
    for p in range(8):
        _records(tmp_path / f"p{p}", 25)
        folders.append(tmp_path / f"p{p}")
    code = "import sys; from memtrack.cli import main; main(sys.argv[1:])"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                "ingest",
                "--db",
                str(db),
                *map(str, sorted(f.glob("*.json"))),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in folders
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err for _, err in outs]
    assert _runs(db) == 8 * 25
    conn = sqlite3.connect(db)
    assert conn.execute("select count(*) from measurements").fetchone()[0] == 8 * 25 * 2
    assert conn.execute("select count(*) from _sqlite_migrations").fetchone()[0] >= 2
    conn.close()


def test_a_new_database_switched_to_wal_while_another_process_writes_waits_for_it(tmp_path):
    # Two processes switching a new database to WAL at once: SQLite answers one SQLITE_BUSY
    # at once, without waiting (a deadlock of read locks). Made here without the race: the
    # database is migrated but in rollback mode, and another connection holds its write lock.
    db = tmp_path / "m.db"
    Store.open(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=delete")
    conn.close()
    held, release = threading.Event(), threading.Event()

    def writer():
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.set()
        release.wait()
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=writer)
    thread.start()
    held.wait()
    threading.Timer(0.2, release.set).start()
    try:
        with Store.open(db) as store:
            assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        release.set()
        thread.join()
    res = _ingest(db, *_records(tmp_path / "in", 2))
    assert res.exit_code == 0, res.output
    assert _runs(db) == 2


def test_a_refused_batch_never_makes_a_database_another_process_could_open(tmp_path):
    # A refused ingest into a new path makes no file at any moment: one made and removed
    # again could be opened meanwhile by a `memtrack run` starting on the same path, whose
    # measured run would then go to a deleted file. Many good records, the bad one last,
    # keep the ingest reading for a while; the path is watched all that time.
    folder = tmp_path / "in"
    files = _records(folder, 1500)
    bad = folder / "zz-bad.json"
    bad.write_text('{"schema_version": 1, "run_id": ""}')
    db = tmp_path / "new.db"
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.extend(p.name for p in tmp_path.glob("new.db*"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "memtrack.cli", "ingest", *files, str(bad), "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        done.set()
        watcher.join()
    assert res.returncode == 2, res.stderr
    assert "zz-bad.json" in res.stderr.strip().splitlines()[-1]
    assert seen == [] and not db.exists()
    # and a good batch makes it, all its runs in
    res = subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "ingest", *files, "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert _runs(db) == 1500


def test_a_refused_batch_into_a_new_database_leaves_no_database(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "run_id": ""}')
    db = tmp_path / "new.db"
    result = CliRunner().invoke(main, ["ingest", str(bad), "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert not db.exists() and not list(tmp_path.glob("new.db*"))


def test_an_interrupt_is_not_exit_1(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "w.py").write_text(
        "import time, memtrack\n\n@memtrack.workload\ndef slow(ctx):\n"
        "    return lambda: time.sleep(60)\n"
    )
    (tmp_path / "memtrack.toml").write_text('modules = ["w.py"]\n')
    init_repo(tmp_path)
    commit_all(tmp_path, "a slow suite")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memtrack.cli", "run", "--db", str(tmp_path / "m.db")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while "running" not in (line := proc.stderr.readline()):  # the first case has started
        assert line, "memtrack run ended before its first case"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "memtrack: interrupted" in err


def test_a_token_in_a_record_from_another_machine_is_redacted_before_it_is_stored(tmp_path):
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    failed = make_measurement(
        "decoder",
        {"batch": 1},
        status="error",
        message=f"ValueError: clone https://x:{token}@git.example failed",
    )
    path = tmp_path / "run.json"
    write_json(make_run([failed]), path)
    db = tmp_path / "m.db"
    res = _ingest(db, path)
    assert res.exit_code == 0, res.output
    assert token.encode() not in db.read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("m.db-*")
    )
    with Store.open(db, readonly=True) as store:
        [m] = store.get_run(json.loads(path.read_text())["run_id"]).measurements
    assert m.message == "ValueError: clone https://x:[redacted]@git.example failed"
    assert _ingest(db, path).exit_code == 0  # the same record again: already present


# -- impossible records ------------------------------------------------------------------

IMPOSSIBLE = {
    "a run id that is not hex": (
        lambda d: {**d, "run_id": "run-2026-01-01-nightly"},
        "run_id: 'run-2026-01-01-nightly' does not match",
    ),
    "a commit of 8 characters": (
        lambda d: {**d, "git": {**d["git"], "commit": "0123abcd"}},
        "git.commit: '0123abcd' does not match",
    ),
    "a merge base of 12 characters": (
        lambda d: {**d, "git": {**d["git"], "merge_base": "0123456789ab"}},
        "git.merge_base: '0123456789ab' does not match",
    ),
    "finished before it started": (
        lambda d: {
            **d,
            "started_at": "2026-01-02T00:00:00+00:00",
            "finished_at": "2026-01-01T23:59:00+00:00",
        },
        "finished_at: 2026-01-01T23:59:00+00:00 is before started_at",
    ),
    "a case id of other params": (
        lambda d: _first(d, case_id="decoder[batch=64]"),
        "measurements[0].case_id: 'decoder[batch=64]' does not match its workload and params "
        "(they make 'decoder[batch=1]')",
    ),
    "a case id of another workload": (
        lambda d: _first(d, workload="encoder"),
        "measurements[0].case_id: 'decoder[batch=1]' does not match its workload",
    ),
    "a message of 50 MB": (
        lambda d: _first(d, status="error", message="x" * 50_000_000),
        "measurements[0].message: 50,000,000 characters, more than the 10,000 a record's "
        "text may hold",
    ),
    "a subject of 20,000 characters": (
        lambda d: {**d, "git": {**d["git"], "subject": "s" * 20_000}},
        "git.subject: 20,000 characters, more than the 10,000",
    ),
    "a param's text of 20,000 characters": (
        lambda d: _first(d, params={"batch": 1, "note": "n" * 20_000}),
        "measurements[0].params['note']: 20,000 characters, more than the 10,000",
    ),
    "a 400-digit integer for a float": (
        lambda d: _first(d, time_median_s=int("9" * 400)),
        f"measurements[0].time_median_s: {'9' * 57}... is too large for a number",
    ),
    "a 400-digit integer among a float list": (
        lambda d: _first(d, iteration_times_s=[0.01, -int("9" * 400)]),
        f"measurements[0].iteration_times_s[1]: -{'9' * 56}... is too large for a number",
    ),
    "a variable's name of 20,000 characters": (
        lambda d: {**d, "environment": {**d["environment"], "env_vars": {"V" * 20_000: "1"}}},
        "environment.env_vars['VVVVVVVVVVVVVVVVVVVV']: 20,000 characters",
    ),
}


def _first(data: dict, **changes) -> dict:
    data["measurements"][0].update(changes)
    return data


@pytest.mark.parametrize("name", sorted(IMPOSSIBLE))
def test_an_impossible_record_is_one_line_naming_file_and_key_and_writes_nothing(tmp_path, name):
    change, words = IMPOSSIBLE[name]
    good, other = _records(tmp_path / "in", 2)
    db = tmp_path / "m.db"
    assert _ingest(db, good).exit_code == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(change(json.loads(other.read_text()))))
    res = _ingest(db, bad)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and line.startswith(f"memtrack: error: {bad}: "), line[:300]
    assert words in line, line[:300]
    assert len(line) < 1000  # the value is quoted short, never whole
    assert _runs(db) == 1


def test_a_token_in_a_quality_or_rank_message_is_redacted_as_run_redacts_it(tmp_path):
    """`memtrack run` redacts the quality message (it may quote the workload's quality
    function) and each rank's error; a record from another machine gets the same."""
    token = "hf_" + "QwErTyUiOp" * 4
    m = replace(
        make_measurement("decoder", {"batch": 1}),
        quality_status="error",
        quality_message=f"reference fetch with {token} failed",
        ranks=(
            RankMeasurement(0, "cpu", "ok"),
            RankMeasurement(1, "cpu", "error", message=f"401 for {token}"),
        ),
    )
    clean = make_measurement("decoder", {"batch": 8}, notes=("a plain note",))
    run = make_run([m, clean])
    path = tmp_path / "run.json"
    write_json(run, path)
    db = tmp_path / "m.db"
    assert _ingest(db, path).exit_code == 0
    with Store.open(db, readonly=True) as store:
        stored = store.get_run(run.run_id)
    assert token.encode() not in db.read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("m.db-*")
    )
    got, kept = stored.measurements
    assert got.quality_message == "reference fetch with [redacted] failed"
    assert [r.message for r in got.ranks] == [None, "401 for [redacted]"]
    assert kept == clean  # a measurement without a secret is stored as it was


def test_an_ingested_record_keeps_its_iteration_timing_and_session_figures(tmp_path):
    m = make_measurement(
        "serve",
        {"concurrency": 4},
        retained_samples=(0, -4096, 4096),
        iteration_cpu_times_s=(0.02, 0.021, 0.019),
        iteration_device_times_s=(0.005, 0.005, 0.006),
        timing_cpu_pressure=0.5,
        timing_runnable=1.5,
        timing_steal=0.01,
        timing_cores=8,
        session_peak_bytes=3 * 2**20,
        sessions_sum_bytes=9 * 2**20,
    )
    run = make_run([m])
    path = tmp_path / "run.json"
    write_json(run, path)
    db = tmp_path / "m.db"
    res = _ingest(db, path)
    assert res.exit_code == 0, res.output
    with Store.open(db, readonly=True) as store:
        assert store.get_run(run.run_id) == run
