"""Deciding: a candidate run against its baseline and its budgets, as verdicts.

The baseline of a case is the last N runs of that case on the base branch, at or before the
candidate's merge-base, on the same environment fingerprint. The headroom is justified by
what was observed, never a fixed percentage:

    spread    = max(baseline spread, candidate repeat spread)
    headroom  = max(factor x spread, floor)
    threshold = baseline + headroom            (baseline: median of the baseline runs)

and a candidate above the threshold is a regression. Every verdict carries that arithmetic
in its message. Nothing here prints; `memtrack.report` shows what this returns.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memtrack.config import Budget, Config, config_from_text
from memtrack.errors import ConfigError, StoreError
from memtrack.records import Environment, Measurement, RunRecord
from memtrack.store import Store, device_peak
from memtrack.units import format_seconds, format_size

MiB = 2**20

MEMORY_METRICS = ("allocated", "reserved", "requested", "device", "host")
KINDS = ("regression", "over_budget", "improvement", "new", "failed", "environment_changed",
         "time_regression", "ok")

_COLUMNS = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "requested": "peak_requested_bytes",
    "device": "device_peak_bytes",
    "host": "host_peak_rss_bytes",
}

FLOORS = {
    # The caching allocator rounds every request up to a multiple of 512 B: a smaller
    # change in allocated memory cannot be told from rounding.
    "allocated": 512,
    # `requested` is before rounding, but the same request size quantum makes anything below
    # it meaningless as a regression.
    "requested": 512,
    # Reserved memory grows by whole segments, the smallest being 2 MiB.
    "reserved": 2 * MiB,
    # NVML's per-process figure moves with the driver's 2 MiB pages and the allocator's
    # 2 MiB segments; the CUDA context adds its own page-sized steps.
    "device": 2 * MiB,
    # Resident set size moves by 2 MiB transparent huge pages (x86-64) and by glibc arenas
    # being trimmed or not, with no change in code.
    "host": 2 * MiB,
}
"""The smallest change per metric that can be a change in code rather than granularity."""

PROVISIONAL_BLOCK_FRACTION = 0.10
"""With fewer baseline runs than `min_baseline_runs` the spread is not known yet: a
regression then blocks only past this jump (10 %); smaller ones warn. Budgets always block."""

TIME_MIN_EFFECT = 0.05
"""Time is noisy: a median slowdown under 5 % (or under the observed run-to-run spread times
the factor) is not tested at all, and scipy is not even loaded."""
TIME_ALPHA = 0.01
"""One-sided Mann-Whitney U significance level for a time regression."""

_ANCESTRY_FIRST = 512
"""Ancestors listed at first; the list doubles while an older baseline commit is asked for."""


# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One case and metric of the candidate, judged. Figures are bytes (seconds for time)."""

    case_id: str
    workload: str
    metric: str
    """allocated | reserved | requested | device | host | time | status"""
    kind: str
    """One of KINDS."""
    blocking: bool
    message: str
    """One line with the arithmetic: baseline, spread, factor, floor, threshold, candidate,
    delta (bytes and %), and the budget where one applies."""
    provisional: bool = False
    """Fewer baseline runs than `min_baseline_runs`: the spread is not established yet."""
    baseline_value: float | None = None
    """Median of the baseline runs."""
    spread: float | None = None
    """max(baseline spread, candidate repeat spread)."""
    baseline_spread: float | None = None
    repeat_spread: float | None = None
    factor: float | None = None
    floor: float | None = None
    threshold: float | None = None
    candidate_value: float | None = None
    delta: float | None = None
    delta_pct: float | None = None
    budget_bytes: int | None = None
    budget_reason: str | None = None
    baseline_runs: int = 0
    suggested_budget: int | None = None
    """For an improvement: a tighter budget that still holds the candidate with headroom."""
    p_value: float | None = None
    """Time only: Mann-Whitney U, one-sided (candidate slower)."""
    details: tuple[str, ...] = ()
    """Further lines: differing versions, per-device VRAM fit, budget changes."""


@dataclass(frozen=True)
class BudgetChange:
    """A budget that the candidate's config changes relative to the base config."""

    workload: str
    metric: str | None
    gpu: str | None
    change: str
    """raised | lowered | added | removed"""
    old_bytes: int | None
    new_bytes: int | None
    reason: str

    def describe(self) -> str:
        where = self.workload + (f" ({self.metric})" if self.metric else "") + (
            f" on {self.gpu}" if self.gpu else "")
        return (f"budget {self.change}: {where} {format_size(self.old_bytes)} -> "
                f"{format_size(self.new_bytes)} ({self.reason})")


@dataclass(frozen=True)
class CheckResult:
    """Everything `memtrack check` decided about one candidate run."""

    run_id: str
    commit: str | None
    branch: str | None
    started_at: str
    fingerprint: str
    base_branch: str
    merge_base: str | None
    baseline_mode: str
    """'ancestry' (commits at or before the merge-base) or 'time' (the merge-base could not
    be used, e.g. a shallow clone: base-branch commits no newer than a reference time)."""
    verdicts: tuple[Verdict, ...]
    budget_changes: tuple[BudgetChange, ...] = ()
    notes: tuple[str, ...] = ()
    checked_at: str = ""

    @property
    def blocking(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.blocking)

    @property
    def exit_code(self) -> int:
        """0 when nothing blocks, 1 when something does."""
        return 1 if self.blocking else 0


# -- small arithmetic -----------------------------------------------------------------------


def metric_value(m: Measurement, metric: str) -> int | None:
    """A measurement's figure for a memory metric (device: the largest per-device peak)."""
    if metric == "device":
        return device_peak(m)
    if metric not in _COLUMNS:
        raise ValueError(f"unknown metric {metric!r}")
    value = getattr(m, _COLUMNS[metric])
    return None if value is None else int(value)


def repeat_spread(m: Measurement, metric: str) -> int:
    """How far the candidate's own peak moved between its repeats.

    The compared figure is the highest of the per-iteration peaks, so the noise that matters
    is how reproducible that highest one is: the gap between the highest and the second
    highest iteration. An iteration that stays lower every time (e.g. the first one, before
    a lazy buffer exists) is structure, not noise, and must not widen the headroom.
    Only the framework's allocated view is sampled per iteration.
    """
    if metric != "allocated" or len(m.allocated_samples) < 2:
        return 0
    top = sorted(m.allocated_samples)[-2:]
    return int(top[1] - top[0])


# Expected range of n normal samples in standard deviations (Tippett's d2, the constants of
# range control charts), n = 2..20.
_D2 = (1.128, 1.693, 2.059, 2.326, 2.534, 2.704, 2.847, 2.970, 3.078, 3.173, 3.258, 3.336,
       3.407, 3.472, 3.532, 3.588, 3.640, 3.689, 3.735)


def baseline_spread(values: Sequence[float]) -> float:
    """Robust spread of the baseline: 1.4826 x MAD (a standard-deviation estimate that one
    outlier cannot move), but never less than half the observed range, so that a value the
    unchanged code already produced inside the window can never exceed its threshold
    (with factor >= 2). A short baseline sees a narrower range than 20 runs would: its
    range is scaled up to the range expected of 20 runs (d2(20) / d2(n))."""
    n = len(values)
    if n < 2:
        return 0.0
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    scale = _D2[-1] / _D2[min(n, 20) - 2]
    return max(1.4826 * mad, scale * (max(values) - min(values)) / 2)


def headroom(spread: float, factor: float, floor: int) -> float:
    return max(factor * spread, float(floor))


def suggest_budget(value: int, room: float) -> int:
    """A budget that holds `value` with its headroom and 10 % to grow, rounded up to MiB."""
    need = value + max(room, value / 10)
    return int(math.ceil(need / MiB)) * MiB


def _pct(delta: float, base: float) -> float | None:
    return None if not base else 100.0 * delta / base


def _fmt_pct(p: float | None) -> str:
    return "n/a" if p is None else f"{p:+.2f}%"


def _fmt_delta(d: float) -> str:
    n = int(round(d))
    if abs(n) < 1024:
        return f"{n:+,} B"
    return f"{'+' if n >= 0 else '-'}{format_size(abs(n))} ({n:+,} B)"


# -- git -----------------------------------------------------------------------------------


def git_output(root: Path, *args: str) -> str | None:
    """git's output, or None when git fails (no repository, unknown object)."""
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def iso_epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


class _Ancestry:
    """Commits reachable from a revision, listed lazily (newest first, doubling)."""

    def __init__(self, root: Path, rev: str):
        self.root, self.rev = root, rev
        self.commits: set[str] = set()
        self.oldest: float | None = None
        self.count = 0
        self.complete = False

    def _load(self) -> None:
        self.count = max(_ANCESTRY_FIRST, self.count * 2)
        out = git_output(self.root, "log", "--format=%H %ct", "-n", str(self.count),
                         self.rev) or ""
        lines = out.splitlines()
        self.commits = {line.split()[0] for line in lines}
        times = [float(line.split()[1]) for line in lines]
        self.oldest = min(times) if times else None
        self.complete = len(lines) < self.count

    def contains(self, sha: str, committed_at: float | None) -> bool:
        if not self.count:
            self._load()
        while True:
            if sha in self.commits:
                return True
            if self.complete:
                return False
            # A commit newer than everything listed would have been listed: not an ancestor.
            if committed_at is not None and self.oldest is not None and committed_at >= self.oldest:
                return False
            self._load()


# -- baseline ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One baseline run's measurement of a case."""

    run_id: str
    commit: str | None
    started_at: str
    env_id: str | None
    status: str
    values: dict[str, int]
    times: tuple[float, ...]


_POINT_SQL = """
select r.run_id, r.git_commit, r.started_at, r.git_committed_at, r.env_id, r.fingerprint,
       m.status, m.peak_allocated_bytes, m.peak_reserved_bytes, m.peak_requested_bytes,
       m.device_peak_bytes, m.host_peak_rss_bytes, m.iteration_times_s
from runs r cross join measurements m
where r.git_branch = :branch and r.run_id != :candidate {fingerprint}
  and m.case_id = :case and m.run_id = r.run_id
order by r.started_at desc
"""
# CROSS JOIN keeps `runs` as the outer loop: newest first through the (git_branch,
# started_at) index, each probing measurements(case_id, run_id); the scan stops after N.


class BaselineFinder:
    """Finds the baseline points of a case: base branch, at or before the merge-base."""

    def __init__(self, store: Store, run: RunRecord, base_branch: str, root: Path,
                 limit: int):
        self.store, self.run, self.base_branch, self.root = store, run, base_branch, root
        self.limit = limit
        self.notes: list[str] = []
        self.merge_base = run.git.merge_base
        self.ancestry: _Ancestry | None = None
        self.cutoff: float | None = None
        self.mode = self._choose_mode()

    def _choose_mode(self) -> str:
        git = self.run.git
        commit = git.commit
        flags = (git_output(self.root, "rev-parse", "--is-inside-work-tree",
                      "--is-shallow-repository") or "").split()
        inside = flags[:1] == ["true"]
        shallow = flags[1:2] == ["true"]
        known = inside and commit is not None and git_output(
            self.root, "cat-file", "-e", f"{commit}^{{commit}}") is not None
        if known and not shallow and self.merge_base is None:
            for ref in (self.base_branch, f"origin/{self.base_branch}"):
                mb = git_output(self.root, "merge-base", commit or "", ref)
                if mb:
                    self.merge_base = mb
                    break
        mb_known = self.merge_base is not None and inside and git_output(
            self.root, "cat-file", "-e", f"{self.merge_base}^{{commit}}") is not None
        if mb_known and not shallow:
            self.ancestry = _Ancestry(self.root, self.merge_base or "")
            return "ancestry"
        # Degrade to time: base-branch commits no newer than the merge-base (or candidate).
        why = ("shallow clone" if shallow or git.shallow else
               "no git repository here" if not inside else
               "merge-base unknown" if self.merge_base is None else
               f"merge-base {self.merge_base[:12]} not in this repository")
        ref_time, ref_what = None, ""
        if self.merge_base:
            ref_time = iso_epoch(
                git_output(self.root, "show", "-s", "--format=%cI", self.merge_base))
            if ref_time is None:
                row = self.store.conn.execute(
                    "select max(git_committed_at) from runs where git_commit = ?",
                    [self.merge_base]).fetchone()
                ref_time = iso_epoch(row[0]) if row else None
            ref_what = f"merge-base {self.merge_base[:12]}"
        if ref_time is None and git.committed_at:
            ref_time = iso_epoch(git.committed_at)
            ref_what = f"candidate commit {(commit or '')[:12]}"
        if ref_time is None:
            ref_time, ref_what = iso_epoch(self.run.started_at), "candidate run"
        self.cutoff = ref_time
        stamp = datetime.fromtimestamp(ref_time or 0, timezone.utc).isoformat(timespec="seconds")
        self.notes.append(
            f"{why}: baseline chosen by time, not ancestry: runs on {self.base_branch} of "
            f"commits made at or before {stamp} ({ref_what}); fetch the full history "
            f"(actions/checkout fetch-depth: 0) for an exact baseline")
        return "time"

    def _eligible(self, row: Any) -> bool:
        committed = iso_epoch(row["git_committed_at"])
        if self.ancestry is not None:
            return bool(row["git_commit"]) and self.ancestry.contains(row["git_commit"], committed)
        when = committed if committed is not None else iso_epoch(row["started_at"])
        return when is not None and self.cutoff is not None and when <= self.cutoff

    def _rows(self, case_id: str, same_env: bool) -> Iterator[Any]:
        sql = _POINT_SQL.format(fingerprint="and r.fingerprint = :fp" if same_env else "")
        params = {"branch": self.base_branch, "candidate": self.run.run_id, "case": case_id,
                  "fp": self.run.environment.fingerprint}
        for row in self.store.conn.execute(sql, params):
            if self._eligible(row):
                yield row

    def points(self, case_id: str) -> list[Point]:
        """The newest `limit` eligible same-environment points, newest first."""
        out = []
        for row in self._rows(case_id, same_env=True):
            out.append(_point(row))
            if len(out) >= self.limit:
                break
        return out

    def other_env(self, case_id: str) -> Point | None:
        """The newest eligible point of this case on another environment."""
        for row in self._rows(case_id, same_env=False):
            if row["fingerprint"] != self.run.environment.fingerprint:
                return _point(row)
        return None

    def newest_cases(self) -> set[str] | None:
        """The cases of the newest eligible same-environment base run, if there is one."""
        rows = self.store.conn.execute(
            "select run_id, git_commit, git_committed_at, started_at from runs "
            "where git_branch = ? and fingerprint = ? and run_id != ? order by started_at desc",
            [self.base_branch, self.run.environment.fingerprint, self.run.run_id])
        for row in rows:
            if self._eligible(row):
                return {r[0] for r in self.store.conn.execute(
                    "select case_id from measurements where run_id = ?", [row["run_id"]])}
        return None

    def seen_anywhere(self, case_id: str) -> bool:
        row = self.store.conn.execute(
            "select 1 from measurements where case_id = ? and run_id != ? limit 1",
            [case_id, self.run.run_id]).fetchone()
        return row is not None


def _point(row: Any) -> Point:
    values = {metric: int(row[col]) for metric, col in _COLUMNS.items() if row[col] is not None}
    times = tuple(json.loads(row["iteration_times_s"]) or ()) if row["iteration_times_s"] else ()
    return Point(row["run_id"], row["git_commit"], row["started_at"], row["env_id"],
                 row["status"], values, times)


# -- environment --------------------------------------------------------------------------


def environment_diff(old: Environment, new: Environment) -> list[str]:
    """'what: old -> new' for each confounder that differs."""
    def gpus(e: Environment) -> str:
        return ", ".join(f"{g.name} ({format_size(g.total_bytes)})" for g in e.gpus) or "none"

    pairs = [
        ("GPUs", gpus(old), gpus(new)), ("driver", old.driver, new.driver),
        ("CUDA", old.cuda_runtime, new.cuda_runtime), ("cuDNN", old.cudnn, new.cudnn),
        ("NCCL", old.nccl, new.nccl), ("torch", old.torch, new.torch),
        ("Python", old.python, new.python), ("OS", old.os, new.os),
    ]
    out = [f"{what}: {a or '-'} -> {b or '-'}" for what, a, b in pairs if a != b]
    for name in sorted(set(old.env_vars) | set(new.env_vars)):
        if old.env_vars.get(name) != new.env_vars.get(name):
            out.append(f"{name}: {old.env_vars.get(name, '(unset)')} -> "
                       f"{new.env_vars.get(name, '(unset)')}")
    for name in sorted(set(old.packages) | set(new.packages)):
        if name != "torch" and old.packages.get(name) != new.packages.get(name):
            out.append(f"{name}: {old.packages.get(name, '-')} -> {new.packages.get(name, '-')}")
    return out


def _environment(store: Store, env_id: str | None) -> Environment | None:
    if env_id is None:
        return None
    row = store.conn.execute("select * from environments where env_id = ?", [env_id]).fetchone()
    if row is None:
        return None
    from memtrack.records import GpuInfo

    data = dict(row)
    for name in ("gpus", "torch_cuda_arch_list", "packages", "env_vars"):
        if isinstance(data.get(name), str):
            data[name] = json.loads(data[name])
    return Environment(
        fingerprint=data["fingerprint"],
        gpus=tuple(GpuInfo(**g) for g in data.get("gpus") or ()),
        driver=data.get("driver"), cuda_runtime=data.get("cuda_runtime"),
        cudnn=data.get("cudnn"), nccl=data.get("nccl"), torch=data.get("torch"),
        python=data.get("python"), os=data.get("os"), cpu=data.get("cpu"),
        packages=data.get("packages") or {}, env_vars=data.get("env_vars") or {},
    )


# -- budgets -------------------------------------------------------------------------------


def default_budget_metric(m: Measurement) -> str:
    """The device view where measured, else reserved, else allocated."""
    for metric in ("device", "reserved"):
        if metric_value(m, metric) is not None:
            return metric
    return "allocated"


def budgets_for(budgets: Sequence[Budget], m: Measurement, env: Environment) -> dict[str, Budget]:
    """The budget that applies to each metric of a case: the most specific one (a case id
    over a workload name, a GPU model over any GPU), the tighter on a tie."""
    gpu_names = {g.name.lower() for g in env.gpus}
    chosen: dict[str, tuple[tuple[int, int, int], Budget]] = {}
    for b in budgets:
        if b.workload not in (m.workload, m.case_id):
            continue
        if b.gpu is not None and not (
                b.gpu.lower() in gpu_names and m.device != "cpu"
                or b.gpu.lower() == "cpu" and m.device == "cpu"):
            continue
        metric = b.metric or default_budget_metric(m)
        rank = (int(b.workload == m.case_id), int(b.gpu is not None), -b.limit_bytes)
        if metric not in chosen or rank > chosen[metric][0]:
            chosen[metric] = (rank, b)
    return {metric: b for metric, (_, b) in chosen.items()}


def budget_changes(config: Config, root: Path, rev: str | None) -> tuple[list[BudgetChange],
                                                                           str | None]:
    """Budgets the current config changes relative to the same file at `rev`."""
    if config.path is None:
        return [], None
    quiet = not config.budgets  # nothing to raise: a missing base is not worth a note
    if rev is None:
        return [], None if quiet else "budget changes not checked: no base revision to compare with"
    top = git_output(root, "rev-parse", "--show-toplevel")
    if top is None:
        return [], "budget changes not checked: the config is not in a git repository"
    try:
        rel = config.path.resolve().relative_to(Path(top).resolve()).as_posix()
    except ValueError:
        return [], "budget changes not checked: the config is outside the repository"
    if git_output(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}") is None:
        note = (f"budget changes not checked: {rev} is not in this clone (shallow?), so the "
                "config cannot be compared with the base's")
        return [], None if quiet else note
    text = git_output(root, "show", f"{rev}:{rel}")
    if text is None:
        return [], None  # the file is new here: its budgets are all new
    try:
        old = config_from_text(text, config.path)
    except ConfigError as exc:
        return [], f"budget changes not checked: the base config does not load ({exc})"

    def key(b: Budget) -> tuple[str, str, str]:
        return (b.workload, b.metric or "", b.gpu or "")

    before = {key(b): b for b in old.budgets}
    after = {key(b): b for b in config.budgets}
    out = []
    for k in sorted(set(before) | set(after)):
        a, b = before.get(k), after.get(k)
        if a and b and a.limit_bytes == b.limit_bytes:
            continue
        change = ("added" if a is None else "removed" if b is None else
                  "raised" if b.limit_bytes > a.limit_bytes else "lowered")
        ref = b or a
        assert ref is not None
        out.append(BudgetChange(ref.workload, ref.metric, ref.gpu, change,
                                a.limit_bytes if a else None, b.limit_bytes if b else None,
                                ref.reason))
    return out, None


# -- verdicts ------------------------------------------------------------------------------


@dataclass
class _Case:
    """What is known about one candidate case while judging it."""

    m: Measurement
    points: list[Point]
    budgets: dict[str, Budget]
    provisional: bool
    changes: list[BudgetChange] = field(default_factory=list)


def _budget_part(value: int, budget: Budget | None) -> str:
    if budget is None:
        return ""
    margin = budget.limit_bytes - value
    state = (f"margin {format_size(margin)}" if margin >= 0 else
             f"OVER by {format_size(-margin)}")
    return f"; budget {format_size(budget.limit_bytes)} ({budget.reason}): {state}"


def _memory_verdict(c: _Case, metric: str, config: Config) -> Verdict | None:
    """Headroom arithmetic against the baseline points, and the budget, for one metric."""
    m = c.m
    value = metric_value(m, metric)
    if value is None:
        return None
    budget = c.budgets.get(metric)
    over = budget is not None and value > budget.limit_bytes
    details = tuple(ch.describe() for ch in c.changes
                    if (ch.metric or default_budget_metric(m)) == metric)
    common: dict[str, Any] = dict(
        case_id=m.case_id, workload=m.workload, metric=metric, candidate_value=float(value),
        budget_bytes=budget.limit_bytes if budget else None,
        budget_reason=budget.reason if budget else None, details=details)
    values = [p.values[metric] for p in c.points if p.status == "ok" and metric in p.values]
    if not values:
        if budget is None:
            return None  # the baseline never measured this view: nothing to compare
        return Verdict(kind="over_budget" if over else "ok", blocking=over,
                       message=f"{metric}: {format_size(value)}, the baseline has no {metric} "
                               f"figure to compare{_budget_part(value, budget)}", **common)
    n = len(values)
    base = statistics.median(values)
    s_base = baseline_spread(values)
    s_rep = repeat_spread(m, metric)
    spread = max(s_base, float(s_rep))
    floor = FLOORS[metric]
    factor = config.headroom_factor
    room = headroom(spread, factor, floor)
    threshold = base + room
    delta = value - base
    pct = _pct(delta, base)
    provisional = n < config.min_baseline_runs
    suggested = None
    if over:
        kind, blocking = "over_budget", True
    elif value > threshold:
        kind = "regression"
        blocking = not provisional or (pct is not None and pct >= 100 * PROVISIONAL_BLOCK_FRACTION)
    elif delta < -room:
        kind, blocking = "improvement", False
        suggestion = suggest_budget(value, room)
        if budget is None or suggestion < budget.limit_bytes:
            suggested = suggestion
    else:
        kind, blocking = "ok", False
    words = {
        "regression": "regression" + ("" if blocking else
                                      f" (provisional: blocks only past a "
                                      f"{PROVISIONAL_BLOCK_FRACTION:.0%} jump)"),
        "over_budget": "over budget",
        "improvement": "improvement" + (f"; a budget of {format_size(suggested)} would hold it"
                                        if suggested else ""),
        "ok": "ok",
    }[kind]
    cmp = "> headroom" if delta > room else "< -headroom" if delta < -room else "within ±headroom"
    message = (
        f"{metric}: baseline {format_size(int(base))} (median of {n} run{'s' * (n != 1)}"
        f"{', provisional' if provisional else ''}), spread {format_size(int(spread))} "
        f"(baseline {format_size(int(s_base))}, repeats {format_size(s_rep)}) x factor "
        f"{factor:g}, floor {format_size(floor)} -> headroom {format_size(int(room))}, "
        f"threshold {format_size(int(threshold))}; candidate {format_size(value)}, delta "
        f"{_fmt_delta(delta)} {_fmt_pct(pct)} {cmp}: {words}{_budget_part(value, budget)}"
    )
    return Verdict(kind=kind, blocking=blocking, message=message, provisional=provisional,
                   baseline_value=float(base), spread=spread, baseline_spread=s_base,
                   repeat_spread=float(s_rep), factor=factor, floor=float(floor),
                   threshold=threshold, delta=float(delta), delta_pct=pct, baseline_runs=n,
                   suggested_budget=suggested, **common)


def _unbased_verdict(c: _Case, metric: str, base_branch: str,
                     other_env: tuple[Point, list[str]] | None) -> Verdict | None:
    """No baseline on this environment: 'new' or 'environment changed', budgets still hold."""
    m = c.m
    value = metric_value(m, metric)
    if value is None:
        return None
    budget = c.budgets.get(metric)
    over = budget is not None and value > budget.limit_bytes
    if other_env is not None:
        point, diff = other_env
        kind = "environment_changed"
        text = (f"environment changed ({'; '.join(diff) or 'fingerprint differs'}): no baseline "
                f"on {base_branch} with this environment, not compared (newest other-environment "
                f"run {point.run_id[:12]} of {(point.commit or '?')[:12]})")
        details = tuple(diff)
    else:
        kind, text, details = "new", f"new: no baseline on {base_branch}", ()
    details += tuple(ch.describe() for ch in c.changes
                     if (ch.metric or default_budget_metric(m)) == metric)
    return Verdict(
        case_id=m.case_id, workload=m.workload, metric=metric,
        kind="over_budget" if over else kind, blocking=over, candidate_value=float(value),
        budget_bytes=budget.limit_bytes if budget else None,
        budget_reason=budget.reason if budget else None, details=details,
        message=f"{metric} {format_size(value)}: {text}{_budget_part(value, budget)}")


def _vram_verdict(v: Verdict, m: Measurement) -> Verdict:
    """Does peak plus the observed variation fit each device's VRAM? Devices do not pool."""
    if v.threshold is not None and v.baseline_value is not None:
        room = v.threshold - v.baseline_value
    else:
        room = float(FLOORS["device"])
    lines, worst = [], None
    for d in m.devices:
        if d.peak_process_bytes is None or not d.total_bytes:
            continue
        need = d.peak_process_bytes + room
        margin = d.total_bytes - need
        fit = f"fits, margin {format_size(int(margin))}" if margin >= 0 else "does NOT fit"
        lines.append(f"device {d.index} ({d.name or '?'}): peak "
                     f"{format_size(d.peak_process_bytes)} + headroom {format_size(int(room))} "
                     f"of {format_size(d.total_bytes)} VRAM: {fit}")
        if worst is None or margin < worst[0]:
            worst = (margin, d)
    if worst is None:
        return v
    margin, d = worst
    details = v.details + tuple(lines)
    if margin >= 0:
        return _replace(v, details=details, message=v.message + f"; fits VRAM of device {d.index} "
                        f"with {format_size(int(margin))} to spare")
    if v.kind == "over_budget":
        return _replace(v, details=details)
    return _replace(v, kind="over_budget", blocking=True, details=details,
                    budget_bytes=d.total_bytes,
                    budget_reason=f"VRAM of device {d.index} ({d.name})",
                    message=v.message + f"; peak + headroom does NOT fit the "
                    f"{format_size(d.total_bytes)} VRAM of device {d.index} ({d.name})")


def _replace(v: Verdict, **changes: Any) -> Verdict:
    from dataclasses import replace

    return replace(v, **changes)


def _time_verdict(c: _Case, config: Config) -> Verdict | None:
    """A time regression needs both an effect beyond what runs of the same code show and
    a significant test. Iterations of one run share its machine's mood, so the pooled test
    alone would call every slow runner a regression: the effect must first exceed the
    run-to-run spread (of run medians) times the factor, and at least TIME_MIN_EFFECT."""
    m = c.m
    cand = [t for t in m.iteration_times_s if t is not None]
    ok_points = [p for p in c.points if p.status == "ok" and p.times]
    pooled = [t for p in ok_points for t in p.times]
    if not cand or len(pooled) < 2:
        return None
    base = statistics.median(pooled)
    value = statistics.median(cand)
    delta = value - base
    pct = _pct(delta, base)
    medians = [statistics.median(p.times) for p in ok_points]
    spread = 0.0
    if len(medians) >= 2:
        center = statistics.median(medians)
        spread = 1.4826 * statistics.median(abs(x - center) for x in medians)
    floor = TIME_MIN_EFFECT * base
    factor = config.headroom_factor
    threshold = base + max(factor * spread, floor)
    provisional = len(ok_points) < config.min_baseline_runs
    p_value = None
    if value <= threshold:
        kind, verdict_words = "ok", "within the threshold, not tested"
    else:
        from scipy.stats import mannwhitneyu  # only when there is an effect to test

        # Exact distribution for the usual few candidate repeats: the normal approximation
        # is poor with 3 samples. Iteration times (floats) practically never tie.
        method = "exact" if len(cand) + len(pooled) <= 400 else "asymptotic"
        p_value = float(mannwhitneyu(cand, pooled, alternative="greater", method=method).pvalue)
        if p_value < TIME_ALPHA:
            kind = "time_regression"
            verdict_words = f"Mann-Whitney U p={p_value:.2g} < {TIME_ALPHA}: slower"
        else:
            kind = "ok"
            verdict_words = f"Mann-Whitney U p={p_value:.2g} >= {TIME_ALPHA}: not significant"
    blocking = kind == "time_regression" and config.time_regression == "block" and not provisional
    if kind == "time_regression" and not blocking:
        verdict_words += " (warning)"
    runs = len(ok_points)
    message = (
        f"time: baseline median {format_seconds(base)} ({len(pooled)} iterations of {runs} "
        f"run{'s' * (runs != 1)}{', provisional' if provisional else ''}), run-to-run spread "
        f"{format_seconds(spread)} x factor {factor:g}, floor {TIME_MIN_EFFECT:.0%} = "
        f"{format_seconds(floor)} -> threshold {format_seconds(threshold)}; candidate median "
        f"{format_seconds(value)} of {len(cand)}, delta {_fmt_pct(pct)}: {verdict_words}"
    )
    return Verdict(case_id=m.case_id, workload=m.workload, metric="time", kind=kind,
                   blocking=blocking, message=message, provisional=provisional,
                   baseline_value=base, spread=spread, factor=factor, floor=floor,
                   threshold=threshold, candidate_value=value, delta=delta, delta_pct=pct,
                   baseline_runs=runs, p_value=p_value)


def _failed_verdict(c: _Case) -> Verdict:
    m = c.m
    same_env_status = [p.status for p in c.points]
    passed = sum(s == "ok" for s in same_env_status)
    if c.points and c.points[0].status != "ok":
        blocking, why = False, (f"the newest baseline run failed too ({c.points[0].status}): "
                                f"a known failure, not caused here")
    elif c.points:
        blocking, why = True, f"the baseline passed ({passed} of {len(c.points)} runs ok)"
    else:
        blocking, why = True, "no baseline: a case that does not run cannot be gated"
    msg = (m.message or "").strip().splitlines()
    text = f" ({msg[-1][:160]})" if msg else ""
    return Verdict(case_id=m.case_id, workload=m.workload, metric="status", kind="failed",
                   blocking=blocking, baseline_runs=len(c.points),
                   message=f"status: {m.status}{text}; {why}")


def _judge_case(c: _Case, config: Config, base_branch: str,
                other_env: tuple[Point, list[str]] | None, time_on: bool) -> list[Verdict]:
    m = c.m
    if m.status != "ok":
        return [_failed_verdict(c)]
    out: list[Verdict] = []
    for metric in MEMORY_METRICS:
        if c.points:
            v = _memory_verdict(c, metric, config)
        else:
            v = _unbased_verdict(c, metric, base_branch, other_env)
        if v is None:
            continue
        if metric == "device" and m.devices:
            v = _vram_verdict(v, m)
        out.append(v)
    if time_on and c.points:
        t = _time_verdict(c, config)
        if t is not None:
            out.append(t)
    return out


# -- the check -----------------------------------------------------------------------------


def find_candidate(store: Store, *, run_id: str | None = None, commit: str | None = None,
                   root: Path) -> RunRecord:
    """The run to check: by id, else the newest run of `commit`, else of HEAD at `root`."""
    if run_id:
        return store.get_run(run_id)
    if commit is None:
        commit = git_output(root, "rev-parse", "HEAD")
        if commit is None:
            raise ConfigError(f"{root} is not inside a git repository with a commit: "
                              "pass --run ID or --commit SHA")
        what = f"the current commit {commit[:12]}"
    else:
        what = f"commit {commit}"
    ids = store.run_ids(commit=commit, limit=1)
    if not ids:
        raise StoreError(f"{store.path}: no run of {what}; record one with `memtrack run` "
                         "first, or pass --run ID")
    return store.get_run(ids[0])


def check(store: Store, config: Config, *, run_id: str | None = None,
          commit: str | None = None, base_branch: str | None = None,
          root: Path | None = None) -> CheckResult:
    """Judge a candidate run against its baseline and the config's budgets."""
    root = root or config.root
    run = find_candidate(store, run_id=run_id, commit=commit, root=root)
    base = base_branch or config.base_branch
    finder = BaselineFinder(store, run, base, root, config.baseline_runs)
    notes = list(finder.notes)
    if run.git.dirty:
        notes.append("the candidate was measured with uncommitted changes (dirty tree)")
    changes, note = budget_changes(config, root, finder.merge_base or base)
    if note:
        notes.append(note)
    env_cache: dict[str | None, Environment | None] = {}
    verdicts: list[Verdict] = []
    time_on = config.time_regression != "off"
    for m in run.measurements:
        points = finder.points(m.case_id) if finder.seen_anywhere(m.case_id) else []
        budgets = budgets_for(config.budgets, m, run.environment)
        touched = [ch for ch in changes if ch.workload in (m.workload, m.case_id)]
        ok_runs = sum(p.status == "ok" for p in points)
        c = _Case(m, points, budgets, ok_runs < config.min_baseline_runs, touched)
        other = None
        if not points and finder.seen_anywhere(m.case_id):
            p = finder.other_env(m.case_id)
            if p is not None:
                if p.env_id not in env_cache:
                    env_cache[p.env_id] = _environment(store, p.env_id)
                old = env_cache[p.env_id]
                other = (p, environment_diff(old, run.environment) if old else [])
        for metric, b in budgets.items():
            if metric_value(m, metric) is None and m.status == "ok":
                notes.append(f"{m.case_id}: budget on {metric} ({format_size(b.limit_bytes)}) "
                             f"not checked: {metric} was not measured on this run")
        verdicts.extend(_judge_case(c, config, base, other, time_on))
    if not run.measurements:
        raise StoreError(f"run {run.run_id} has no measurements to check")
    missing = sorted((finder.newest_cases() or set()) - {m.case_id for m in run.measurements})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        notes.append(f"{len(missing)} case(s) of the newest baseline run are not in this run "
                     f"(removed, or left out with -k/--shard), so not checked: {shown}")
    return CheckResult(
        run_id=run.run_id, commit=run.git.commit, branch=run.git.branch,
        started_at=run.started_at, fingerprint=run.environment.fingerprint, base_branch=base,
        merge_base=finder.merge_base, baseline_mode=finder.mode, verdicts=tuple(verdicts),
        budget_changes=tuple(changes), notes=tuple(notes),
        checked_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


_VERDICT_COLUMNS = ("run_id", "case_id", "workload", "metric", "kind", "blocking", "provisional",
                    "baseline_value", "spread", "factor", "floor", "threshold",
                    "candidate_value", "delta", "delta_pct", "budget_bytes", "budget_reason",
                    "baseline_runs", "message", "checked_at")


def save_verdicts(store: Store, result: CheckResult) -> int:
    """Record the verdicts (replacing earlier ones of the same run) in one transaction."""
    if store.readonly:
        raise StoreError(f"{store.path}: opened read-only, cannot record verdicts")
    rows = [
        (result.run_id, v.case_id, v.workload, v.metric, v.kind, int(v.blocking),
         int(v.provisional), v.baseline_value, v.spread, v.factor, v.floor, v.threshold,
         v.candidate_value, v.delta, v.delta_pct, v.budget_bytes, v.budget_reason,
         v.baseline_runs, v.message, result.checked_at)
        for v in result.verdicts
    ]
    conn = store.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("delete from verdicts where run_id = ?", [result.run_id])
        conn.executemany(
            f"insert into verdicts ({', '.join(_VERDICT_COLUMNS)}) "
            f"values ({', '.join('?' for _ in _VERDICT_COLUMNS)})", rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(rows)


__all__ = [
    "FLOORS",
    "KINDS",
    "MEMORY_METRICS",
    "BaselineFinder",
    "BudgetChange",
    "CheckResult",
    "Point",
    "Verdict",
    "baseline_spread",
    "budget_changes",
    "budgets_for",
    "check",
    "default_budget_metric",
    "environment_diff",
    "find_candidate",
    "git_output",
    "headroom",
    "iso_epoch",
    "metric_value",
    "repeat_spread",
    "save_verdicts",
    "suggest_budget",
]
