"""Validation of records from elsewhere (JSON files, other machines) and the JSON Schema of the
run record, both derived from the dataclasses of records.model; reading and writing records
as JSON files."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrack.errors import RecordError
from memtrack.files import read_named
from memtrack.records.codec import Dialect, decode, hints, required, short
from memtrack.records.metrics import GATED
from memtrack.records.model import (
    KINDS,
    PAIR_FIGURES,
    QUALITY_STATUSES,
    SCHEMA_VERSION,
    STATUSES,
    Measurement,
    RunRecord,
    case_id,
    to_dict,
)
from memtrack.units import parse_time

# -- validation and JSON Schema -------------------------------------------------------------
#
# Records come from other machines: every value is checked before it is stored (by the typed
# JSON decoder of records.codec, in the dialect `RECORD`). The rules are derived from the
# dataclass fields and their type hints (plus a few naming conventions: `*_bytes` are byte
# counts, `*_s` seconds, `*_at` ISO times), so a new field is validated and described in the
# schema without further code. `json_schema()` writes the same rules as a JSON
# Schema; memtrack/records/schema/run-record.schema.json is its output, regenerated with
# `python -m memtrack.records > memtrack/records/schema/run-record.schema.json`.

MAX_BYTES = 2**62
"""Upper bound of a byte figure: far above any machine, far below SQLite's 64-bit limit."""
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
RUN_ID_PATTERN = r"^[0-9a-f]{32}$"
"""A run id as memtrack makes one: 32 lowercase hex digits (a UUID's)."""
COMMIT_PATTERN = r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$"
"""A whole commit id, SHA-1 or SHA-256: a prefix could name another commit, or none."""
MAX_TEXT = 10_000
"""Characters a recorded string may hold (a name, a message, a subject, a note): far more
than memtrack writes (a message is cut at 2,000), far less than a 50 MB one."""
MAX_TRACEBACK = 100_000
"""Characters of a traceback (memtrack keeps its last 20,000)."""
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_COMMIT_FIELDS = {"commit", "parent", "merge_base", "sha", "pair_ref"}
_BYTE_LISTS = {"allocated_samples", "categories"}
_BYTE_CHANGES = {"retained_samples"}
"""Byte figures that may be negative: an iteration can free what an earlier one made."""
_SHARES = {"timing_cpu_pressure", "timing_steal"}
_COUNTS = {
    "warmup",
    "repeats",
    "samples",
    "num_alloc_retries",
    "num_ooms",
    "index",
    "cpu_count",
    "pr_number",
    "rank",
    "timing_cores",
    "timing_runnable",  # a mean of counts
    "timing_wait_cores",
    "timing_others_cores",
    "iteration_instructions",
    "line",
}
SITE_GROUPINGS = ("module", "source", "pair", "process", "retained")


def _rules(name: str) -> dict[str, Any]:
    """JSON Schema keywords a field's values (or items) obey beyond their type."""
    if name in _BYTE_CHANGES:
        return {"minimum": 1 - MAX_BYTES, "maximum": MAX_BYTES - 1}
    if name.endswith("_bytes") or name in _BYTE_LISTS:
        return {"minimum": 0, "maximum": MAX_BYTES - 1}
    if name in _SHARES:
        return {"minimum": 0, "maximum": 1}
    if name.endswith("_s") or name in _COUNTS:
        return {"minimum": 0}
    if name.endswith("_at"):
        return {"format": "date-time"}
    if name in _COMMIT_FIELDS:
        return {"pattern": COMMIT_PATTERN}
    if name in ("run_id", "scratch_run_id"):
        return {"pattern": RUN_ID_PATTERN}
    if name == "status":
        return {"enum": list(STATUSES)}
    if name == "budget_metric":
        return {"enum": list(GATED)}
    if name == "quality_status":
        return {"enum": list(QUALITY_STATUSES)}
    if name in ("quality_max_abs", "quality_max_rel"):
        return {"minimum": 0}
    if name == "quality_cosine":
        return {"minimum": -1, "maximum": 1}
    if name == "quality_reference_sha256":
        return {"pattern": SHA256_PATTERN}
    if name == "pair_figure":
        return {"enum": list(PAIR_FIGURES)}
    if name == "kind":
        return {"enum": list(KINDS)}
    if name == "grouping":
        return {"enum": list(SITE_GROUPINGS)}
    if name == "shard":
        return {"pattern": r"^[1-9][0-9]*/[1-9][0-9]*$"}
    if name in ("workload", "case_id"):
        return {"minLength": 1}
    if name == "schema_version":
        return {"const": SCHEMA_VERSION}
    if name == "traceback":
        return {"maxLength": MAX_TRACEBACK}
    return {}


_SCALAR = {"type": ["string", "integer", "number", "boolean", "null"], "maxLength": MAX_TEXT}
"""A param's value (maxLength bounds it where it is a string)."""


def _hint_schema(hint: Any, rules: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        inner = _hint_schema(options[0], rules)
        if "$ref" in inner:
            return {"anyOf": [inner, {"type": "null"}]}
        if "enum" in inner:  # an enum lists every value the field takes, null too
            inner = {**inner, "enum": [*inner["enum"], None]}
        return {**inner, "type": [inner["type"], "null"]}
    if origin is tuple:
        return {"type": "array", "items": _hint_schema(args[0], rules)}
    if origin is dict:
        return {
            "type": "object",
            "propertyNames": {"maxLength": MAX_TEXT},
            "additionalProperties": _hint_schema(args[1], rules),
        }
    if dataclasses.is_dataclass(hint):
        return {"$ref": f"#/$defs/{typing.cast(type, hint).__name__}"}
    if hint is Any:
        return dict(_SCALAR)
    kind = {str: "string", bool: "boolean", int: "integer", float: "number"}[hint]
    out: dict[str, Any] = {"type": kind, **rules}
    if kind == "string":
        out.setdefault("maxLength", MAX_TEXT)
    if kind == "integer" and "const" not in out:
        out.setdefault("minimum", _INT_MIN)
        out.setdefault("maximum", _INT_MAX)
    return out


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field, read from the source (Python keeps none at runtime)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for prev, node in zip(body, body[1:], strict=False):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def _dataclasses() -> list[type]:
    """RunRecord and every dataclass nested in it, in order of first use."""
    out: list[type] = []

    def visit(cls: type) -> None:
        if cls in out:
            return
        out.append(cls)
        for _, hint in hints(cls):
            for t in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(t):
                    visit(t)  # type: ignore[arg-type]

    visit(RunRecord)
    return out


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a run record, derived from the dataclasses above."""
    defs = {}
    for cls in _dataclasses():
        docs = _field_docs(cls)
        props = {}
        for f, hint in hints(cls):
            prop = _hint_schema(hint, _rules(f.name))
            if f.name in docs:
                prop = {"description": docs[f.name], **prop}
            props[f.name] = prop
        defs[cls.__name__] = {
            "type": "object",
            "description": " ".join((cls.__doc__ or "").split()),
            "properties": props,
            "required": [f.name for f, _ in hints(cls) if required(f)],
            "additionalProperties": False,
        }
    root = defs.pop("RunRecord")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://memtrack.invalid/schema/run-record-v{SCHEMA_VERSION}.json",
        "title": "memtrack run record",
        **root,
        "$defs": defs,
    }


class RecordDialect(Dialect):
    """A run record's rules (`_rules`) and limits, and its words: the value is quoted."""

    def rules(self, name: str) -> dict[str, Any]:
        return _rules(name)

    def text(self, rules: dict[str, Any]) -> typing.Callable[[str], str] | None:
        return str.lower if rules.get("pattern") == COMMIT_PATTERN else None

    def key(self, key: Any) -> str:
        return short(key)

    def expected(self, what: str, value: Any) -> str:
        return f"expected {what}, got {short(value)}"

    def not_object(self, value: Any) -> str:
        return self.expected("an object", value)

    def too_long(self, length: int, limit: int) -> str:
        return f"{length:,} characters, more than the {limit:,} a record's text may hold"


RECORD = RecordDialect(
    RecordError,
    inline=True,
    text_limit=MAX_TEXT,
    int_range=(_INT_MIN, _INT_MAX),
    finite=True,
    scalar_any=True,
    no_nul=True,
)
"""How a run record is read: every value checked against `_rules`, plain values inline."""


def run_from_dict(data: Any, *, where: str = "record") -> RunRecord:
    """Rebuild a RunRecord from `to_dict` output, checking every value. Raises RecordError."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"{where}: schema_version {short(version)} is not supported (expected {SCHEMA_VERSION})"
        )
    try:
        run: RunRecord = decode(RunRecord, data, RECORD)
    except RecordError as exc:
        raise RecordError(f"{where}: {exc}") from None
    if run.finished_at is not None:
        started, finished = parse_time(run.started_at), parse_time(run.finished_at)
        if started is not None and finished is not None and finished < started:
            raise RecordError(
                f"{where}: finished_at: {run.finished_at} is before started_at {run.started_at}"
            )
    seen: set[str] = set()
    for i, m in enumerate(run.measurements):
        expected = case_id(m.workload, m.params)
        if m.case_id != expected:
            raise RecordError(
                f"{where}: measurements[{i}].case_id: {short(m.case_id)} does "
                f"not match its workload and params (they make "
                f"{short(expected)})"
            )
        if m.case_id in seen:
            raise RecordError(f"{where}: case {m.case_id!r} is measured twice in one run")
        seen.add(m.case_id)
        scratch_problem = _scratch_problem(m) or _pair_problem(m)
        if scratch_problem:
            raise RecordError(f"{where}: measurements[{i}].{scratch_problem}")
        if (m.budget_bytes is None) != (m.budget_metric is None) or m.budget_bytes == 0:
            raise RecordError(
                f"{where}: measurements[{i}].budget_bytes: {m.budget_bytes!r} with "
                f"budget_metric {m.budget_metric!r} (a limit of 1 byte or more, and its metric)"
            )
        numbers = [r.rank for r in m.ranks]
        if numbers != list(range(len(numbers))):
            raise RecordError(
                f"{where}: measurements[{i}].ranks: ranks {numbers} are not "
                f"0..{len(numbers) - 1} in order, each once"
            )
    return run


MAX_PAIR_ROUNDS = 1000
"""The most rounds a paired timing holds (the config's `pair_rounds` is bounded alike)."""
_TIMES = (1e-9, 1e6)
"""A pass's median time, seconds: a nanosecond to eleven days."""


def _pair_problem(m: Measurement) -> str | None:
    """What is wrong with a measurement's paired timing, if anything: all its fields or
    none, both sides the same rounds, each a time a pass can take."""
    fields = (m.pair_ref, m.pair_figure, m.pair_times_s, m.pair_ref_times_s)
    if not any(fields):
        return None
    if not all(fields):
        return (
            "pair_ref: a paired timing holds pair_ref, pair_figure, pair_times_s and "
            "pair_ref_times_s together"
        )
    if len(m.pair_times_s) != len(m.pair_ref_times_s) or len(m.pair_times_s) > MAX_PAIR_ROUNDS:
        return (
            f"pair_times_s: {len(m.pair_times_s)} rounds against {len(m.pair_ref_times_s)} "
            f"of pair_ref_times_s (the same rounds, at most {MAX_PAIR_ROUNDS:,})"
        )
    for name in ("pair_times_s", "pair_ref_times_s"):
        bad = [t for t in getattr(m, name) if not _TIMES[0] <= t <= _TIMES[1]]
        if bad:
            return f"{name}: {bad[0]!r} is not a pass's time (1 ns to 1e6 s)"
    return None


def _scratch_problem(m: Measurement) -> str | None:
    """What is wrong with a measurement's kernel scratch, if anything: only an estimate is
    calibrated, by a named run, and the scratch is part of its peak."""
    if m.scratch_bytes is None and m.scratch_run_id is None:
        return None
    if m.kind != "estimate":
        return f"scratch_bytes: {m.scratch_bytes!r} on a {m.kind} figure (only estimates have one)"
    if m.scratch_bytes is None or m.scratch_run_id is None:
        return "scratch_run_id: scratch_bytes and scratch_run_id go together"
    if m.peak_allocated_bytes is None or m.scratch_bytes > m.peak_allocated_bytes:
        return (
            f"scratch_bytes: {m.scratch_bytes} exceeds the estimate's peak "
            f"{m.peak_allocated_bytes!r}, which includes it"
        )
    return None


def check_run(run: RunRecord) -> None:
    """Check a record made here by the rules a record from elsewhere obeys (`run_from_dict`),
    before it is written: a value those rules refuse (a negative byte figure) would make the
    database read as damaged, and the record file be refused by `memtrack ingest`. Raises
    RecordError naming the run, the field and the value."""
    run_from_dict(to_dict(run), where=f"run {run.run_id}")


def write_json(run: RunRecord, path: Path) -> None:
    """Write atomically: a reader never sees half a record, and a failed write leaves nothing.
    The folder must exist: none is made."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(to_dict(run), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def write_fallback(run: RunRecord, folders: Iterable[Path]) -> Path:
    """Write a run that could not be saved where it was meant to go as
    `memtrack-run-<run_id>.json` in the first of `folders` that takes it, so that no
    measured run is lost; `memtrack ingest` records it later. Raises the last OSError."""
    error: OSError | None = None
    for folder in dict.fromkeys(Path(f) for f in folders):
        path = folder / f"memtrack-run-{run.run_id}.json"
        try:
            write_json(run, path)
            return path
        except OSError as exc:
            error = exc
    raise error if error is not None else OSError("no folder to write the run to")


MAX_RECORD_FILE_BYTES = 256 * 2**20
"""A run record file larger than this is refused unread (a record of a thousand cases with
long tracebacks is a few MiB)."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Path) -> RunRecord:
    """A record from a JSON file, every value checked. Raises RecordError (one line)."""
    text = read_named(path, MAX_RECORD_FILE_BYTES, RecordError)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RecordError(f"{path}: not a run record (JSON nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise RecordError(f"{path}: not valid JSON ({exc})") from None
    return run_from_dict(data, where=str(path))


def bad_files(errors: list[Any]) -> RecordError:
    """The error of a batch with bad files: the first one's reason, and how many more."""
    more = f" (and {len(errors) - 1} more bad file(s))" if len(errors) > 1 else ""
    return RecordError(f"{errors[0]}{more}; nothing ingested")


def read_all(paths: Iterable[Path]) -> Iterator[RunRecord]:
    """Each file's record, reading every file even after a bad one; then, if any was bad,
    RecordError naming the first. A consumer writing in one transaction rolls back."""
    errors: list[RecordError] = []
    for path in paths:
        try:
            record = read_json(path)
        except RecordError as exc:
            errors.append(exc)
            continue
        if not errors:
            yield record
    if errors:
        raise bad_files(errors)
