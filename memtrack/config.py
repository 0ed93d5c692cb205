"""Configuration: `[tool.memtrack]` in pyproject.toml, or a memtrack.toml, validated.

Without any file, the embedded default runs the shipped example suite into
`data/memtrack.db` under the current directory.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrack.errors import ConfigError
from memtrack.files import read_named
from memtrack.records import metrics
from memtrack.store.url import Database, ServerUrl, parse_database
from memtrack.units import parse_duration, parse_fraction, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_MODULES = ("memtrack.examples",)
MAX_COUNT = 1_000_000
"""The largest count a key takes (repeats, runs, cases): a bound against typos."""
METRICS = metrics.GATED
"""Memory metrics a budget can name: the gated ones of the registry (memtrack.records.metrics)."""


@dataclass(frozen=True)
class WorkloadSettings:
    """Per-workload overrides of the suite-wide counts."""

    warmup: int | None = None
    repeats: int | None = None
    timeout_s: float | None = None
    params: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Replaces parameter values of the declared grid (e.g. sizes that fill this GPU)."""


@dataclass(frozen=True)
class Budget:
    """An absolute ceiling for one workload (or one case), optionally for one GPU model."""

    workload: str
    """A workload name (all its cases) or a case id 'name[k=v,...]'."""
    limit_bytes: int
    reason: str
    """Why this much is justified: a budget is a reviewed decision."""
    metric: str | None = None
    """One of METRICS; None: the device view where measured, else reserved, else allocated."""
    gpu: str | None = None
    """Applies only on this GPU model (e.g. 'NVIDIA H200'), or 'cpu': only to cases that ran
    on the CPU; None: everywhere."""


HEADROOM_FACTOR = 3.0
"""The default `headroom_factor`: a run of unchanged code stays within 3 sigma of its level
(memtrack.judge.noise). The gate, `check --history` and the dashboard read it from here."""


@dataclass(frozen=True)
class Config:
    """A validated configuration. Paths are absolute."""

    path: Path | None
    """The file it came from; None for the embedded default."""
    root: Path
    """Directory that relative paths and module files are resolved against."""
    modules: tuple[str, ...] = DEFAULT_MODULES
    database: Database = Path("data/memtrack.db")
    base_branch: str = "main"
    device: str = "auto"
    warmup: int = 1
    repeats: int = 3
    timeout_s: float = 600.0
    nvml_interval_s: float = 0.01
    baseline_runs: int = 20
    min_baseline_runs: int = 3
    headroom_factor: float = HEADROOM_FACTOR
    time_regression: str = "warn"
    noisy_above: float = 0.05
    """A headroom wider than this fraction of its baseline is too wide to judge: `noisy`."""
    creep_anchor: str | int = 50
    """What `memtrack check --history` measures creep against: a git revision (a tag or
    a commit) or N, the base-branch commit N recorded commits before the newest."""
    creep_tolerance: float = 0.01
    """Growth since the anchor, as a fraction, that `--history` accepts before it flags creep."""
    max_cases: int = 1000
    """A suite larger than this is refused before anything runs (a grid typo can be huge)."""
    plan_headroom: float = 0.10
    """`memtrack plan`'s headroom above a predicted peak, as a fraction of it, where the case
    has no baseline to take the gate's headroom from."""
    workloads: dict[str, WorkloadSettings] = field(default_factory=dict)
    budgets: tuple[Budget, ...] = ()
    dashboard_url: str | None = None
    """Where the team's dashboard is served (http or https), for links from the PR comment
    to a case's History; None: no links."""
    forge_url: str = "https://github.com"
    """The forge the repository is hosted on (http or https), the only host the dashboard
    links commits and compares to. A run's recorded CI address names the repository there;
    one recorded on another host gives no link."""
    repository: str | None = None
    """This repository's identity in a database shared by many ('host/owner/name'); None:
    the CI's or the origin remote's (`memtrack.machine.provenance.repository_identity`)."""
    against: str | None = None
    """`memtrack run`'s paired timing by default (`--against`): 'merge-base' (the candidate's
    merge-base with the base branch; on the base branch, the commit's parent) or a git
    revision; None: unpaired, as without the option. Only where time is gated (not off)."""
    pair_rounds: int = 5
    """Rounds of a paired timing, each one pass of REF and one of the candidate: 5 at least,
    so that the sign test can reach judge.timing.TIME_ALPHA (2^-5 = 0.031)."""
    references: Path = Path("perf/references")
    """The folder of reference outputs and their manifest (see memtrack.measure.references). Not
    under data/ by default: many repositories ignore data/, and references are committed."""

    def settings_for(self, workload: str) -> tuple[int, int, float]:
        """(warmup, repeats, timeout_s) for a workload, overrides applied."""
        s = self.workloads.get(workload, WorkloadSettings())
        return (
            self.warmup if s.warmup is None else s.warmup,
            self.repeats if s.repeats is None else s.repeats,
            self.timeout_s if s.timeout_s is None else s.timeout_s,
        )


_TOP_KEYS = {
    "modules",
    "database",
    "base_branch",
    "device",
    "warmup",
    "repeats",
    "timeout",
    "nvml_interval",
    "baseline_runs",
    "min_baseline_runs",
    "headroom_factor",
    "time_regression",
    "workloads",
    "budgets",
    "creep_anchor",
    "creep_tolerance",
    "noisy_above",
    "max_cases",
    "dashboard_url",
    "forge_url",
    "references",
    "plan_headroom",
    "repository",
    "against",
    "pair_rounds",
}
REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)+")
"""A repository's identity: host/owner/name, no scheme, no credentials."""
_NOT_IN_URL = set(' "<>()[]`\\')
"""Characters a link address here may not hold: they would end or break a Markdown link."""
_WORKLOAD_KEYS = {"warmup", "repeats", "timeout", "params"}
_BUDGET_KEYS = {"workload", "limit", "reason", "metric", "gpu"}


class _Checker:
    """Validates one table, naming the file and the dotted key in every error."""

    def __init__(self, source: str, prefix: str, table: Any, known: set[str]):
        self.source, self.prefix = source, prefix
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{prefix}] must be a table")
        self.table = table
        for key in table:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {prefix}.{key}{hint}")

    def fail(self, key: str, why: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.prefix}.{key}: {why}")

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        if key not in self.table:
            return default
        value = self.table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(max(-(2**53), min(value, 2**53)))  # a float cannot hold every int
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise self.fail(key, f"expected {kind.__name__}, got {value!r}")
        return value

    def count(self, key: str, minimum: int, default: Any = None) -> Any:
        value = self.get(key, int, default)
        if value is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        if value is not None and value > MAX_COUNT:
            raise self.fail(key, f"must be at most {MAX_COUNT:,}, got {value}")
        return value

    def positive(self, key: str, default: float) -> float:
        """A finite number above 0 (TOML also spells nan and inf)."""
        value = self.get(key, float, default)
        if not 0 < value < math.inf:
            raise self.fail(key, f"must be a positive finite number, got {value}")
        return value

    def branch(self, key: str, default: str) -> str:
        """A branch name as git accepts it, which git can never read as an option."""
        value = self.get(key, str, default)
        if not is_branch(value):
            raise self.fail(key, f"{value!r} is not a branch name")
        return value

    def duration(self, key: str) -> float | None:
        if key not in self.table:
            return None
        return parse_duration(self.table[key], what=f"{self.source}: {self.prefix}.{key}")

    def fraction(self, key: str, default: float) -> float:
        """'2%' or 0.02; a fraction of a figure, never negative."""
        if key not in self.table:
            return default
        return parse_fraction(self.table[key], what=f"{self.source}: {self.prefix}.{key}")

    def url(self, key: str) -> str | None:
        """An http(s) address to link to: no credentials, query or fragment (memtrack adds
        its own query), nothing that would end a Markdown link early."""
        value = self.get(key, str)
        if value is None:
            return None
        text = value.strip()
        why = (
            f"expected an http(s) address without credentials, query, fragment, spaces or "
            f"brackets, got {value!r}"
        )
        if any(ch in _NOT_IN_URL or ord(ch) < 32 for ch in text):
            raise self.fail(key, why)
        try:
            parts = urllib.parse.urlsplit(text)
            parts.port  # noqa: B018 (raises on a port out of range)
        except ValueError as exc:
            raise self.fail(key, f"{exc}, got {value!r}") from None
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.username is not None
            or parts.password is not None
            or parts.query
            or parts.fragment
        ):
            raise self.fail(key, why)
        return text.rstrip("/")

    def choice(self, key: str, choices: tuple[str, ...], default: str | None) -> str | None:
        value = self.get(key, str, default)
        if value is not None and value not in choices:
            raise self.fail(key, f"{value!r} is not one of {', '.join(choices)}")
        return value


def find_config(start: Path) -> Path | None:
    """memtrack.toml, or a pyproject.toml with [tool.memtrack], in start or its parents."""
    for folder in (start, *start.parents):
        candidate = folder / "memtrack.toml"
        if candidate.is_file():
            return candidate
        pyproject = folder / "pyproject.toml"
        if (
            pyproject.is_file()
            and "tool" in read_toml(pyproject)
            and "memtrack" in (read_toml(pyproject)["tool"])
        ):
            return pyproject
        if (folder / ".git").exists():
            break
    return None


def is_revision(text: str) -> bool:
    """A revision (`v1.2`, `main~10`, a commit id) that git can never read as an option."""
    return bool(text) and not text.startswith("-") and text.isprintable() and " " not in text


def is_branch(text: str) -> bool:
    """Close to `git check-ref-format --branch`."""
    return (
        is_revision(text)
        and not text.startswith(("/", "."))
        and not text.endswith(("/", ".", ".lock"))
        and ".." not in text
        and "@{" not in text
        and not any(c in "~^:?*[\\" for c in text)
    )


MAX_CONFIG_BYTES = 4 * 2**20
"""A config or GPU catalog larger than this is refused unread: no real one comes close."""


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file someone named, parsed; every failure one ConfigError naming the file.
    It must be a regular file (not /dev/zero, a FIFO or a terminal) of bounded size."""
    label = str(path)
    data = read_named(path, MAX_CONFIG_BYTES, ConfigError)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not UTF-8 text (byte {exc.start}), as TOML must be") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{label}: not valid TOML (nested too deeply)") from None


def load_config(path: Path | None = None, *, cwd: Path | None = None) -> Config:
    """Load and validate. `path` None: search from cwd, else use the embedded default."""
    cwd = (cwd or Path.cwd()).resolve()
    if path is None:
        path = find_config(cwd)
        if path is None:
            return Config(
                path=None,
                root=cwd,
                database=cwd / "data" / "memtrack.db",
                references=cwd / "perf" / "references",
            )
    path = path.resolve()
    data = read_toml(path)
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("memtrack")
        if table is None:
            raise ConfigError(f"{path}: has no [tool.memtrack] table")
        prefix = "tool.memtrack"
    else:
        table, prefix = data, "memtrack"
    return _validate(table, path, prefix)


def config_from_text(text: str, path: Path) -> Config:
    """A config from file contents (e.g. as of another commit), validated as `path`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML (nested too deeply)") from None
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("memtrack")
        if table is None:
            raise ConfigError(f"{path}: has no [tool.memtrack] table")
        return _validate(table, path, "tool.memtrack")
    return _validate(data, path, "memtrack")


MIN_PAIR_ROUNDS = 5
"""Fewer rounds could never reach the sign test's threshold (every round slower: 2^-k)."""
MERGE_BASE = "merge-base"


MAX_PAIR_ROUNDS = 1000


def _pair_rounds(c: _Checker) -> int:
    rounds = int(c.count("pair_rounds", MIN_PAIR_ROUNDS, 5))
    if rounds > MAX_PAIR_ROUNDS:
        raise c.fail("pair_rounds", f"must be at most {MAX_PAIR_ROUNDS:,}, got {rounds}")
    return rounds


def _against(c: _Checker) -> str | None:
    value = c.get("against", str)
    if value is not None and not is_revision(value.strip()):
        raise c.fail("against", f"expected 'merge-base' or a git revision, got {value!r}")
    return value.strip() if value is not None else None


def _plan_headroom(c: _Checker) -> float:
    value = c.fraction("plan_headroom", 0.10)
    if value > 1:
        raise c.fail("plan_headroom", f"must be at most 100%, got {c.table['plan_headroom']!r}")
    return value


def _workload_settings(source: str, prefix: str, sub: Any) -> WorkloadSettings:
    w = _Checker(source, prefix, sub, _WORKLOAD_KEYS)
    params: dict[str, tuple[Any, ...]] = {}
    for key, value in w.get("params", dict, {}).items():
        values = tuple(value) if isinstance(value, list) else (value,)
        if not values or not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise w.fail(f"params.{key}", f"expected a value or a list of values, got {value!r}")
        params[key] = values
    return WorkloadSettings(
        warmup=w.count("warmup", 0),
        repeats=w.count("repeats", 1),
        timeout_s=w.duration("timeout"),
        params=params,
    )


def _budget(source: str, prefix: str, sub: Any) -> Budget:
    b = _Checker(source, prefix, sub, _BUDGET_KEYS)
    for required in ("workload", "limit", "reason"):
        if required not in sub:
            raise b.fail(required, "is required (a budget needs a workload, a limit and a reason)")
    reason = b.get("reason", str)
    if not reason.strip():
        raise b.fail("reason", "must say in one line why this budget is justified")
    return Budget(
        workload=b.get("workload", str),
        limit_bytes=parse_size(sub["limit"], what=f"{source}: {b.prefix}.limit"),
        reason=reason.strip(),
        metric=b.choice("metric", METRICS, None),
        gpu=b.get("gpu", str),
    )


def _repository(c: _Checker) -> str | None:
    value = c.get("repository", str)
    if value is None:
        return None
    if not REPOSITORY.fullmatch(value):
        raise c.fail(
            "repository",
            f"expected 'host/owner/name' (letters, digits, . _ - / only), got {value!r}",
        )
    return value


def _validate(table: Any, path: Path, prefix: str) -> Config:
    source = str(path)
    c = _Checker(source, prefix, table, _TOP_KEYS)
    root = path.parent
    modules = c.get("modules", list, list(DEFAULT_MODULES))
    if not modules or not all(isinstance(m, str) and m for m in modules):
        raise c.fail("modules", "expected a non-empty list of module names or .py paths")
    try:
        database = parse_database(c.get("database", str, "data/memtrack.db"), "")
    except ConfigError as exc:
        raise c.fail("database", str(exc)) from None
    references_text = c.get("references", str, "perf/references")
    if not references_text.strip() or "\0" in references_text:
        raise c.fail("references", f"expected a folder path, got {references_text!r}")
    references = Path(references_text)
    workloads = {
        name: _workload_settings(source, f"{prefix}.workloads.{name}", sub)
        for name, sub in c.get("workloads", dict, {}).items()
    }
    budgets = [
        _budget(source, f"{prefix}.budgets[{i}]", sub)
        for i, sub in enumerate(c.get("budgets", list, []))
    ]
    anchor = table.get("creep_anchor", 50)
    if (
        isinstance(anchor, bool)
        or not isinstance(anchor, (str, int))
        or (isinstance(anchor, int) and not 1 <= anchor <= MAX_COUNT)
        or (isinstance(anchor, str) and not is_revision(anchor.strip()))
    ):
        raise c.fail(
            "creep_anchor",
            f"expected a git revision (tag or commit) or a number of "
            f"commits of at least 1, got {anchor!r}",
        )
    return Config(
        path=path,
        root=root,
        modules=tuple(modules),
        database=database
        if isinstance(database, ServerUrl) or database.is_absolute()
        else root / database,
        base_branch=c.branch("base_branch", "main"),
        device=c.choice("device", ("auto", "cpu", "cuda"), "auto") or "auto",
        warmup=c.count("warmup", 0, 1),
        repeats=c.count("repeats", 1, 3),
        timeout_s=c.duration("timeout") or 600.0,
        nvml_interval_s=c.duration("nvml_interval") or 0.01,
        baseline_runs=c.count("baseline_runs", 1, 20),
        min_baseline_runs=c.count("min_baseline_runs", 1, 3),
        headroom_factor=c.positive("headroom_factor", HEADROOM_FACTOR),
        time_regression=c.choice("time_regression", ("warn", "block", "off"), "warn") or "warn",
        creep_anchor=anchor.strip() if isinstance(anchor, str) else anchor,
        creep_tolerance=c.fraction("creep_tolerance", 0.01),
        noisy_above=c.fraction("noisy_above", 0.05),
        max_cases=c.count("max_cases", 1, 1000),
        plan_headroom=_plan_headroom(c),
        workloads=workloads,
        budgets=tuple(budgets),
        dashboard_url=c.url("dashboard_url"),
        forge_url=c.url("forge_url") or Config.forge_url,
        repository=_repository(c),
        against=_against(c),
        pair_rounds=_pair_rounds(c),
        references=references if references.is_absolute() else root / references,
    )
