"""A run record as the rows of the store's tables, and a batch of such rows written with
one executemany per table.

A `RowMaker` is a pure function of the record, so any process can make the rows (`memtrack
ingest` makes them in forked readers); the ids that tie rows together in the database
(a measurement's id, the time it was recorded) are given by the `Batch` that writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
import sqlite3
from collections.abc import Callable
from typing import Any, NamedTuple

from memtrack.records import (
    CIInfo,
    DeviceMeasurement,
    Environment,
    GitInfo,
    Measurement,
    RankMeasurement,
    RunRecord,
    now,
    to_dict,
)
from memtrack.records.metrics import DERIVED

_SORTED = json.JSONEncoder(sort_keys=True)  # built once: json.dumps(sort_keys=...) builds one
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)


def _sorted_encoder() -> Any:
    """`_SORTED.encode` for the plain values of records, without the C encoder it builds on
    every call (a row has a dozen mappings); `_SORTED.encode` where the C encoder differs."""
    if _C_ENCODER is None:
        return _SORTED.encode
    make = _C_ENCODER(
        None,
        _SORTED.default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        True,
        False,
        True,
    )

    def encode(value: Any) -> str:
        return "".join(make(value, 0))

    sample = {"b": [1, 2.5, None, True], "a": {"é": "x\n", "c": -0.0}}
    return encode if encode(sample) == _SORTED.encode(sample) else _SORTED.encode


_sorted_json = _sorted_encoder()


def _json(value: Any) -> str:
    """Any stored value as JSON text, as the column converters below write it."""
    if isinstance(value, tuple) and not (value and dataclasses.is_dataclass(value[0])):
        return _numbers_json(value)  # texts too: json.dumps, without walking them
    if isinstance(value, dict):
        return _mapping_json(value)
    return _records_json(value)


def _numbers_json(value: Any) -> str:
    if not value:
        return "[]"
    if set(map(type, value)) <= {int, float} and all(map(math.isfinite, value)):
        # finite figures: their repr is their JSON text, without the encoder's overhead
        return f"[{', '.join(map(repr, value))}]"
    return json.dumps(value)


def _texts_json(value: Any) -> str:
    return json.dumps(value) if value else "[]"


def _mapping_json(value: Any) -> str:
    return _sorted_json(value) if value else "{}"  # records' mappings hold plain values


def _records_json(value: Any) -> str:
    return _sorted_json(to_dict(value))


class _Columns:
    """A dataclass's fields as table columns: lists and mappings stored as JSON text, each
    by the converter its annotation calls for (as `_json` would, without asking each value
    what it is: a row of a measurement has six of them)."""

    def __init__(self, cls: type, *, without: tuple[str, ...] = ()):
        fields = [f for f in dataclasses.fields(cls) if f.name not in without]
        self.names = [f.name for f in fields]
        self._get = operator.attrgetter(*self.names)
        self._json = []
        for i, f in enumerate(fields):
            hint = str(f.type)
            if hint.startswith("dict"):
                self._json.append((i, _mapping_json))
            elif hint.startswith(("tuple[int", "tuple[float")):
                self._json.append((i, _numbers_json))
            elif hint.startswith("tuple[str"):
                self._json.append((i, _texts_json))
            elif hint.startswith(("tuple", "list")):
                self._json.append((i, _records_json))

    def values(self, obj: Any, *head: Any) -> list[Any]:
        """The row of `obj`, after the values `head`."""
        out = [*head, *self._get(obj)]
        n = len(head)
        for i, convert in self._json:
            if out[i + n] is not None:
                out[i + n] = convert(out[i + n])
        return out


def env_id(env: Environment) -> str:
    return hashlib.sha256(_json(env).encode()).hexdigest()[:16]


def _insert_sql(table: str, columns: list[str], verb: str = "insert") -> str:
    cols = ", ".join(f'"{c}"' for c in columns)
    return f"{verb} into {table} ({cols}) values ({', '.join('?' for _ in columns)})"


RUN_OWN = [
    "run_id",
    "started_at",
    "finished_at",
    "recorded_at",
    "suite_hash",
    "config_path",
    "shard",
    "schema_version",
    "env_id",
    "fingerprint",
    "selection",
]
"""The columns of table `runs` that are the run's own (the rest are its git and CI facts)."""
_RECORDED_AT = RUN_OWN.index("recorded_at")

_ENV, _GIT, _CI = _Columns(Environment), _Columns(GitInfo), _Columns(CIInfo)
_M, _D = _Columns(Measurement, without=("devices", "ranks")), _Columns(DeviceMeasurement)
_R = _Columns(RankMeasurement)


class RunRows(NamedTuple):
    """The rows of one run, before the batch that writes them gives the ids: the run row's
    `recorded_at` is None, and each measurement row (with its device and rank rows) lacks
    the measurement id that comes first in the table."""

    run_id: str
    env_id: str
    env: list[Any]
    run: list[Any]
    measurements: list[tuple[list[Any], list[list[Any]], list[list[Any]]]]


class Prepared(NamedTuple):
    """A run read elsewhere: its rows, and how to get the record itself back (read where its
    run id is already stored, to compare the two). `same_as_stored`: the reader found the
    run stored with this very content (then `rows` is None); the writer still checks that
    it is stored, and reads the record where it is not."""

    run_id: str
    rows: RunRows | None
    record: Callable[[], RunRecord]
    same_as_stored: bool = False


class RowMaker:
    """`run_rows` with the last environment's id kept: the runs of a batch mostly share
    their environment, and hashing it is a large share of a run's rows."""

    def __init__(self) -> None:
        self._env: Environment | None = None
        self._env_id = ""

    def __call__(self, run: RunRecord) -> RunRows:
        env = run.environment
        if env != self._env:
            self._env, self._env_id = env, env_id(env)
        eid = self._env_id
        own = [
            run.run_id,
            run.started_at,
            run.finished_at,
            None,  # recorded_at: given by the batch
            run.suite_hash,
            run.config_path,
            run.shard,
            run.schema_version,
            eid,
            env.fingerprint,
            json.dumps(list(run.selection)) if run.selection else None,
        ]
        measurements = [
            (
                _M.values(m, run.run_id, *(x.derive(m) for x in DERIVED if x.derive)),
                [_D.values(d) for d in m.devices],
                [_R.values(r) for r in m.ranks],
            )
            for m in run.measurements
        ]
        return RunRows(
            run.run_id,
            eid,
            _ENV.values(env, eid),
            own + _GIT.values(run.git) + _CI.values(run.ci),
            measurements,
        )


RUN_REPOSITORY = len(RUN_OWN) + _GIT.names.index("repository")
"""Where a run's row (RunRows.run) holds its repository."""


class Batch:
    """Rows of several runs, written with one executemany per table."""

    _RUN_COLUMNS = [*RUN_OWN, *("git_" + n for n in _GIT.names), *("ci_" + n for n in _CI.names)]
    _TABLES = {
        "environments": ("insert or ignore", ["env_id", *_ENV.names]),
        "runs": ("insert", _RUN_COLUMNS),
        # the derived metrics are stored beside the figures, so baselines read plain SQL
        "measurements": ("insert", ["id", "run_id", *(x.column for x in DERIVED), *_M.names]),
        "device_measurements": ("insert", ["measurement_id", *_D.names]),
        "rank_measurements": ("insert", ["measurement_id", *_R.names]),
    }

    def __init__(
        self,
        conn: sqlite3.Connection,
        kept_columns: Callable[[str], set[str]],
        allocate: Callable[[int], list[int]] | None = None,
    ):
        self.conn = conn
        self.kept_columns = kept_columns
        self.allocate = allocate
        """Where measurement ids come from: a server's sequence (its writers of different
        repositories write at once); None: after the largest stored, under the file's one
        writer."""
        self.next_id = 0
        if allocate is None:
            row = conn.execute("select coalesce(max(id), 0) + 1 from measurements").fetchone()
            self.next_id = row[0]
        self.run_ids: set[str] = set()
        self.envs: dict[str, list[Any]] = {}
        self.runs: list[list[Any]] = []
        self.measurements: list[list[Any]] = []
        self.devices: list[list[Any]] = []
        self.ranks: list[list[Any]] = []
        self.recorded_at = now()
        self.rows = RowMaker()
        self.defaults: dict[str, set[str]] = {}
        """Per table, its columns with a default other than NULL, or NOT NULL."""

    def add(self, run: RunRecord | Prepared) -> None:
        """A run, or its rows as a `RowMaker` made them (in this process or another)."""
        rows = (
            self.rows(run) if not isinstance(run, Prepared) else run.rows or self.rows(run.record())
        )
        if rows.env_id not in self.envs:
            self.envs[rows.env_id] = rows.env
        self.run_ids.add(rows.run_id)
        rows.run[_RECORDED_AT] = self.recorded_at
        self.runs.append(rows.run)
        for row, devices, ranks in rows.measurements:
            mid = len(self.measurements)  # its place in the batch; its id at `flush`
            self.measurements.append([mid, *row])
            self.devices.extend([mid, *d] for d in devices)
            self.ranks.extend([mid, *r] for r in ranks)

    def _give_ids(self) -> None:
        """Each measurement's id in place of its place in the batch, in its own row and its
        devices' and ranks' rows."""
        n = len(self.measurements)
        if self.allocate is not None:
            ids = self.allocate(n) if n else []
        else:
            ids = list(range(self.next_id, self.next_id + n))
            self.next_id += n
        for rows in (self.measurements, self.devices, self.ranks):
            for row in rows:
                row[0] = ids[row[0]]

    def flush(self) -> None:
        self._give_ids()
        self._insert("environments", list(self.envs.values()))
        self._insert("runs", self.runs)
        self._insert("measurements", self.measurements)
        self._insert("device_measurements", self.devices)
        self._insert("rank_measurements", self.ranks)
        self.run_ids.clear()
        self.envs.clear()
        self.runs.clear()
        self.measurements.clear()
        self.devices.clear()
        self.ranks.clear()

    def _insert(self, table: str, rows: list[list[Any]]) -> None:
        """The rows, with one executemany. sqlite3 spends as long binding a NULL as a value,
        and most columns of a batch hold none (figures a CPU run has not, CI facts outside
        CI): a column that is NULL in every row and whose default is NULL is left out."""
        if not rows:
            return
        verb, columns = self._TABLES[table]
        if table not in self.defaults:
            self.defaults[table] = self.kept_columns(table)
        kept = self.defaults[table]
        keep = [
            i
            for i, values in enumerate(zip(*rows, strict=True))
            if values.count(None) < len(values) or columns[i] in kept
        ]
        sql = _insert_sql(table, [columns[i] for i in keep], verb)
        if len(keep) == len(columns):
            self.conn.executemany(sql, rows)
        elif len(keep) > 1:
            self.conn.executemany(sql, map(operator.itemgetter(*keep), rows))
        else:
            self.conn.executemany(sql, ([row[keep[0]]] for row in rows))
