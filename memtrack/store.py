"""The SQLite store: runs, environments, measurements and per-device rows.

Schema changes only through `memtrack.migrations` (sqlite-utils), one function per change. A run
is written in one `BEGIN IMMEDIATE` transaction, so a killed process leaves no half run.
The file stays a plain SQLite database that `sqlite3` or Datasette can open.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memtrack import migrations
from memtrack.errors import StoreError
from memtrack.records import (
    CIInfo,
    DeviceMeasurement,
    Environment,
    GitInfo,
    GpuInfo,
    Measurement,
    RunRecord,
    device_peak,
    host_peak,
    host_step,
    to_dict,
)

BUSY_TIMEOUT_S = 30.0


def _json(value: Any) -> str:
    return json.dumps(to_dict(value), sort_keys=True)


def _prefixed(obj: Any, prefix: str) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[prefix + f.name] = _json(value) if isinstance(value, (tuple, list, dict)) else value
    return out


def _unprefixed(cls: type, row: dict[str, Any], prefix: str, json_fields: set[str]) -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = row.get(prefix + f.name)
        if f.name in json_fields and isinstance(value, str):
            value = json.loads(value)
            value = tuple(value) if isinstance(value, list) else value
        kwargs[f.name] = value
    return cls(**kwargs)


_GIT_JSON = {"notes"}
_ENV_JSON = {"gpus", "torch_cuda_arch_list", "packages", "env_vars", "visible_uuids", "notes"}
_MEASUREMENT_JSON = {"params", "allocated_samples", "categories", "iteration_times_s", "notes"}


def env_id(env: Environment) -> str:
    return hashlib.sha256(_json(env).encode()).hexdigest()[:16]


class Store:
    """A memtrack database. Open it with `Store.open(path)`; read-only for viewers."""

    def __init__(self, conn: sqlite3.Connection, path: Path, readonly: bool):
        self.conn = conn
        self.path = path
        self.readonly = readonly

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False) -> Store:
        """Open (creating and migrating unless read-only). Raises StoreError."""
        path = Path(path)
        if readonly:
            if not path.is_file():
                raise StoreError(f"{path}: no such database (record a run with `memtrack run`)")
            conn = sqlite3.connect(
                f"file:{path}?mode=ro",
                uri=True,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("select count(*) from sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{path}: not a SQLite database ({exc})") from None
        store = cls(conn, path, readonly)
        if readonly:
            store.check_schema()
        else:
            conn.execute("PRAGMA journal_mode=wal")
            store.check_schema(allow_pending=True)
            if set(migrations.names()) - store.applied_migrations():
                import sqlite_utils  # only here: it is slow to import

                migrations.migrations().apply(sqlite_utils.Database(conn))
        return store

    def applied_migrations(self) -> set[str]:
        has_table = self.conn.execute(
            "select 1 from sqlite_master where type = 'table' and name = '_sqlite_migrations'"
        ).fetchone()
        if not has_table:
            return set()
        rows = self.conn.execute(
            "select name from _sqlite_migrations where migration_set = ?", [migrations.SET_NAME]
        )
        return {r[0] for r in rows}

    def table_names(self) -> set[str]:
        rows = self.conn.execute("select name from sqlite_master where type = 'table'")
        return {r[0] for r in rows}

    def check_schema(self, *, allow_pending: bool = False) -> None:
        """Refuse a database that a newer memtrack migrated, or one that is not memtrack's."""
        known = set(migrations.names())
        applied = self.applied_migrations()
        unknown = applied - known
        if unknown:
            raise StoreError(
                f"{self.path}: schema has migrations this memtrack does not know "
                f"({', '.join(sorted(unknown))}); upgrade memtrack to read it"
            )
        if not applied and "runs" in self.table_names():
            raise StoreError(f"{self.path}: has a 'runs' table but no memtrack schema record")
        if not allow_pending and known - applied:
            if not applied:
                raise StoreError(f"{self.path}: empty database (record a run with `memtrack run`)")
            raise StoreError(
                f"{self.path}: schema is older than this memtrack "
                f"(pending: {', '.join(sorted(known - applied))}); open it once with `memtrack run`"
            )

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------

    def has_run(self, run_id: str) -> bool:
        return (
            self.conn.execute("select 1 from runs where run_id = ?", [run_id]).fetchone()
            is not None
        )

    def write_run(self, run: RunRecord) -> bool:
        """Insert a run and its measurements in one transaction. False if already there."""
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            if self.has_run(run.run_id):
                self.conn.execute("ROLLBACK")
                return False
            self._insert_run(run)
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        return True

    def _insert_run(self, run: RunRecord) -> None:
        env = run.environment
        eid = env_id(env)
        self._insert("environments", {"env_id": eid, **_prefixed(env, "")}, ignore=True)
        self._insert(
            "runs",
            {
                "run_id": run.run_id,
                "started_at": run.started_at,
                "finished_at": run.finished_at,
                "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "suite_hash": run.suite_hash,
                "config_path": run.config_path,
                "shard": run.shard,
                "schema_version": run.schema_version,
                "env_id": eid,
                "fingerprint": env.fingerprint,
                **_prefixed(run.git, "git_"),
                **_prefixed(run.ci, "ci_"),
            },
        )
        for m in run.measurements:
            row = _prefixed(m, "")
            devices = row.pop("devices")
            del devices
            row["run_id"] = run.run_id
            row["device_peak_bytes"] = device_peak(m)
            row["host_bytes"] = host_peak(m)
            row["host_step_bytes"] = host_step(m)
            mid = self._insert("measurements", row)
            for d in m.devices:
                self._insert("device_measurements", {"measurement_id": mid, **_prefixed(d, "")})

    def _insert(self, table: str, row: dict[str, Any], *, ignore: bool = False) -> int | None:
        cols = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" for _ in row)
        verb = "insert or ignore" if ignore else "insert"
        cur = self.conn.execute(
            f"{verb} into {table} ({cols}) values ({marks})", list(row.values())
        )
        return cur.lastrowid

    # -- reading ---------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord:
        """A whole run by id or unique id prefix."""
        rows = self.conn.execute(
            "select * from runs where run_id like ? || '%' limit 2", [run_id]
        ).fetchall()
        if not rows:
            raise StoreError(f"{self.path}: no run {run_id!r}")
        if len(rows) > 1:
            raise StoreError(f"{self.path}: run id prefix {run_id!r} is ambiguous")
        row = dict(rows[0])
        env = self.get_environment(row["env_id"])
        assert env is not None  # a foreign key of the run
        git = _unprefixed(GitInfo, row, "git_", _GIT_JSON)
        git = dataclasses.replace(
            git, dirty=None if git.dirty is None else bool(git.dirty), shallow=bool(git.shallow)
        )
        measurements = tuple(self._measurements(row["run_id"]))
        return RunRecord(
            run_id=row["run_id"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            git=git,
            ci=_unprefixed(CIInfo, row, "ci_", set()),
            environment=env,
            suite_hash=row["suite_hash"],
            config_path=row["config_path"],
            measurements=measurements,
            shard=row["shard"],
            schema_version=row["schema_version"],
        )

    def get_environment(self, env_id: str | None) -> Environment | None:
        row = self.conn.execute("select * from environments where env_id = ?", [env_id]).fetchone()
        if row is None:
            return None
        env = _unprefixed(Environment, dict(row), "", _ENV_JSON)
        available = None if env.cuda_available is None else bool(env.cuda_available)
        return dataclasses.replace(  # rows recorded before a column existed hold NULL
            env,
            gpus=tuple(GpuInfo(**g) for g in env.gpus),
            cuda_available=available,
            visible_uuids=env.visible_uuids or (),
            notes=env.notes or (),
        )

    def _measurements(self, run_id: str) -> Iterator[Measurement]:
        rows = self.conn.execute(
            "select * from measurements where run_id = ? order by id", [run_id]
        ).fetchall()
        for r in rows:
            row = dict(r)
            devs = self.conn.execute(
                'select * from device_measurements where measurement_id = ? order by "index"',
                [row["id"]],
            ).fetchall()
            row["devices"] = None
            m = _unprefixed(Measurement, row, "", _MEASUREMENT_JSON)
            yield dataclasses.replace(
                m, devices=tuple(_unprefixed(DeviceMeasurement, dict(d), "", set()) for d in devs)
            )

    def run_ids(self, *, commit: str | None = None, limit: int = 50) -> list[str]:
        """Run ids, newest first; only those of `commit` (a SHA prefix) when given."""
        if commit:
            rows = self.conn.execute(
                "select run_id from runs where git_commit like ? || '%' "
                "order by started_at desc limit ?",
                [commit, limit],
            )
        else:
            rows = self.conn.execute(
                "select run_id from runs order by started_at desc limit ?", [limit]
            )
        return [r[0] for r in rows]

    def history(
        self, pattern: str, *, limit: int = 50, branch: str | None = None
    ) -> list[dict[str, Any]]:
        """Measurements whose case id is `pattern` or starts with `pattern[`, newest first."""
        sql = (
            "select m.*, r.started_at, r.git_commit, r.git_branch, r.git_subject, r.git_dirty, "
            "r.fingerprint from measurements m join runs r on r.run_id = m.run_id "
            "where (m.case_id = :p or m.case_id like :p || '[%') "
        )
        if branch:
            sql += "and r.git_branch = :b "
        sql += "order by r.started_at desc, m.id desc limit :n"
        rows = self.conn.execute(sql, {"p": pattern, "b": branch, "n": limit}).fetchall()
        return [dict(r) for r in rows]

    def case_ids(self) -> list[str]:
        return [
            r[0] for r in self.conn.execute("select distinct case_id from measurements order by 1")
        ]
