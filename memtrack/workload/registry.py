"""Declaring workloads: the `@workload` decorator, its parameter grid, and discovery.

A workload builds what persists (weights), calls `ctx.mark()`, and returns the step to
measure. This module does not import torch: the worker process does, when it runs a case.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.errors import WorkloadError
from memtrack.records import case_id

RANKS_PARAM = "ranks"
"""The reserved param of a multi-rank case: how many processes (ranks, one device each)
run it under torch.distributed. Part of the case id, so a grid can sweep it."""

_REGISTRY: dict[tuple[str, str], Workload] = {}
"""Every registration, by (module, workload name): two modules may not share a name."""


@dataclass(frozen=True)
class Workload:
    """A registered workload function and its parameter grid."""

    name: str
    fn: Callable[..., Any]
    params: dict[str, tuple[Any, ...]]
    """Each parameter's values; a scalar in the decorator becomes a 1-tuple."""
    seed: int = 0
    module: str = ""
    """Where it was found: a module name or a .py path, as the config named it."""
    tolerance: dict[str, float] = field(default_factory=dict)
    """How far the step's output may stray from its reference (see memtrack.judge.quality);
    empty: the output is not checked."""
    quality: Callable[..., Any] | None = None
    """The workload's own metric, fn(output, reference) -> float, bounded by
    tolerance['metric'] (at most) or tolerance['metric_min'] (at least)."""
    precision: dict[str, Any] = field(default_factory=dict)
    """Precision and format params, each with the value of the full-precision reference
    ('dtype' -> 'float32' where the workload has a dtype param)."""

    def cases(self) -> list[Case]:
        """One case per combination of parameter values, in declaration order."""
        names = list(self.params)
        return [
            Case(
                self.name,
                dict(zip(names, values, strict=True)),
                self.seed,
                self.module,
                self.tolerance,
                self.precision,
            )
            for values in itertools.product(*(self.params[n] for n in names))
        ]


@dataclass(frozen=True)
class Case:
    """One point of a workload's grid: the unit that runs in its own process."""

    workload: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    module: str = ""
    tolerance: dict[str, float] = field(default_factory=dict)
    """The workload's declared tolerance; empty: the output is not checked."""
    precision: dict[str, Any] = field(default_factory=dict)
    """Precision and format params with their full-precision reference values."""

    @property
    def case_id(self) -> str:
        return case_id(self.workload, self.params)

    def reference_case(self) -> Case:
        """The case whose output is this one's reference: the same params at full precision
        (dtype float32, each format param at its reference value). Itself at full precision."""
        params = {**self.params, **{k: v for k, v in self.precision.items() if k in self.params}}
        return Case(self.workload, params, self.seed, self.module, self.tolerance, self.precision)


def split_case_id(case_id: str) -> tuple[str, dict[str, str]] | None:
    """'name[k=v,...]' -> (name, {k: v}); None when the id does not parse that way."""
    name, bracket, rest = case_id.partition("[")
    if not bracket:
        return name, {}
    if not rest.endswith("]"):
        return None
    params = {}
    for item in rest[:-1].split(","):
        k, eq, v = item.partition("=")
        if not eq or k in params:
            return None
        params[k] = v
    return name, params


def short_case_labels(case_ids: Iterable[str]) -> dict[str, str]:
    """Each case id shortened to its workload and the params that tell it apart from the
    other cases of that workload shown with it: 'decoder[sessions=4]'."""
    parsed = {c: split_case_id(c) for c in case_ids}
    varying: dict[str, set[str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for p in parsed.values():
        if p is not None:
            for k, v in p[1].items():
                values.setdefault((p[0], k), set()).add(v)
    for (name, k), seen in values.items():
        if len(seen) > 1:
            varying.setdefault(name, set()).add(k)
    out = {}
    for case, p in parsed.items():
        if p is None:
            out[case] = case
            continue
        name, params = p
        keys = [k for k in params if k in varying.get(name, set())]
        out[case] = f"{name}[{','.join(f'{k}={params[k]}' for k in keys)}]" if keys else name
    # Two ids that shorten alike (a param missing from one) keep their full form.
    counts: dict[str, int] = {}
    for label in out.values():
        counts[label] = counts.get(label, 0) + 1
    return {c: (label if counts[label] == 1 else c) for c, label in out.items()}


def workload(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    tolerance: dict[str, float] | None = None,
    quality: Callable[..., Any] | None = None,
    precision_params: Iterable[str] | dict[str, Any] = (),
) -> Any:
    """Register a workload. `params` maps names to a value or a list of values (a grid).

    The function receives a `memtrack.Context` and returns a zero-argument step. With a
    `tolerance`, the step's output (a tensor, or a tuple or dict of tensors) is compared with
    its reference on every run: `max_abs`, `max_rel` (at most), `cosine` (at least), and with
    `quality=fn(output, reference) -> float`, `metric` (at most) or `metric_min` (at least).
    `precision_params` names the params besides `dtype` that change precision or format
    (e.g. `("quant",)`: the reference is the first declared value; or `{"quant": "none"}`).
    """

    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        wname = name or f.__name__
        grid: dict[str, tuple[Any, ...]] = {}
        for key, value in (params or {}).items():
            values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
            if not values:
                raise WorkloadError(f"workload {wname!r}: param {key!r} has no values")
            for v in values:
                if not isinstance(v, (str, int, float, bool)):
                    raise WorkloadError(
                        f"workload {wname!r}: param {key!r} value {v!r} "
                        "must be str, int, float or bool"
                    )
                if "\0" in f"{key}{v}":  # the case id holds both, and no history can store it
                    raise WorkloadError(
                        f"workload {wname!r}: param {key!r} value {v!r} holds a NUL character"
                    )
            _check_distinct(f"workload {wname!r}: param {key!r}", values)
            if key == RANKS_PARAM:
                check_ranks(f"workload {wname!r}: param {key!r}", values)
            grid[key] = values
        tol, precision = _check_quality(wname, grid, tolerance, quality, precision_params)
        previous = _REGISTRY.get((f.__module__, wname))
        if previous is not None and _place(previous.fn) != _place(f):
            raise WorkloadError(
                f"workload {wname!r} is declared twice in {_where(f.__module__)}"
                f" (lines {_place(previous.fn)[2]} and {_place(f)[2]})"
            )
        _REGISTRY[(f.__module__, wname)] = Workload(
            wname, f, grid, seed, f.__module__, tol, quality, precision
        )
        return f

    return register(fn) if fn is not None else register


def _place(fn: Callable[..., Any]) -> tuple[str, str, int]:
    """Where a function is defined: the same workload seen again (its module imported once
    more) is at the same place; a second declaration of the name is not, even under the
    same function name."""
    code = getattr(fn, "__code__", None)
    return (fn.__qualname__, getattr(code, "co_filename", ""), getattr(code, "co_firstlineno", 0))


def check_ranks(where: str, values: Iterable[Any]) -> None:
    """The `ranks` param counts processes: a whole number, at least 1."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise WorkloadError(
                f"{where}: {v!r} is not a number of ranks (a whole number, at least 1)"
            )


def ranks_of(params: dict[str, Any]) -> int | None:
    """How many ranks a case runs; None for a case of one process (no `ranks` param)."""
    value = params.get(RANKS_PARAM)
    return None if value is None else int(value)


TOLERANCE_KEYS = ("max_abs", "max_rel", "cosine", "metric", "metric_min")
"""What a tolerance may bound: max_abs, max_rel and metric from above; cosine and metric_min
from below."""


def _check_quality(
    wname: str,
    grid: dict[str, tuple[Any, ...]],
    tolerance: Any,
    quality: Any,
    precision_params: Any,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The declared tolerance and precision params, checked: (tolerance, precision)."""
    where = f"workload {wname!r}"
    if tolerance is None:
        if quality is not None or precision_params:
            raise WorkloadError(
                f"{where}: quality and precision_params need a tolerance "
                "(e.g. tolerance={'cosine': 0.999})"
            )
        return {}, {}
    if not isinstance(tolerance, dict) or not tolerance:
        raise WorkloadError(f"{where}: tolerance must be a non-empty dict, got {tolerance!r}")
    tol = {key: _tolerance(where, key, value) for key, value in tolerance.items()}
    bounds_metric = {"metric", "metric_min"} & set(tol)
    if quality is not None and not callable(quality):
        raise WorkloadError(
            f"{where}: quality must be a function (output, reference) -> float, got {quality!r}"
        )
    if quality is not None and not bounds_metric:
        raise WorkloadError(
            f"{where}: quality needs a bound: tolerance 'metric' (at most) "
            "or 'metric_min' (at least)"
        )
    if bounds_metric and quality is None:
        raise WorkloadError(
            f"{where}: tolerance {sorted(bounds_metric)[0]!r} bounds the "
            "workload's own metric: pass quality=fn(output, reference)"
        )
    return tol, _precision(where, grid, precision_params)


def _tolerance(where: str, key: Any, value: Any) -> float:
    """One tolerance bound, checked."""
    if key not in TOLERANCE_KEYS:
        close = difflib.get_close_matches(str(key), TOLERANCE_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise WorkloadError(
            f"{where}: tolerance key {key!r} is not one of {', '.join(TOLERANCE_KEYS)}{hint}"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}: tolerance {key!r} must be a finite number, got {value!r}")
    if key in ("max_abs", "max_rel") and value < 0:
        raise WorkloadError(f"{where}: tolerance {key!r} must be at least 0, got {value!r}")
    if key == "cosine" and not -1 <= value <= 1:
        raise WorkloadError(f"{where}: tolerance 'cosine' must be between -1 and 1, got {value!r}")
    return float(value)


def _precision(
    where: str, grid: dict[str, tuple[Any, ...]], precision_params: Any
) -> dict[str, Any]:
    """The precision params and their reference values, checked."""
    full = {"dtype": "float32", "precision": "32-true"}  # the reserved params' references
    precision: dict[str, Any] = {k: v for k, v in full.items() if k in grid}
    if isinstance(precision_params, str) or not isinstance(precision_params, (dict, list, tuple)):
        raise WorkloadError(
            f"{where}: precision_params must be a tuple of param names or a "
            f"dict of param -> reference value, got {precision_params!r}"
        )
    named = (
        precision_params.items()
        if isinstance(precision_params, dict)
        else ((k, None) for k in precision_params)
    )
    for key, value in named:
        if key not in grid:
            raise WorkloadError(
                f"{where}: precision_params names {key!r}, which is not a "
                f"param (has: {', '.join(grid) or 'none'})"
            )
        if value is None:
            value = full.get(key, grid[key][0])
        elif not isinstance(value, (str, int, float, bool)):
            raise WorkloadError(
                f"{where}: precision_params {key!r}: reference value "
                f"{value!r} must be str, int, float or bool"
            )
        precision[key] = value
    return precision


def _check_distinct(where: str, values: tuple[Any, ...]) -> None:
    """Values must read differently in a case id: 1 and "1" would make one case of two."""
    seen: dict[str, Any] = {}
    for v in values:
        if str(v) in seen:
            raise WorkloadError(
                f"{where}: values {seen[str(v)]!r} and {v!r} both read {str(v)!r} in a case id"
            )
        seen[str(v)] = v


def _where(module: str) -> str:
    """A module as its author knows it: the file for a module imported from a path."""
    file = getattr(sys.modules.get(module), "__file__", None)
    return file if file and module.startswith("memtrack_user_") else module


def _is_path(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref


def _module_name(ref: str, root: Path) -> str:
    """The name a module ref is imported under (files get a stable synthetic name)."""
    if not _is_path(ref):
        return ref
    digest = hashlib.sha1(str((root / ref).resolve()).encode()).hexdigest()[:12]
    return f"memtrack_user_{digest}"


def repository_first(root: Path) -> None:
    """Put the repository at `root` (and its src/ folder) first on this process's import
    path: what the workloads import from the repository is that tree's, also where an
    editable install points at another checkout (a paired timing's reference, in a worktree
    of its own). For a process of one repository: the fork server, a spawned worker."""
    for folder in (root / "src", root):
        if folder.is_dir():
            if str(folder) in sys.path:
                sys.path.remove(str(folder))
            sys.path.insert(0, str(folder))


def import_workload_module(ref: str, root: Path) -> str:
    """Import a module by dotted name, or a .py file relative to `root`; return its name."""
    name = _module_name(ref, root)
    if name in sys.modules:
        return name
    if _is_path(ref):
        path = (root / ref).resolve()
        if not path.is_file():
            raise ModuleNotFoundError(f"no file {path}")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    else:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        importlib.import_module(ref)
    return name


def missing_modules(config: Config) -> WorkloadError | None:
    """The error for a configured workload module that cannot be found, without importing
    any (a .py path that is no file; a dotted name whose module no finder knows): what
    `check` says before it judges a suite it could never measure. None where all are found."""
    for ref in config.modules:
        if _is_path(ref):
            found = (config.root / ref).is_file()
        else:
            found = _findable(ref, config.root)
        if not found:
            return WorkloadError(f"{modules_where(config)}: cannot find {ref!r}")
    return None


def _findable(dotted: str, root: Path) -> bool:
    """A dotted module under `root` (a file or a package folder) or on the import path."""
    base = root.joinpath(*dotted.split("."))
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return True
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def modules_where(config: Config) -> str:
    """Where the suite's modules are configured, as an error names it."""
    return f"{config.path}: modules" if config.path else "default config: modules"


def import_failure(where: str, ref: str, exc: BaseException) -> WorkloadError:
    """The one-line error of a workload module whose import failed, naming the module."""
    if isinstance(exc, ModuleNotFoundError):
        return WorkloadError(f"{where}: cannot import {ref!r} ({exc})")
    if isinstance(exc, WorkloadError):
        return WorkloadError(f"{where}: {ref!r}: {exc}")
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return WorkloadError(f"{where}: cannot import {ref!r}: {error}")


def discover(config: Config, importing: Callable[[str], None] | None = None) -> list[Workload]:
    """Import the configured modules; return their workloads, each tagged with its ref.
    `importing(ref)` is told of each module before its import starts."""
    where = modules_where(config)
    found: dict[str, Workload] = {}
    for ref in config.modules:
        if importing is not None:
            importing(ref)
        try:
            name = import_workload_module(ref, config.root)
        except (Exception, SystemExit) as exc:  # the module's own code failed: say how
            raise import_failure(where, ref, exc) from None
        for wl in _REGISTRY.values():
            if wl.module == name or wl.module.startswith(name + "."):
                other = found.get(wl.name)
                if other is not None and other.fn.__module__ != wl.module:
                    raise WorkloadError(
                        f"{where}: workload {wl.name!r} is declared in two modules: "
                        f"{_where(other.fn.__module__)} and {_where(wl.module)}"
                    )
                found[wl.name] = replace(wl, module=ref)
    if not found:
        raise WorkloadError(f"{where}: no workloads registered by {', '.join(config.modules)}")
    for wname, settings in config.workloads.items():
        if wname not in found:
            close = difflib.get_close_matches(wname, sorted(found), n=3)
            raise WorkloadError(
                f"{config.path}: workloads.{wname}: no such workload "
                + (
                    f"(nearest: {', '.join(close)})"
                    if close
                    else f"(known: {', '.join(sorted(found))})"
                )
            )
        wl = found[wname]
        for key in settings.params:
            if key not in wl.params:
                raise WorkloadError(
                    f"{config.path}: workloads.{wname}.params.{key}: {wname} has no param "
                    f"{key!r} (has: {', '.join(wl.params)})"
                )
            _check_distinct(f"{config.path}: workloads.{wname}.params.{key}", settings.params[key])
            if key == RANKS_PARAM:
                check_ranks(f"{config.path}: workloads.{wname}.params.{key}", settings.params[key])
        if settings.params:
            found[wname] = replace(wl, params={**wl.params, **settings.params})
    _check_size(found.values(), config)
    return list(found.values())


def _grid_size(wl: Workload) -> int:
    return math.prod(len(values) for values in wl.params.values())


def _check_size(workloads: Iterable[Workload], config: Config) -> None:
    """Refuse a suite over `max_cases` before expanding it: a typo in a grid can be huge."""
    sizes = sorted(((_grid_size(w), w.name) for w in workloads), reverse=True)
    total = sum(n for n, _ in sizes)
    if total > config.max_cases:
        where = f"{config.path}: max_cases" if config.path else "max_cases"
        largest = ", ".join(f"{name} ({n:,})" for n, name in sizes[:5])
        raise WorkloadError(
            f"{where}: the suite has {total:,} cases, more than {config.max_cases:,} "
            f"(largest grids: {largest}); shrink the grids or raise max_cases"
        )


def select_cases(
    workloads: Iterable[Workload],
    patterns: Iterable[str] = (),
    shard: tuple[int, int] | None = None,
) -> list[Case]:
    """Expand grids; keep cases whose id contains any pattern; keep shard i of n (1-based)."""
    cases = [c for w in workloads for c in w.cases()]
    ids: dict[str, Case] = {}
    for c in cases:
        if c.case_id in ids:
            raise WorkloadError(
                f"two cases share the id {c.case_id!r}: params {ids[c.case_id].params!r} "
                f"and {c.params!r}"
            )
        ids[c.case_id] = c
    pats = list(patterns)
    if pats:
        cases = [c for c in cases if any(p in c.case_id for p in pats)]
    if shard is not None:
        i, n = shard
        cases = [c for k, c in enumerate(sorted(cases, key=lambda c: c.case_id)) if k % n == i - 1]
    return cases


def no_match(workloads: Iterable[Workload], patterns: Iterable[str]) -> WorkloadError:
    """The error for patterns that select no case, naming the nearest workload names and
    case ids ('did you mean train_step?')."""
    names: set[str] = set()
    for w in workloads:
        names.add(w.name)
        names.update(c.case_id for c in w.cases())
    pats = list(patterns)
    close = [
        near for p in pats for near in difflib.get_close_matches(p, sorted(names), n=3, cutoff=0.5)
    ]
    hint = f"; did you mean {', '.join(dict.fromkeys(close))}?" if close else ""
    return WorkloadError(f"no case matches {' or '.join(pats) or 'the suite'}{hint}")


def suite_hash(cases: Iterable[Case], config: Config) -> str:
    """Changes when the suite's definition changes: cases, params, counts."""
    payload = [
        [c.case_id, c.seed, list(config.settings_for(c.workload))]
        for c in sorted(cases, key=lambda c: c.case_id)
    ]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[
        :16
    ]


def workload_data(wl: Workload) -> dict[str, Any]:
    """A discovered workload as plain data, for a process that does not import its module:
    all but its functions."""
    return {
        "name": wl.name,
        "params": wl.params,
        "seed": wl.seed,
        "module": wl.module,
        "tolerance": wl.tolerance,
        "precision": wl.precision,
    }


def imported_elsewhere(*_args: Any, **_kwargs: Any) -> Any:
    """The function of a workload discovered in another process (the fork server, see
    memtrack.worker.server): it runs there and in the case's worker, never here."""
    raise WorkloadError("this workload was imported in another process and runs only there")


def from_data(data: dict[str, Any]) -> Workload:
    """A workload from `workload_data`: its grid, seed and checks, its function elsewhere."""
    return Workload(
        data["name"],
        imported_elsewhere,
        data["params"],
        data["seed"],
        data["module"],
        data["tolerance"],
        None,
        data["precision"],
    )


def find(name: str) -> Workload:
    """The workload registered under `name` (in the worker: by the case's module)."""
    matches = [wl for (_, wname), wl in _REGISTRY.items() if wname == name]
    if not matches:
        raise WorkloadError(f"no workload named {name!r} is registered")
    if len(matches) > 1:
        modules = " and ".join(_where(wl.module) for wl in matches)
        raise WorkloadError(f"workload {name!r} is declared in two modules: {modules}")
    return matches[0]
