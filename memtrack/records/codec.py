"""Typed JSON into frozen dataclasses: one decoder for every typed record memtrack reads from
elsewhere, the run records of other machines (records.validate) and the worker's spec and
result (memtrack.worker.protocol) alike.

The rules are derived from the dataclass fields and their type hints: a new field is read,
checked and refused without further code. What differs between the two is a `Dialect`: the
error a refusal raises and its words, the rules beyond a field's type (ranges, patterns), the
limits of a value, and whether plain values are tested inline (for reading records by the
ten thousand). Each decoder is compiled once per dataclass and dialect: one closure per
field, which takes the value and its path, a linked tuple (parent, key) turned into text only
for an error message; the common case (a valid value) costs one type test and a comparison.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from memtrack.units import parse_time

Path_ = Any
"""Where a value is: () for the top, else (parent, key); a key is a field's name, a list's
index, or a one-tuple holding a mapping's key."""
Check = typing.Callable[[Any, Path_], Any]
"""Checks a value at a path; returns it (as the dataclass holds it) or raises the dialect's
error."""


def short(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Dialect:
    """How one family of typed JSON is read. This one is the worker protocol's (its spec and
    result, the NVML sampler's answer): memtrack's own processes wrote it, so there are no
    limits, any JSON value stands where a hint says Any, and the words are terse. A lone
    surrogate in a string (a workload's undecodable bytes) becomes '?': it could not be
    stored or printed."""

    error: type[Exception]
    """What a refusal raises, its message 'where: what'."""
    inline: bool = False
    """Plain values are tested inline (generated code, one pass over a list in C) before
    any check is called: for bulk reading. A value the tests do not pass is checked by its
    call, which says what is wrong."""
    text_limit: int | None = None
    """Characters a string (or a mapping's key) may hold; None: any."""
    int_range: tuple[float, float] = (-math.inf, math.inf)
    finite: bool = False
    """Numbers must be finite."""
    scalar_any: bool = False
    """A value hinted Any must be a scalar (string, number, boolean or null)."""
    no_nul: bool = False
    """A string (or a mapping's key) may hold no NUL character: SQLite stores one where
    PostgreSQL refuses it, and a history must read the same on either."""

    def rules(self, name: str) -> dict[str, Any]:
        """JSON Schema keywords a field's values (or items) obey beyond their type."""
        return {}

    def text(self, rules: dict[str, Any]) -> typing.Callable[[str], str] | None:
        """What a string under `rules` is turned into once checked; None: itself."""
        return _mend

    def where(self, path: Path_) -> str:
        """The text of a path: (((((), 'measurements'), 0), 'params'), ('batch',)) is
        "measurements[0].params['batch']"."""
        parts = []
        while path:
            path, key = path
            if isinstance(key, int):
                parts.append(f"[{key}]")
            elif isinstance(key, tuple):  # a key of a mapping
                parts.append(f"[{self.key(key[0])}]")
            else:
                parts.append(f".{key}")
        return "".join(reversed(parts)).lstrip(".") or "record"

    def key(self, key: Any) -> str:
        return repr(key)

    def expected(self, what: str, value: Any) -> str:
        """A value of another type than its hint's: `what` is 'an integer', 'a list', ..."""
        return f"expected {what}"

    def not_object(self, value: Any) -> str:
        """A record that is not a JSON object."""
        return f"expected an object, got {type(value).__name__}"

    def unknown(self, keys: set[str]) -> str:
        return f"unknown key(s) {', '.join(sorted(short(k) for k in keys))}"

    def missing(self, name: str) -> str:
        return f"missing key {name}"

    def too_long(self, length: int, limit: int) -> str:
        return f"{length:,} characters, more than {limit:,}"

    def problem(self, text: str) -> str | None:
        """What is wrong with a string beyond its type, length and rules: a lone surrogate
        where it is kept as it is, a NUL where the dialect refuses one; None: nothing."""
        if self.no_nul and "\0" in text:
            at = text.index("\0")
            return f"holds a NUL character (at character {at}), which PostgreSQL cannot store"
        if self.text({}) is None and not text.isascii():
            return unicode_problem(text)
        return None

    def fail(self, path: Path_, message: str) -> typing.NoReturn:
        raise self.error(f"{self.where(path)}: {message}")


def _mend(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def decode(cls: type, data: Any, dialect: Dialect, where: str | None = None) -> Any:
    """`data` (parsed JSON) as an instance of the dataclass `cls`, every value checked; the
    dialect's error where one is not. `where` names the top in messages ('spec')."""
    return decoder(cls, dialect)(data, () if where is None else ((), where))


@functools.cache
def hints(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """Each field of the dataclass `cls` with its type hint (read once: resolving the hints
    evaluates every annotation)."""
    resolved = typing.get_type_hints(cls)
    return tuple((f, resolved[f.name]) for f in dataclasses.fields(cls))


def required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# -- one check per hint -----------------------------------------------------------------------


def _check_rules(d: Dialect, value: Any, rules: dict[str, Any], path: Path_) -> None:
    if "minimum" in rules and value < rules["minimum"]:
        d.fail(path, f"{short(value)} is below {rules['minimum']}")
    if "maximum" in rules and value > rules["maximum"]:
        d.fail(path, f"{short(value)} is above {rules['maximum']}")
    if "pattern" in rules and not re.match(rules["pattern"], value):
        d.fail(path, f"{short(value)} does not match {rules['pattern']}")
    if "enum" in rules and value not in rules["enum"]:
        d.fail(path, f"{short(value)} is not one of {', '.join(rules['enum'])}")
    if "const" in rules and value != rules["const"]:
        d.fail(path, f"{short(value)} is not supported (expected {rules['const']})")
    if "minLength" in rules and len(value) < rules["minLength"]:
        d.fail(path, "must not be empty")
    if rules.get("format") == "date-time" and parse_time(value) is None:
        d.fail(path, f"{short(value)} is not an ISO 8601 time")


def _any(d: Dialect) -> Check:
    """A value hinted Any: a bounded scalar, or (without `scalar_any`) whatever it is."""
    if not d.scalar_any:
        return lambda v, w: v
    low, high = d.int_range
    limit = math.inf if d.text_limit is None else d.text_limit
    mended = d.text({})

    def check_scalar(v: Any, w: Path_) -> Any:
        if isinstance(v, str):
            if len(v) > limit:
                d.fail(w, d.too_long(len(v), int(limit)))
            if (not v.isascii() or "\0" in v) and (bad := d.problem(v)):
                d.fail(w, bad)
            return v if mended is None else mended(v)
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            if not low <= v <= high:
                d.fail(w, f"{short(v)} is out of range")
            return v
        if isinstance(v, float) and (math.isfinite(v) or not d.finite):
            return v
        d.fail(w, f"{short(v)} is not a string, number, boolean or null")

    return check_scalar


def _compile(d: Dialect, hint: Any, rules: dict[str, Any], nullable: bool = False) -> Check:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = next(a for a in args if a is not type(None))
        if inner in (int, float, str, bool):  # scalars take None themselves: one call less
            return _compile(d, inner, rules, nullable=True)
        check = _compile(d, inner, rules)
        return lambda v, w: None if v is None else check(v, w)
    if origin is tuple:
        return _list_check(d, args[0], rules)
    if origin is dict:
        return _dict_check(d, args[1], rules)
    if dataclasses.is_dataclass(hint):
        return lambda v, w: decoder(hint, d)(v, w)  # type: ignore[arg-type]
    if hint is Any:
        return _any(d)
    make = {float: _float_check, int: _int_check, str: _str_check, bool: _bool_check}.get(hint)
    if make is None:
        raise TypeError(f"no check for {hint!r}")  # a new field of a new type: extend this
    return make(d, rules, nullable)


def _list_check(d: Dialect, hint: Any, rules: dict[str, Any]) -> Check:
    item, valid = _compile(d, hint, rules), _all_valid(d, hint, rules)

    def check_list(v: Any, w: Path_) -> Any:
        if type(v) is not list:
            d.fail(w, d.expected("a list", v))
        if valid(v):
            return tuple(v)
        return tuple([item(x, (w, i)) for i, x in enumerate(v)])  # finds the bad one

    return check_list


def _dict_check(d: Dialect, hint: Any, rules: dict[str, Any]) -> Check:
    value, valid = _compile(d, hint, rules), _all_valid(d, hint, rules)
    limit = d.text_limit

    def check_dict(v: Any, w: Path_) -> Any:
        if type(v) is not dict:
            d.fail(w, d.expected("an object", v))
        for k in v:
            if type(k) is not str:
                d.fail(w, d.expected("an object", v))
            if limit is not None and len(k) > limit:
                d.fail((w, (k[:20],)), d.too_long(len(k), limit))
            if (not k.isascii() or "\0" in k) and (bad := d.problem(k)):
                d.fail(w, f"a key: {bad}")
        if valid(v.values()):
            return v
        return {k: value(x, (w, (k,))) for k, x in v.items()}

    return check_dict


def _float_check(d: Dialect, rules: dict[str, Any], nullable: bool) -> Check:
    low, high = rules.get("minimum", -math.inf), rules.get("maximum", math.inf)

    def check_float(v: Any, w: Path_) -> Any:
        if type(v) is float and low <= v < math.inf and v <= high:  # also False for NaN
            return v
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            d.fail(w, d.expected("a number", v))
        try:
            v = float(v)
        except OverflowError:  # an integer of hundreds of digits: no float holds it
            d.fail(w, f"{short(v)} is too large for a number")
        if d.finite and not math.isfinite(v):
            d.fail(w, f"{v} is not a finite number")
        _check_rules(d, v, rules, w)
        return v

    return check_float


def _int_check(d: Dialect, rules: dict[str, Any], nullable: bool) -> Check:
    bounds = {"minimum": d.int_range[0], "maximum": d.int_range[1], **rules}
    low, high = bounds["minimum"], bounds["maximum"]

    def check_int(v: Any, w: Path_) -> Any:
        if type(v) is int and low <= v <= high:
            return v
        if v is None and nullable:
            return None
        if type(v) is not int:
            d.fail(w, d.expected("an integer", v))
        _check_rules(d, v, bounds, w)
        return v

    return check_int


def unicode_problem(text: str) -> str | None:
    """Why `text` cannot be stored or shown as UTF-8 (a lone surrogate, which JSON's
    `\\ud800` escape can carry), in a few words; None when it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid Unicode (a lone surrogate at character {exc.start})"
    return None


def _str_check(d: Dialect, rules: dict[str, Any], nullable: bool) -> Check:
    pattern = re.compile(rules["pattern"]) if "pattern" in rules else None
    enum = set(rules.get("enum", ()))
    nonempty = "minLength" in rules
    longest = rules.get("maxLength", d.text_limit)
    slow = {k: v for k, v in rules.items() if k in ("format", "const")}
    then = d.text(rules)

    def check_str(v: Any, w: Path_) -> Any:
        if type(v) is not str:
            if v is None and nullable:
                return None
            d.fail(w, d.expected("a string", v))
        if longest is not None and len(v) > longest:
            d.fail(w, d.too_long(len(v), longest))
        if (not v.isascii() or "\0" in v) and (bad := d.problem(v)):
            d.fail(w, bad)  # kept as it is, so it must be text every output can carry
        if pattern is not None and not pattern.match(v):
            d.fail(w, f"{short(v)} does not match {pattern.pattern}")
        if enum and v not in enum:
            d.fail(w, f"{short(v)} is not one of {', '.join(rules['enum'])}")
        if nonempty and not v:
            d.fail(w, "must not be empty")
        if slow:
            _check_rules(d, v, slow, w)
        return v if then is None else then(v)

    return check_str


def _bool_check(d: Dialect, rules: dict[str, Any], nullable: bool) -> Check:
    def check_bool(v: Any, w: Path_) -> Any:
        if type(v) is not bool:
            if v is None and nullable:
                return None
            d.fail(w, d.expected("true or false", v))
        return v

    return check_bool


# -- the inline tests ---------------------------------------------------------------------------


def _all_valid(d: Dialect, hint: Any, rules: dict[str, Any]) -> typing.Callable[[Any], bool]:
    """A quick test that every item of a list or mapping of scalars is valid (loops in C);
    when it says no, the items are checked one by one to name the bad one."""
    if not d.inline:
        return lambda v: False
    int_min, int_max = d.int_range
    limit = math.inf if d.text_limit is None else d.text_limit
    if hint is int:
        low, high = rules.get("minimum", int_min), rules.get("maximum", int_max)
        return lambda v: not v or (set(map(type, v)) == {int} and low <= min(v) and max(v) <= high)
    if hint is float and d.finite:
        low = rules.get("minimum", -math.inf)
        return lambda v: (
            not v or (set(map(type, v)) == {float} and all(map(math.isfinite, v)) and min(v) >= low)
        )
    if hint is str and not rules and d.text(rules) is None:
        return lambda v: (
            set(map(type, v)) <= {str}
            and max(map(len, v), default=0) <= limit
            and all(map(str.isascii, v))  # else each is checked: a lone surrogate is refused
            and not (d.no_nul and any("\0" in x for x in v))
        )
    if hint is Any and d.scalar_any and d.finite:
        plain = {str, bool, type(None), int, float}

        def scalars(v: Any) -> bool:
            if not set(map(type, v)) <= plain:
                return False
            ints = [x for x in v if type(x) is int]
            floats = [x for x in v if type(x) is float]
            texts = [x for x in v if type(x) is str]
            return (
                (not ints or (int_min <= min(ints) and max(ints) <= int_max))
                and all(map(math.isfinite, floats))
                and max(map(len, texts), default=0) <= limit
                and all(map(str.isascii, texts))
                and not (d.no_nul and any("\0" in x for x in texts))
            )

        return scalars
    return lambda v: False


def _fast_test(d: Dialect, hint: Any, rules: dict[str, Any], names: dict[str, Any]) -> str | None:
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
        bounds = {"minimum": d.int_range[0], "maximum": d.int_range[1], **rules}
        names[key] = (bounds["minimum"], bounds["maximum"])
        test = f"type(v) is int and {key}[0] <= v <= {key}[1]"
    elif hint is float:
        names[key] = (rules.get("minimum", -math.inf), rules.get("maximum", math.inf))
        test = f"type(v) is float and {key}[0] <= v < inf and v <= {key}[1]"  # False for NaN
    elif hint is str and not set(rules) - {"enum", "minLength"} and d.text(rules) is None:
        names["MAX_TEXT"] = math.inf if d.text_limit is None else d.text_limit
        test = "type(v) is str and len(v) <= MAX_TEXT and v.isascii()"  # else checked whole
        if d.no_nul:
            test += " and '\\0' not in v"
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


def _fast_values(
    d: Dialect, cls: type, checks: dict[str, Check]
) -> typing.Callable[[dict[str, Any], Path_], Any]:
    """The checked values of a valid object of `cls`, by code made for its fields: a plain
    field is tested inline, an empty list is (), the others are checked by their call. It
    returns None at a value the test does not pass (the checks, in the object's own order,
    then say what is wrong, or convert it). A call per value was most of loading a record:
    most of its values are plain."""
    names: dict[str, Any] = {"inf": math.inf}
    lines = ["def fast(data, path):", "    values = {}"]
    for i, (f, hint) in enumerate(hints(cls)):
        key, call = repr(f.name), f"check{i}(v, (path, {f.name!r}))"
        names[f"check{i}"] = checks[f.name]
        lines += [f"    if {key} in data:", f"        v = data[{key}]"]
        test = _fast_test(d, hint, d.rules(f.name), names)
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


# -- one decoder per dataclass -----------------------------------------------------------------


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


@functools.cache
def decoder(cls: type, d: Dialect) -> Check:
    """The check of a JSON object as an instance of the dataclass `cls`: unknown keys, then
    missing ones, then each value in the object's order; returns the instance."""
    checks = {f.name: _compile(d, hint, d.rules(f.name)) for f, hint in hints(cls)}
    names = set(checks)
    needed = [f.name for f, _ in hints(cls) if required(f)]
    make = _maker(cls)
    fast = _fast_values(d, cls, checks) if d.inline else None

    def build(data: Any, path: Path_) -> Any:
        if type(data) is not dict:
            d.fail(path, d.not_object(data))
        if not names.issuperset(data):
            d.fail(path, d.unknown(set(data) - names))
        for name in needed:
            if name not in data:
                d.fail(path, d.missing(name))
        values = None
        if fast is not None:
            try:
                values = fast(data, path)
            except d.error:
                values = None  # the checks below, in the record's order, name the first error
        if values is None:
            values = {k: checks[k](v, (path, k)) for k, v in data.items()}
        return make(values)

    return build


__all__ = [
    "Check",
    "Dialect",
    "Path_",
    "decode",
    "decoder",
    "hints",
    "required",
    "short",
    "unicode_problem",
]
