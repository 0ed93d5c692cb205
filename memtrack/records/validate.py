"""Validation of records from elsewhere (JSON files, other machines) and the JSON Schema of the
run record, both derived from the dataclasses of records.model; reading and writing records
as JSON files."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memtrack.errors import RecordError
from memtrack.files import NotReadable, read_bytes
from memtrack.records.model import (
    KINDS,
    QUALITY_STATUSES,
    SCHEMA_VERSION,
    STATUSES,
    RunRecord,
    case_id,
    to_dict,
)
from memtrack.units import parse_time

# -- validation and JSON Schema -------------------------------------------------------------
#
# Records come from other machines: every value is checked before it is stored. The rules are
# derived from the dataclass fields and their type hints (plus a few naming conventions:
# `*_bytes` are byte counts, `*_s` seconds, `*_at` ISO times), so a new field is validated and
# described in the schema without further code. `json_schema()` writes the same rules as a JSON
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
_COMMIT_FIELDS = {"commit", "parent", "merge_base", "sha"}
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
}


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
    if name == "run_id":
        return {"pattern": RUN_ID_PATTERN}
    if name == "status":
        return {"enum": list(STATUSES)}
    if name == "quality_status":
        return {"enum": list(QUALITY_STATUSES)}
    if name in ("quality_max_abs", "quality_max_rel"):
        return {"minimum": 0}
    if name == "quality_cosine":
        return {"minimum": -1, "maximum": 1}
    if name == "quality_reference_sha256":
        return {"pattern": SHA256_PATTERN}
    if name == "kind":
        return {"enum": list(KINDS)}
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


def _hints(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _dataclasses() -> list[type]:
    """RunRecord and every dataclass nested in it, in order of first use."""
    out: list[type] = []

    def visit(cls: type) -> None:
        if cls in out:
            return
        out.append(cls)
        for _, hint in _hints(cls):
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
        for f, hint in _hints(cls):
            prop = _hint_schema(hint, _rules(f.name))
            if f.name in docs:
                prop = {"description": docs[f.name], **prop}
            props[f.name] = prop
        defs[cls.__name__] = {
            "type": "object",
            "description": " ".join((cls.__doc__ or "").split()),
            "properties": props,
            "required": [f.name for f, _ in _hints(cls) if _required(f)],
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


# The validator interprets the same hints and rules: one closure per field, built once. Each
# takes the value and its path, a linked tuple (parent, key) turned into text only for an
# error message; the common case (a valid value) costs one type test and a comparison.
Path_ = Any
Check = typing.Callable[[Any, Path_], Any]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _where(path: Path_) -> str:
    """The text of a path: (((((), 'measurements'), 0), 'params'), ('batch',)) is
    "measurements[0].params['batch']"."""
    parts = []
    while path:
        path, key = path
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif isinstance(key, tuple):  # a key of a mapping
            parts.append(f"[{_short(key[0])}]")
        else:
            parts.append(f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "record"


def _fail(path: Path_, message: str) -> typing.NoReturn:
    raise RecordError(f"{_where(path)}: {message}")


def _check_rules(value: Any, rules: dict[str, Any], path: Path_) -> None:
    if "minimum" in rules and value < rules["minimum"]:
        _fail(path, f"{_short(value)} is below {rules['minimum']}")
    if "maximum" in rules and value > rules["maximum"]:
        _fail(path, f"{_short(value)} is above {rules['maximum']}")
    if "pattern" in rules and not re.match(rules["pattern"], value):
        _fail(path, f"{_short(value)} does not match {rules['pattern']}")
    if "enum" in rules and value not in rules["enum"]:
        _fail(path, f"{_short(value)} is not one of {', '.join(rules['enum'])}")
    if "const" in rules and value != rules["const"]:
        _fail(path, f"{_short(value)} is not supported (expected {rules['const']})")
    if "minLength" in rules and len(value) < rules["minLength"]:
        _fail(path, "must not be empty")
    if rules.get("format") == "date-time" and parse_time(value) is None:
        _fail(path, f"{_short(value)} is not an ISO 8601 time")


def _too_long(value: str, limit: int, path: Path_) -> typing.NoReturn:
    _fail(path, f"{len(value):,} characters, more than the {limit:,} a record's text may hold")


def _scalar(value: Any, path: Path_) -> Any:
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            _too_long(value, MAX_TEXT, path)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            _fail(path, f"{_short(value)} is out of range")
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    _fail(path, f"{_short(value)} is not a string, number, boolean or null")


def _compile(hint: Any, rules: dict[str, Any], nullable: bool = False) -> Check:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = next(a for a in args if a is not type(None))
        if inner in (int, float, str, bool):  # scalars take None themselves: one call less
            return _compile(inner, rules, nullable=True)
        check = _compile(inner, rules)
        return lambda v, w: None if v is None else check(v, w)
    if origin is tuple:
        item, valid = _compile(args[0], rules), _all_valid(args[0], rules)

        def check_list(v: Any, w: Path_) -> Any:
            if type(v) is not list:
                _fail(w, f"expected a list, got {_short(v)}")
            if valid(v):
                return tuple(v)
            return tuple([item(x, (w, i)) for i, x in enumerate(v)])  # finds the bad one

        return check_list
    if origin is dict:
        value, valid = _compile(args[1], rules), _all_valid(args[1], rules)

        def check_dict(v: Any, w: Path_) -> Any:
            if type(v) is not dict:
                _fail(w, f"expected an object, got {_short(v)}")
            for k in v:
                if len(k) > MAX_TEXT:
                    _too_long(k, MAX_TEXT, (w, (k[:20],)))
            if valid(v.values()):
                return v
            return {k: value(x, (w, (k,))) for k, x in v.items()}

        return check_dict
    if dataclasses.is_dataclass(hint):
        return lambda v, w: _builder(hint)(v, w)  # type: ignore[arg-type]
    if hint is Any:
        return _scalar
    if hint is float:
        low, high = rules.get("minimum", -math.inf), rules.get("maximum", math.inf)

        def check_float(v: Any, w: Path_) -> Any:
            if type(v) is float and low <= v < math.inf and v <= high:  # also False for NaN
                return v
            if v is None and nullable:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                _fail(w, f"expected a number, got {_short(v)}")
            if not math.isfinite(v):
                _fail(w, f"{v} is not a finite number")
            _check_rules(float(v), rules, w)
            return float(v)

        return check_float
    if hint is int:
        bounds = {"minimum": _INT_MIN, "maximum": _INT_MAX, **rules}
        low, high = bounds["minimum"], bounds["maximum"]

        def check_int(v: Any, w: Path_) -> Any:
            if type(v) is int and low <= v <= high:
                return v
            if v is None and nullable:
                return None
            if type(v) is not int:
                _fail(w, f"expected an integer, got {_short(v)}")
            _check_rules(v, bounds, w)
            return v

        return check_int
    if hint is str:
        pattern = re.compile(rules["pattern"]) if "pattern" in rules else None
        lower = rules.get("pattern") == COMMIT_PATTERN
        enum = set(rules.get("enum", ()))
        nonempty = "minLength" in rules
        longest = rules.get("maxLength", MAX_TEXT)
        slow = {k: v for k, v in rules.items() if k in ("format", "const")}

        def check_str(v: Any, w: Path_) -> Any:
            if type(v) is not str:
                if v is None and nullable:
                    return None
                _fail(w, f"expected a string, got {_short(v)}")
            if len(v) > longest:
                _too_long(v, longest, w)
            if pattern is not None and not pattern.match(v):
                _fail(w, f"{_short(v)} does not match {pattern.pattern}")
            if enum and v not in enum:
                _fail(w, f"{_short(v)} is not one of {', '.join(rules['enum'])}")
            if nonempty and not v:
                _fail(w, "must not be empty")
            if slow:
                _check_rules(v, slow, w)
            return v.lower() if lower else v

        return check_str
    if hint is bool:

        def check_bool(v: Any, w: Path_) -> Any:
            if type(v) is not bool:
                if v is None and nullable:
                    return None
                _fail(w, f"expected true or false, got {_short(v)}")
            return v

        return check_bool
    raise TypeError(f"no validator for {hint!r}")  # a new field of a new type: extend this


def _maker(cls: type) -> typing.Callable[[dict[str, Any]], Any]:
    """Builds an instance from checked values. A frozen dataclass's __init__ sets each field
    through object.__setattr__, a large share of loading 10,000 records; filling the
    instance's __dict__ at once gives the same object."""
    fields = dataclasses.fields(cls)
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    factories = [
        (f.name, f.default_factory) for f in fields if f.default_factory is not dataclasses.MISSING
    ]
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        return lambda values: cls(**values)

    def make(values: dict[str, Any]) -> Any:
        obj: Any = object.__new__(cls)
        d = obj.__dict__
        d.update(defaults)
        for name, factory in factories:
            if name not in values:
                d[name] = factory()  # type: ignore[misc]
        d.update(values)
        return obj

    return make


def _all_valid(hint: Any, rules: dict[str, Any]) -> typing.Callable[[Any], bool]:
    """A quick test that every item of a list or mapping of scalars is valid (loops in C);
    when it says no, the items are checked one by one to name the bad one."""
    if hint is int:
        low, high = rules.get("minimum", _INT_MIN), rules.get("maximum", _INT_MAX)
        return lambda v: not v or (set(map(type, v)) == {int} and low <= min(v) and max(v) <= high)
    if hint is float:
        low = rules.get("minimum", -math.inf)
        return lambda v: (
            not v or (set(map(type, v)) == {float} and all(map(math.isfinite, v)) and min(v) >= low)
        )
    if hint is str and not rules:
        return lambda v: set(map(type, v)) <= {str} and max(map(len, v), default=0) <= MAX_TEXT
    if hint is Any:
        plain = {str, bool, type(None), int, float}

        def scalars(v: Any) -> bool:
            if not set(map(type, v)) <= plain:
                return False
            ints = [x for x in v if type(x) is int]
            floats = [x for x in v if type(x) is float]
            texts = [x for x in v if type(x) is str]
            return (
                (not ints or (_INT_MIN <= min(ints) and max(ints) <= _INT_MAX))
                and all(map(math.isfinite, floats))
                and max(map(len, texts), default=0) <= MAX_TEXT
            )

        return scalars
    return lambda v: False


def _fast_test(hint: Any, rules: dict[str, Any], names: dict[str, Any]) -> str | None:
    """A Python expression true of `v` only where the field's check would return `v` itself
    (so a value it passes needs no call), or None for a field always checked by a call
    (lists, mappings, records, patterns, times). The bounds it reads are put in `names`."""
    nullable = False
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        if inner not in (int, float, str, bool):
            return None
        hint, nullable = inner, True
    key = f"_{len(names)}"
    if hint is int:
        bounds = {"minimum": _INT_MIN, "maximum": _INT_MAX, **rules}
        names[key] = (bounds["minimum"], bounds["maximum"])
        test = f"type(v) is int and {key}[0] <= v <= {key}[1]"
    elif hint is float:
        names[key] = (rules.get("minimum", -math.inf), rules.get("maximum", math.inf))
        test = f"type(v) is float and {key}[0] <= v < inf and v <= {key}[1]"  # False for NaN
    elif hint is str and not set(rules) - {"enum", "minLength"}:
        names["MAX_TEXT"] = MAX_TEXT
        test = "type(v) is str and len(v) <= MAX_TEXT"
        if "enum" in rules:
            names[key] = frozenset(rules["enum"])
            test += f" and v in {key}"
        if "minLength" in rules:
            test += " and v != ''"
    elif hint is bool:
        test = "type(v) is bool"
    else:
        return None
    return f"v is None or ({test})" if nullable else test


def _fast_values(cls: type, checks: dict[str, Check]) -> typing.Callable[[dict, Path_], Any]:
    """The checked values of a valid object of `cls`, by code made for its fields: a plain
    field is tested inline, an empty list is (), the others are checked by their call. It
    returns None at a value the test does not pass (the checks, in the object's own order,
    then say what is wrong, or convert it). A call per value was most of loading a record:
    most of its values are plain."""
    names: dict[str, Any] = {"inf": math.inf}
    lines = ["def fast(data, path):", "    values = {}"]
    for i, (f, hint) in enumerate(_hints(cls)):
        key, call = repr(f.name), f"check{i}(v, (path, {f.name!r}))"
        names[f"check{i}"] = checks[f.name]
        lines += [f"    if {key} in data:", f"        v = data[{key}]"]
        test = _fast_test(hint, _rules(f.name), names)
        if test is not None:
            lines += [
                f"        if not ({test}):",
                "            return None",
                f"        values[{key}] = v",
            ]
        elif typing.get_origin(hint) is tuple:
            lines.append(f"        values[{key}] = () if type(v) is list and not v else {call}")
        else:
            lines.append(f"        values[{key}] = {call}")
    lines.append("    return values")
    exec("\n".join(lines), names)  # the source is made above, of the field names
    return names["fast"]  # type: ignore[no-any-return]


@functools.cache
def _builder(cls: type) -> Check:
    checks = {f.name: _compile(hint, _rules(f.name)) for f, hint in _hints(cls)}
    names = set(checks)
    required = [f.name for f, _ in _hints(cls) if _required(f)]
    make = _maker(cls)
    fast = _fast_values(cls, checks)

    def build(data: Any, path: Path_) -> Any:
        if type(data) is not dict:
            _fail(path, f"expected an object, got {_short(data)}")
        if not names.issuperset(data):
            unknown = sorted(_short(k) for k in set(data) - names)
            _fail(path, f"unknown key(s) {', '.join(unknown)}")
        for name in required:
            if name not in data:
                _fail(path, f"missing key {name}")
        try:
            values = fast(data, path)
        except RecordError:
            values = None  # the checks below, in the record's order, name the first error
        if values is None:
            values = {k: checks[k](v, (path, k)) for k, v in data.items()}
        return make(values)

    return build


def run_from_dict(data: Any, *, where: str = "record") -> RunRecord:
    """Rebuild a RunRecord from `to_dict` output, checking every value. Raises RecordError."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"{where}: schema_version {_short(version)} is not supported "
            f"(expected {SCHEMA_VERSION})"
        )
    try:
        run: RunRecord = _builder(RunRecord)(data, ())
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
                f"{where}: measurements[{i}].case_id: {_short(m.case_id)} does "
                f"not match its workload and params (they make "
                f"{_short(expected)})"
            )
        if m.case_id in seen:
            raise RecordError(f"{where}: case {m.case_id!r} is measured twice in one run")
        seen.add(m.case_id)
        numbers = [r.rank for r in m.ranks]
        if numbers != list(range(len(numbers))):
            raise RecordError(
                f"{where}: measurements[{i}].ranks: ranks {numbers} are not "
                f"0..{len(numbers) - 1} in order, each once"
            )
    return run


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
    try:
        text = read_bytes(path, MAX_RECORD_FILE_BYTES)
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except NotReadable as exc:
        raise RecordError(f"{path}: {exc}") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot be read ({exc.strerror})") from None
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
