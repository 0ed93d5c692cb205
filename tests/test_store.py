from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner
from factories import GPU_ENV, HOST_FILE, MiB, make_measurement, make_run

from memtrack.cli import main
from memtrack.errors import StoreError
from memtrack.records import CIInfo, read_json, write_json
from memtrack.store.database import Store
from memtrack.units import format_size


def test_a_run_reads_back_as_written(tmp_path):
    run = make_run(
        [
            make_measurement(
                "decoder",
                {"batch": b},
                peak=b * MiB,
                device="cuda",
                reserved=b * 2 * MiB,
                device_peak=b * 3 * MiB,
            )
            for b in (1, 8)
        ],
        env=GPU_ENV,
    )
    with Store.open(tmp_path / "m.db") as store:
        assert store.write_run(run) is True
        assert store.write_run(run) is False  # same run id: one run
        assert store.get_run(run.run_id) == run
        assert store.get_run(run.run_id[:8]) == run
        row = store.history("decoder")[0]
        assert row["device_peak_bytes"] == 24 * MiB  # the largest device's peak, queryable


def test_the_file_is_plain_sqlite_in_wal_mode(tmp_path):
    db = tmp_path / "m.db"
    with Store.open(db) as store:
        store.write_run(make_run([make_measurement()]))
    conn = sqlite3.connect(db)
    assert conn.execute("pragma journal_mode").fetchone()[0] == "wal"
    assert conn.execute("select count(*) from measurements").fetchone()[0] == 1
    names = [r[0] for r in conn.execute("select name from _sqlite_migrations")]
    assert names[0] == "m001_initial"


def test_read_only_open_refuses_missing_empty_and_unknown_schema(tmp_path):
    with pytest.raises(StoreError, match="no such database"):
        Store.open(tmp_path / "none.db", readonly=True)
    sqlite3.connect(tmp_path / "empty.db").close()
    with pytest.raises(StoreError, match="empty database"):
        Store.open(tmp_path / "empty.db", readonly=True)
    db = tmp_path / "future.db"
    Store.open(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "insert into _sqlite_migrations (migration_set, name, applied_at) "
            "values ('memtrack', 'm999_from_the_future', 'now')"
        )
    for readonly in (True, False):
        with pytest.raises(StoreError, match="m999_from_the_future"):
            Store.open(db, readonly=readonly)


def test_read_only_store_cannot_write(tmp_path):
    db = tmp_path / "m.db"
    Store.open(db).close()
    with Store.open(db, readonly=True) as store, pytest.raises(StoreError, match="read-only"):
        store.write_run(make_run([make_measurement()]))


def test_ingest_is_idempotent_and_rejects_bad_records_whole(tmp_path):
    runs = [make_run([make_measurement(peak=p * MiB)]) for p in (1, 2)]
    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"r{i}.json")
        write_json(run, paths[-1])
    db = tmp_path / "m.db"
    cli = CliRunner()
    r1 = cli.invoke(main, ["ingest", "--db", str(db), *map(str, paths)])
    r2 = cli.invoke(main, ["ingest", "--db", str(db), *map(str, paths)])
    assert r1.exit_code == 0 and "2 run(s) added" in r1.output
    assert r2.exit_code == 0 and "0 run(s) added, 2 already present" in r2.output
    with Store.open(db, readonly=True) as store:
        assert sorted(store.run_ids()) == sorted(r.run_id for r in runs)
        assert store.get_run(runs[1].run_id) == read_json(paths[1])

    bad = tmp_path / "bad.json"
    data = json.loads(paths[0].read_text())
    data["schema_version"] = 99
    bad.write_text(json.dumps(data))
    third = tmp_path / "r3.json"
    write_json(make_run([make_measurement()]), third)
    r3 = cli.invoke(main, ["ingest", "--db", str(db), str(third), str(bad)])
    assert r3.exit_code == 2
    assert "bad.json: schema_version 99 is not supported" in r3.output
    with Store.open(db, readonly=True) as store:
        assert len(store.run_ids()) == 2  # nothing of the batch was written


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from factories import make_measurement, make_run
    from memtrack.store.database import Store
    store = Store.open({db!r})
    print("ready", flush=True)
    while True:
        store.write_run(make_run([make_measurement("w", {{"i": i}}) for i in range(300)]))
    """
)


def test_a_killed_writer_leaves_no_half_run(tmp_path):
    db = tmp_path / "m.db"
    code = WRITER.format(tests=str(__import__("pathlib").Path(__file__).parent), db=str(db))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(2.5)
    proc.kill()  # SIGKILL, most likely in the middle of a transaction
    proc.wait()
    conn = sqlite3.connect(db)
    assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    counts = conn.execute(
        "select r.run_id, count(m.id) from runs r "
        "left join measurements m using (run_id) group by 1"
    ).fetchall()
    assert counts, "the writer wrote no run at all in 2.5 s"
    assert {n for _, n in counts} == {300}
    orphans = conn.execute(
        "select count(*) from measurements where run_id not in (select run_id from runs)"
    ).fetchone()[0]
    assert orphans == 0


# -- opening: quoted paths, foreign files, empty files --------------------------------------


@pytest.mark.parametrize("folder", ["a#b", "c?mode=rw&x=1", "sp ace%20"])
def test_read_only_open_takes_the_path_literally(tmp_path, folder):
    db = tmp_path / folder / "m.db"
    with Store.open(db) as store:
        store.write_run(make_run([make_measurement()]))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with Store.open(db, readonly=True) as store:
        assert len(store.run_ids()) == 1
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.conn.execute("delete from runs")
    after = sorted(p.name for p in tmp_path.rglob("*") if not p.name.endswith(("-shm", "-wal")))
    assert after == [n for n in before if not n.endswith(("-shm", "-wal"))]  # nothing else made


def test_a_foreign_sqlite_file_is_refused_unchanged(tmp_path):
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("create table notes (body text)")
    conn.execute("insert into notes values ('mine')")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    for readonly in (False, True):
        with pytest.raises(StoreError, match="not a memtrack database"):
            Store.open(db, readonly=readonly)
    assert db.read_bytes() == before  # not even switched to WAL
    res = CliRunner().invoke(main, ["ingest", "--db", str(db), str(tmp_path / "none.json")])
    assert res.exit_code == 2
    assert db.read_bytes() == before


def test_check_on_an_empty_file_writes_nothing_into_it(tmp_path):
    db = tmp_path / "m.db"
    db.touch()
    res = CliRunner().invoke(main, ["check", "--db", str(db), "--run", "x"])
    assert res.exit_code == 2 and "not a memtrack database" in res.output
    assert db.stat().st_size == 0


# -- matching is literal ---------------------------------------------------------------------


def test_run_ids_and_case_names_are_matched_literally(tmp_path):
    db = tmp_path / "m.db"
    run = make_run([make_measurement("decoder_generate", {"sessions": s}) for s in (1, 4)])
    with Store.open(db) as store:
        store.write_run(run)
        assert store.get_run(run.run_id[:6]).run_id == run.run_id
        for wildcard in ("%", "_" * len(run.run_id), run.run_id[:3] + "%"):
            with pytest.raises(StoreError, match="no run"):
                store.get_run(wildcard)
        assert len(store.history("decoder_generate")) == 2
        assert store.history("decoder_generat_") == []
        assert store.history("%") == []
        assert store.run_ids(commit="%") == []
        assert store.run_ids(commit=run.git.commit[:7].upper()) == [run.run_id]


def test_history_refuses_a_limit_below_one_and_names_the_nearest_cases(tmp_path):
    db = tmp_path / "m.db"
    with Store.open(db) as store:
        store.write_run(
            make_run([make_measurement("decoder_generate", {"sessions": s}) for s in (1, 4)])
        )
    cli = CliRunner()
    res = cli.invoke(main, ["history", "decoder_generate", "-n", "-1", "--db", str(db)])
    assert res.exit_code == 2
    res = cli.invoke(main, ["history", "decoder_generat", "--db", str(db)])
    assert res.exit_code == 2 and "did you mean decoder_generate" in res.output
    res = cli.invoke(main, ["history", "decoder_generate", "--db", str(db)])
    assert res.exit_code == 0
    # the two series read apart, as in `run` and `check`
    assert "decoder_generate[sessions=1]" in res.output
    assert "decoder_generate[sessions=4]" in res.output


def test_show_says_none_for_missing_versions_and_formats_cudnn(tmp_path):
    db = tmp_path / "m.db"
    gpu = make_run([make_measurement()], env=replace(GPU_ENV, cudnn="92400"))
    cpu = make_run([make_measurement()])
    with Store.open(db) as store:
        store.write_runs([gpu, cpu])
    cli = CliRunner()
    res = cli.invoke(main, ["show", gpu.run_id, "--db", str(db)])
    assert "580.65 / 13.0 / 9.24.0" in res.output
    res = cli.invoke(main, ["show", cpu.run_id, "--db", str(db)])
    assert "none / none / none" in res.output and "None" not in res.output


def test_show_connects_the_host_peak_with_the_host_figures_check_gates(tmp_path):
    db = tmp_path / "m.db"
    run = make_run([make_measurement(host=360 * MiB, host_step=12 * MiB)])
    with Store.open(db) as store:
        store.write_run(run)
    res = CliRunner().invoke(main, ["show", run.run_id, "--db", str(db)], terminal_width=240)
    # `check` says "host 360.00 MiB": `show` says which part of the peak RSS that is
    line = next(x for x in res.output.splitlines() if "(vmhwm)" in x)
    assert (
        f"{format_size(360 * MiB + HOST_FILE)} (vmhwm) = {format_size(HOST_FILE)} "
        "file-backed (shared libraries) + 360.00 MiB gated as `host`"
    ) in line
    assert "the step's growth 12.00 MiB, gated as `host_step`" in line


def test_show_splits_training_state_and_names_the_cpu_gap_for_what_it_is(tmp_path):
    db = tmp_path / "m.db"
    cpu = make_measurement(
        "train",
        gradients_bytes=3 * MiB,
        optimizer_state_bytes=6 * MiB,
        training_state_bytes=9 * MiB,
        workspace_bytes=300 * MiB,
    )
    gpu = make_measurement("serve", device="cuda", workspace_bytes=500 * MiB)
    runs = make_run([cpu]), make_run([gpu], env=GPU_ENV)
    with Store.open(db) as store:
        store.write_runs(list(runs))

    def rows(run) -> dict[str, str]:
        out = (
            CliRunner()
            .invoke(main, ["show", run.run_id, "--db", str(db)], terminal_width=240)
            .output
        )
        assert "training state" not in out
        return {
            line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.splitlines()
            if line.count("│") == 3
        }

    on_cpu, on_gpu = rows(runs[0]), rows(runs[1])
    assert on_cpu["gradients"] == "3.00 MiB" and on_cpu["optimizer state"] == "6.00 MiB"
    assert on_cpu["host RSS beyond tensors (interpreter, libraries)"] == "300.00 MiB"
    assert "workspace/runtime" not in on_cpu
    assert on_gpu["workspace/runtime"] == "500.00 MiB"  # the GPU's: beyond the allocator


def test_a_replaced_database_file_is_not_written(tmp_path):
    db = tmp_path / "m.db"
    with Store.open(db) as store:
        store.write_run(make_run([make_measurement()]))
        db.rename(tmp_path / "moved.db")
        with pytest.raises(StoreError, match="deleted or replaced"):
            store.write_run(make_run([make_measurement()]))
    assert not db.exists()


def _checked(run_id: str, *verdicts):
    from memtrack.judge.check import CheckResult

    return CheckResult(
        run_id=run_id,
        commit=None,
        branch="pr",
        started_at="2026-01-01T00:00:00+00:00",
        fingerprint="cpu",
        base_branch="main",
        merge_base=None,
        baseline_mode="time",
        verdicts=verdicts,
        checked_at="2026-01-01T01:00:00+00:00",
    )


def test_verdicts_are_written_whole_or_not_at_all_through_the_stores_write_path(tmp_path):
    db = tmp_path / "m.db"
    run = make_run([make_measurement()], branch="pr")
    ok = {"case_id": "decoder[batch=1]", "metric": "allocated", "kind": "ok", "blocking": False}
    grew = {**ok, "metric": "host", "kind": "regression", "blocking": True, "delta": float(MiB)}

    def stored(store):
        rows = store.conn.execute("select metric, kind, blocking, delta, checked_at from verdicts")
        return sorted(tuple(r) for r in rows)

    first = [
        ("allocated", "ok", 0, None, "2026-01-01T01:00:00+00:00"),
        ("host", "regression", 1, MiB, "2026-01-01T01:00:00+00:00"),
    ]
    checked = _checked(run.run_id)
    with Store.open(db) as store:
        store.write_run(run)
        assert store.save_verdicts(checked, [ok, grew]) == 2
        assert stored(store) == first
        # a row SQLite cannot take: the check's earlier verdicts are not deleted either
        unbindable = {**ok, "message": ["not", "text"]}
        with pytest.raises(StoreError, match="m.db"):
            store.save_verdicts(checked, [ok, unbindable])
        assert stored(store) == first and not store.conn.in_transaction
    with Store.open(db, readonly=True) as store:
        with pytest.raises(StoreError, match="read-only, cannot record verdicts"):
            store.save_verdicts(checked, [ok])
        assert stored(store) == first
    with Store.open(db) as store:
        db.rename(tmp_path / "moved.db")
        with pytest.raises(StoreError, match="deleted or replaced"):
            store.save_verdicts(checked, [ok])
        assert stored(store) == first


def test_an_older_schema_is_read_as_it_is_only_when_asked(tmp_path):
    db = tmp_path / "m.db"
    with Store.open(db) as store:
        store.write_run(make_run([make_measurement()]))
        store.conn.execute("drop table verdicts")
        store.conn.execute("delete from _sqlite_migrations where name != 'm001_initial'")
    with pytest.raises(StoreError, match="schema is older than this memtrack"):
        Store.open(db, readonly=True)
    with Store.open(db, readonly=True, older=True) as store:
        assert store.readonly and len(store.run_ids()) == 1
    # an empty or a newer schema is refused all the same
    sqlite3.connect(tmp_path / "empty.db").close()
    with pytest.raises(StoreError, match="empty database"):
        Store.open(tmp_path / "empty.db", readonly=True, older=True)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "insert into _sqlite_migrations (migration_set, name, applied_at) "
            "values ('memtrack', 'm999_from_the_future', 'now')"
        )
    with pytest.raises(StoreError, match="m999_from_the_future"):
        Store.open(db, readonly=True, older=True)


def _estimate_db(db, commit):
    """30 measured runs of three cases, and estimate runs of the first two: one of `commit`
    (the first case only), then two started at one time (the second of them holds the
    second case only), then one that failed."""
    base = [make_measurement("decoder", {"batch": b}, peak=b * MiB) for b in (1, 8, 16)]
    runs = [make_run(base, started_at=f"2026-01-{d:02d}T00:00:00+00:00") for d in range(1, 31)]

    def estimate(day, peaks, status="ok", of=None):
        ms = [
            replace(
                m,
                kind="estimate",
                status=status,
                peak_allocated_bytes=peak,
                framework="fake-tensor-estimate",
            )
            for m, peak in zip(base, peaks, strict=False)
            if peak is not None
        ]
        return make_run(ms, commit=of, started_at=f"2026-02-{day:02d}T00:00:00+00:00")

    runs += [
        estimate(1, [3 * MiB], of=commit),
        estimate(2, [5 * MiB, 6 * MiB]),
        estimate(2, [None, 7 * MiB]),
        estimate(3, [9 * MiB, 9 * MiB], "error"),
    ]
    with Store.open(db) as store:
        store.write_runs(runs)
    return runs


def test_the_estimate_beside_a_case_is_its_commits_else_its_newest_by_an_index(tmp_path):
    """`check` and `show` put each case's estimate beside its measured figure: the estimate
    of the candidate's commit when there is one, else the newest that succeeded (of two
    started at one time, the one written last). The lookup goes by an index of estimates:
    at a million measured rows, reading the case's rows made `check` six times slower."""
    commit = "ab" * 20
    runs = _estimate_db(tmp_path / "m.db", commit)
    a, b, never = [m.case_id for m in runs[0].measurements]
    with Store.open(tmp_path / "m.db") as store:
        ours = store.latest_estimates([a, b, never], commit)
        newest = store.latest_estimates(iter([never, b, a]), "cd" * 20)
        only_ours = store.latest_estimates([a, b, never], commit, exact=True)
        none_of = store.latest_estimates([a, b], "cd" * 20, exact=True)
        statements: list[str] = []
        store.conn.set_trace_callback(statements.append)
        store.latest_estimates([a, b, never], commit)
        store.conn.set_trace_callback(None)
        plans = [
            row[3] for sql in statements for row in store.conn.execute("explain query plan " + sql)
        ]

    def figures(found):
        return {
            case: (e["peak_allocated_bytes"] // MiB, e["git_commit"] == commit)
            for case, e in found.items()
        }

    assert figures(ours) == {a: (3, True), b: (7, False)}  # `never` was never estimated
    assert figures(newest) == {a: (5, False), b: (7, False)}  # the failed one is left out
    assert figures(only_ours) == {a: (3, True)} and none_of == {}  # `exact`: its commit's
    assert ours[a]["run_id"] == runs[30].run_id and newest[b]["run_id"] == runs[32].run_id
    assert any("idx_measurements_estimates" in p for p in plans), plans
    assert not any("idx_measurements_case_id_run_id" in p for p in plans), plans


def test_a_database_from_before_the_estimate_index_gets_it_when_opened(tmp_path):
    db = tmp_path / "m.db"
    runs = _estimate_db(db, "ab" * 20)
    with sqlite3.connect(db) as conn:  # as memtrack left it before the index existed
        conn.execute("drop index idx_measurements_estimates")
        conn.execute("delete from _sqlite_migrations where name = 'm012_estimate_index'")
    with pytest.raises(StoreError, match="pending: m012_estimate_index"):
        Store.open(db, readonly=True)
    with Store.open(db) as store:
        indexes = {r["name"] for r in store.conn.execute("pragma index_list(measurements)")}
        assert "idx_measurements_estimates" in indexes
        assert store.get_run(runs[-2].run_id) == runs[-2]  # the rows are as they were


@pytest.mark.parametrize("lookup", [2, 64])
def test_a_run_twice_in_one_write_is_stored_once_and_other_content_refused(
    tmp_path, monkeypatch, lookup
):
    """Stored runs are looked up several at a time and written a batch at a time: a run id
    seen again, in the same batch, a later one or an earlier write, is compared with what
    was stored, never doubled."""
    import memtrack.store.database

    monkeypatch.setattr(memtrack.store.database, "_BATCH", 2)  # rows of two runs per executemany
    monkeypatch.setattr(memtrack.store.database, "_LOOKUP", lookup)
    a, b, c, d, e = (make_run([make_measurement(peak=p * MiB)]) for p in range(1, 6))
    with Store.open(tmp_path / "m.db") as store:
        assert store.write_runs([a, a, b, c, b]) == (3, 2)
        assert store.write_runs([d, c, a, e]) == (2, 2)
        with pytest.raises(StoreError, match=f"{e.run_id!r} is already stored with different"):
            store.write_runs([make_run([make_measurement()]), replace(e, suite_hash="other")])
        assert sorted(store.run_ids()) == sorted(r.run_id for r in (a, b, c, d, e))
        assert store.get_run(b.run_id) == b
        ids = [r[0] for r in store.conn.execute("select id from measurements order by id")]
    assert ids == list(range(1, 6))  # one row each, numbered in order


def test_runs_read_back_whatever_columns_their_batch_leaves_empty(tmp_path):
    """A batch's insert leaves out the columns that are NULL in all its rows: a figure held
    by one run of a batch, by none, or by every run, reads back as written."""
    gpu = make_run(
        [
            make_measurement(
                "decoder", {"batch": 8}, device="cuda", reserved=9 * MiB, device_peak=12 * MiB
            )
        ],
        env=GPU_ENV,
        ci=CIInfo(provider="github-actions", event="pull_request", pr_number=7),
    )
    cpus = [make_run([make_measurement("decoder", {"batch": b}) for b in (1, 8)]) for _ in range(2)]
    with Store.open(tmp_path / "m.db") as store:
        assert store.write_runs([cpus[0], gpu]) == (2, 0)  # columns held by one run of two
        assert store.write_runs([cpus[1]]) == (1, 0)  # device columns held by none
        for run in (*cpus, gpu):
            assert store.get_run(run.run_id) == run
        kinds = {r[0] for r in store.conn.execute("select kind from measurements")}
    assert kinds == {"measured"}


ITERATION_FIGURES = {
    "retained_samples": (6400, 0, -6400),  # an iteration may free what an earlier one made
    "iteration_cpu_times_s": (0.0105, 0.0098, 0.0101),
    "iteration_device_times_s": (0.0042, 0.0041, 0.0043),
    "timing_cpu_pressure": 0.031,
    "timing_runnable": 0.25,
    "timing_steal": 0.0,
    "timing_cores": 2,
    "session_peak_bytes": 5 * MiB,
    "sessions_sum_bytes": 12 * MiB,
}


def test_the_iteration_timing_and_session_figures_read_back_exactly(tmp_path):
    run = make_run(
        [
            make_measurement("serve", {"concurrency": 4}, **ITERATION_FIGURES),
            make_measurement("decoder"),  # none of them: defaults read back as defaults
        ]
    )
    with Store.open(tmp_path / "m.db") as store:
        store.write_run(run)
        back = store.get_run(run.run_id)
        row = store.conn.execute(
            "select retained_samples, timing_cores from measurements where case_id = ?",
            ["serve[concurrency=4]"],
        ).fetchone()
    assert back == run
    assert back.measurements[0].retained_samples == (6400, 0, -6400)
    assert back.measurements[1].retained_samples == () and back.measurements[1].timing_cores is None
    assert json.loads(row["retained_samples"]) == [6400, 0, -6400] and row["timing_cores"] == 2


def test_a_database_from_before_the_iteration_figures_reads_its_runs_as_they_were(tmp_path):
    db = tmp_path / "m.db"
    run = make_run([make_measurement()])
    with Store.open(db) as store:
        store.write_run(run)
    with sqlite3.connect(db) as conn:  # as memtrack left it before m013
        for name in ITERATION_FIGURES:
            conn.execute(f"alter table measurements drop column {name}")
        conn.execute("delete from _sqlite_migrations where name = 'm013_iteration_figures'")
    with pytest.raises(StoreError, match="pending: m013_iteration_figures"):
        Store.open(db, readonly=True)
    with Store.open(db) as store:  # migrated: the old rows hold NULL, read as the defaults
        assert store.get_run(run.run_id) == run
        later = make_run([make_measurement(**ITERATION_FIGURES)])
        store.write_run(later)
        assert store.get_run(later.run_id) == later


def test_show_prints_what_each_iteration_retained_the_timing_load_and_the_sessions(tmp_path):
    db = tmp_path / "m.db"
    run = make_run(
        [
            make_measurement("serve", {"concurrency": 4}, peak=10 * MiB, **ITERATION_FIGURES),
            make_measurement("decoder"),
        ]
    )
    with Store.open(db) as store:
        store.write_run(run)
    res = CliRunner().invoke(main, ["show", run.run_id, "--db", str(db)], terminal_width=240)
    assert res.exit_code == 0, res.output
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in res.output.splitlines()
        if line.count("│") == 3
    }
    assert rows["retained per iteration"] == "6.25 KiB, 0 B, -6.25 KiB"
    assert rows["timing pass"] == (
        "CPU time median 10.1 ms; device time median 4.2 ms; "
        "machine: CPU pressure 3%, 0.2 runnable others, steal 0%, 2 cores"
    )
    assert rows["sessions"] == "one alone 5.00 MiB, sum of 4 12.00 MiB, measured peak 10.00 MiB"
    assert res.output.count("retained per iteration") == 1  # the case without them: no row


def test_the_allocator_figures_of_a_gpu_case_are_stored_shown_and_gated(tmp_path):
    """Device memory outside the allocator and fragmentation, derived from a GPU case's own
    figures by the metric registry: stored in their columns (those of runs recorded before
    them filled by the migration that adds them), shown by `memtrack show`, judged as the
    other memory metrics are."""
    from memtrack.config import Config
    from memtrack.judge.check import check

    gpu = make_measurement(device="cuda", peak=100 * MiB, reserved=120 * MiB, device_peak=700 * MiB)
    db = tmp_path / "m.db"
    first = make_run([gpu], env=GPU_ENV)
    with Store.open(db) as store:
        store.write_run(first)
    with sqlite3.connect(db) as conn:  # as memtrack left it before m014
        for column in ("outside_allocator_bytes", "fragmentation_bytes"):
            conn.execute(f"alter table measurements drop column {column}")
        conn.execute("delete from _sqlite_migrations where name = 'm014_allocator_figures'")
    later = make_run([gpu], env=GPU_ENV, started_at="2026-01-01T00:05:00+00:00", branch="pr")
    with Store.open(db) as store:
        store.write_run(later)
        rows = store.conn.execute(
            "select outside_allocator_bytes, fragmentation_bytes from measurements"
        ).fetchall()
        result = check(store, Config(path=None, root=tmp_path), run_id=later.run_id)
    assert [tuple(r) for r in rows] == [(580 * MiB, 20 * MiB)] * 2  # backfilled, then written
    judged = {v.metric: v for v in result.verdicts}
    assert judged["outside"].kind == judged["fragmentation"].kind == "ok"
    # a library's workspace outside the allocator: the device view grows, reserved does not
    grown = make_measurement(
        device="cuda", peak=100 * MiB, reserved=120 * MiB, device_peak=764 * MiB
    )
    with Store.open(db) as store:
        for i in range(3):  # a baseline of several runs
            store.write_run(make_run([gpu], env=GPU_ENV, started_at=f"2026-01-01T00:1{i}:00+00:00"))
        pr = make_run([grown], env=GPU_ENV, started_at="2026-01-01T00:20:00+00:00", branch="pr")
        store.write_run(pr)
        checked = check(store, Config(path=None, root=tmp_path), run_id=pr.run_id)
        judged = {v.metric: v for v in checked.verdicts}
    from memtrack.report.markdown import markdown

    # the PR comment says where that is, under its table
    assert "📍 `decoder` outside: +64.00 MiB outside the caching allocator" in markdown(checked)
    assert judged["outside"].kind == "regression" and judged["outside"].blocking
    assert judged["outside"].delta == 64 * MiB
    assert judged["reserved"].kind == judged["allocated"].kind == "ok"
    res = CliRunner().invoke(main, ["show", later.run_id, "--db", str(db)], terminal_width=240)
    assert "device memory outside the allocator │ 580.00 MiB" in res.output
    assert "allocator reserved less allocated   │ 20.00 MiB" in res.output
    cpu_run = make_run([make_measurement()])  # a CPU case has neither
    with Store.open(db) as store:
        store.write_run(cpu_run)
    res = CliRunner().invoke(main, ["show", cpu_run.run_id, "--db", str(db)], terminal_width=240)
    assert "outside the allocator" not in res.output and "reserved less" not in res.output


@pytest.mark.parametrize("stored", ["'lots'", "-1", "peak_allocated_bytes + 1"])
def test_a_damaged_kernel_scratch_of_an_estimate_is_named_not_shown(tmp_path, stored):
    db = tmp_path / "memtrack.db"
    estimate = replace(
        make_measurement(peak=100 * MiB),
        kind="estimate",
        scratch_bytes=10 * MiB,
        scratch_run_id="f" * 32,
    )
    run = make_run([estimate])
    with Store.open(db) as store:
        store.write_run(run)
        found = store.latest_estimates([estimate.case_id])[estimate.case_id]
        assert (found["scratch_bytes"], found["scratch_run_id"]) == (10 * MiB, "f" * 32)
    with sqlite3.connect(db) as conn:
        conn.execute(f"update measurements set scratch_bytes = {stored}")
    with Store.open(db, readonly=True) as store:
        with pytest.raises(StoreError, match=f"run {run.run_id}: .*scratch_bytes"):
            store.latest_estimates([estimate.case_id])
