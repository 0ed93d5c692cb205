"""What the dashboard decides: which budget applies, a case's status, where a series moved.

Pure functions over the plain rows that `queries` returns; no Streamlit, no SQL.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memtrack.config import HEADROOM_FACTOR, Budget
from memtrack.judge import bisect, noise
from memtrack.judge.budgets import choose_budgets
from memtrack.records import Environment, GpuInfo, Site, environment_diff, metrics
from memtrack.records.validate import SITE_GROUPINGS
from memtrack.units import format_size
from memtrack.workload.registry import short_case_labels  # noqa: F401 (the views use it from here)

MiB = 2**20

METRIC_COLUMNS = metrics.COLUMNS
METRIC_LABELS = {name: m.label for name, m in metrics.METRICS.items()}
SHORT_LABELS = metrics.SHORT
"""Names for narrow table columns; METRIC_LABELS says what each one is."""
CHART_METRICS = metrics.CHARTED
"""The views drawn on a history chart (requested sits within a few KiB of allocated)."""

NEAR_BUDGET = 0.9
"""A case using this share of its budget or more is flagged before it breaks."""

STATUSES = ("failed", "over budget", "regression", "near budget", "ok")
"""Most urgent first; the overview sorts by this order."""


def metric_value(row: dict[str, Any], metric: str) -> int | None:
    """A row's figure for a metric; None where it was not measured (or, for the host
    metrics, recorded before they existed)."""
    value = row.get(METRIC_COLUMNS[metric])
    return None if value is None else int(value)


def sites_of(row: dict[str, Any]) -> tuple[Site, ...]:
    """A measurement row's sites at the peak (probes.sites), as records; an entry of the
    wrong shape (a damaged row) is left out, never shown."""
    out = []
    for s in row.get("sites") or ():
        if not isinstance(s, dict):
            continue
        key, size, line = s.get("key"), s.get("size_bytes"), s.get("line")
        if s.get("grouping") in SITE_GROUPINGS and isinstance(key, str) and isinstance(size, int):
            out.append(Site(s["grouping"], key, size, line if isinstance(line, int) else None))
    return tuple(out)


def samples_of(row: dict[str, Any]) -> list[int]:
    """A row's allocated peak of each measured iteration ([] where not read or recorded)."""
    raw = row.get("allocated_samples")
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [int(x) for x in found if isinstance(x, (int, float))] if isinstance(found, list) else []


def default_metric(row: dict[str, Any]) -> str:
    """The view a budget without a metric applies to: device where measured, else reserved,
    else allocated (as the gate reads it)."""
    return metrics.default_budget_metric(lambda name: metric_value(row, name))


@dataclass(frozen=True)
class CaseBudget:
    """A budget as it applies to one case."""

    metric: str
    """The view it limits (a budget without a metric: the case's default view)."""
    limit_bytes: int
    reason: str | None
    source: str
    """'config' (the repository's budgets today) or 'verdict' (what the gate recorded)."""


def gpu_names(env: dict[str, Any] | None) -> list[str]:
    return [g.get("name") for g in (env or {}).get("gpus") or [] if g.get("name")]


def budgets_for(
    budgets: Iterable[Budget], row: dict[str, Any], gpus: Sequence[str]
) -> list[CaseBudget]:
    """The config budgets that apply to a measurement, one per view, chosen by the gate's own
    rule (memtrack.judge.budgets.choose_budgets)."""
    chosen = choose_budgets(
        budgets,
        row["workload"],
        row["case_id"],
        row.get("device") == "cpu",
        gpus,
        default_metric(row),
    )
    return [CaseBudget(metric, b.limit_bytes, b.reason, "config") for metric, b in chosen.items()]


def verdict_budgets(verdicts: Iterable[dict[str, Any]]) -> list[CaseBudget]:
    """Budgets the gate recorded in its verdicts (one per metric)."""
    out: dict[str, CaseBudget] = {}
    for v in verdicts:
        if v.get("budget_bytes") is not None and v.get("metric") in METRIC_COLUMNS:
            out[v["metric"]] = CaseBudget(
                v["metric"], int(v["budget_bytes"]), v.get("budget_reason"), "verdict"
            )
    return list(out.values())


@dataclass(frozen=True)
class CaseStatus:
    """A case's latest state, as the overview shows it."""

    status: str
    """One of STATUSES."""
    metric: str
    """The view its figure and budget are about."""
    value: int | None
    budget: CaseBudget | None
    used: float | None
    """value / budget; None without a budget or a figure."""
    note: str
    """Why: the failure's message, or the blocking verdict's."""

    @property
    def margin(self) -> int | None:
        if self.budget is None or self.value is None:
            return None
        return self.budget.limit_bytes - self.value


def case_status(
    row: dict[str, Any],
    budgets: Sequence[CaseBudget],
    verdicts: Sequence[dict[str, Any]],
    still_open: Sequence[dict[str, Any]] = (),
) -> CaseStatus:
    """Status of one measurement: failed > over budget > regression > near budget > ok.
    `verdicts` are about this run; `still_open` are the base branch's regressions not yet
    fixed or accepted (see open_dicts), which keep the case a regression on later runs,
    shown on the view that regressed."""
    chosen: CaseBudget | None = None
    used: float | None = None
    metric = default_metric(row)
    for b in budgets:
        m = b.metric
        value = metric_value(row, m)
        share = value / b.limit_bytes if value is not None and b.limit_bytes > 0 else None
        if chosen is None or (share is not None and (used is None or share > used)):
            chosen, used, metric = b, share, m
    value = metric_value(row, metric)
    kinds = {v.get("kind"): v for v in verdicts}
    if row.get("status") != "ok" or "failed" in kinds:
        note = row.get("message") or (kinds.get("failed") or {}).get("message") or ""
        return CaseStatus(
            "failed", metric, value, chosen, used, f"{row.get('status')}: {note}".rstrip(": ")
        )
    if (used is not None and used > 1) or "over_budget" in kinds:
        v = kinds.get("over_budget")
        if v is not None and chosen is None and v.get("budget_bytes"):
            if v.get("metric") in METRIC_COLUMNS:
                metric = v["metric"]
                value = metric_value(row, metric)
            chosen = CaseBudget(metric, int(v["budget_bytes"]), v.get("budget_reason"), "verdict")
            used = value / chosen.limit_bytes if value is not None and chosen.limit_bytes else None
        note = v.get("message") if v else ""
        return CaseStatus("over budget", metric, value, chosen, used, note or "")
    if "regression" in kinds or "leak" in kinds or still_open:
        # The view that regressed, not the one nearest its budget.
        v = kinds.get("regression") or kinds.get("leak") or still_open[0]
        if v.get("metric") in METRIC_COLUMNS:
            metric = v["metric"]
            value = metric_value(row, metric)
            chosen = next((b for b in budgets if b.metric == metric), None)
            used = (
                value / chosen.limit_bytes
                if chosen is not None and value is not None and chosen.limit_bytes > 0
                else None
            )
        if "regression" in kinds or "leak" in kinds:
            return CaseStatus("regression", metric, value, chosen, used, v.get("message") or "")
        return CaseStatus(
            "regression",
            metric,
            value,
            chosen,
            used,
            f"not fixed or accepted: {v.get('message') or ''}".rstrip(": "),
        )
    notes = "; ".join(
        f"{k}: {kinds[k].get('accepted_reason') or kinds[k].get('message') or ''}"
        for k in ("accepted", "noisy")
        if k in kinds
    )
    if used is not None and used >= NEAR_BUDGET:
        return CaseStatus("near budget", metric, value, chosen, used, notes)
    return CaseStatus("ok", metric, value, chosen, used, notes)


@dataclass(frozen=True)
class Step:
    """A shift of a series' level past its headroom."""

    row: dict[str, Any]
    """The first run at the new level: the one whose commit moved the series."""
    previous: dict[str, Any]
    """The last run at the old level."""
    metric: str
    before: int
    """Median level before the step."""
    after: int
    room: int
    """The headroom the move exceeded: max(factor x noise, the metric's floor)."""
    fixed_by: dict[str, Any] | None = None
    """For a step up: the first run of a later step back down to the old level or below."""

    @property
    def delta(self) -> int:
        return self.after - self.before

    @property
    def fraction(self) -> float:
        return self.delta / self.before if self.before else float("inf")

    @property
    def spans_commits(self) -> bool:
        """Whether commits with no run lie between the last run at the old level and the
        first at the new one: the first one's parent is not the last one's commit."""
        parent, previous = self.row.get("git_parent"), self.previous.get("git_commit")
        return bool(parent and previous and parent != previous)

    def bisect_command(self, case_id: str) -> str | None:
        """`memtrack bisect` of a step that spans several commits, else None."""
        if not self.spans_commits:
            return None
        return bisect.command(
            case_id, self.previous["git_commit"], self.row["git_commit"], self.metric
        )

    def describe(self) -> str:
        pct = f" ({self.fraction:+.1%})" if self.before else ""
        return f"{'+' if self.delta > 0 else ''}{format_size(self.delta)}{pct}"


def steps(
    rows_newest_first: Sequence[dict[str, Any]], metric: str, factor: float = HEADROOM_FACTOR
) -> list[Step]:
    """Where the series moved, newest first, found as the gate finds steps on the base
    branch (memtrack.judge.noise). Each environment is its own series: a move between
    environments is an environment change, not a step. Points without the figure (failed
    runs) are skipped. A step up that a later step brings back is marked fixed."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows_newest_first:
        groups.setdefault(r.get("fingerprint"), []).append(r)
    found = [s for rows in groups.values() for s in _steps(rows, metric, factor)]
    found.sort(key=lambda s: s.row.get("started_at") or "", reverse=True)
    return found


def _steps(rows_newest_first: Sequence[dict[str, Any]], metric: str, factor: float) -> list[Step]:
    points = [
        (r, v) for r in reversed(rows_newest_first) if (v := metric_value(r, metric)) is not None
    ]
    values = [float(v) for _, v in points]
    if len(values) < 2:
        return []
    out: list[Step] = []
    # the allocated view's iterations: how far one run already moves (a concurrent peak)
    samples = [samples_of(r) for r, _ in points]
    within = noise.within_runs(samples) if metric == "allocated" else 0.0
    floor = metrics.floor(metric, statistics.median(values))
    found = noise.levels(values, factor, floor, within=within)
    starts, room = list(found.starts), found.room
    bounds = [0, *starts, len(values)]
    for k, i in enumerate(starts, start=1):
        # Each level is its own segment: a step and a later fix are two steps.
        before = int(statistics.median(values[bounds[k - 1] : i]))
        after = int(statistics.median(values[i : bounds[k + 1]]))
        out.append(Step(points[i][0], points[i - 1][0], metric, before, after, int(room)))
    fixed: list[Step] = []
    for k, s in enumerate(out):
        fix = next(
            (
                d
                for d in out[k + 1 :]
                if s.delta > 0 and d.delta < 0 and d.after <= s.before + s.room
            ),
            None,
        )
        fixed.append(
            s
            if fix is None
            else Step(s.row, s.previous, s.metric, s.before, s.after, s.room, fix.row)
        )
    return fixed


def _size(delta: float | None, before: float | None = None) -> str:
    """'+8.00 MiB (+4.4%)'; '' without a delta."""
    if delta is None:
        return ""
    pct = f" ({delta / before:+.1%})" if before else ""
    return f"{'+' if delta >= 0 else '-'}{format_size(abs(int(delta)))}{pct}"


@dataclass(frozen=True)
class GateRegression:
    """A regression the gate found on the base branch (a `regression` verdict of a check of
    a base-branch run), and what ended it: a later run of its environment back within its
    threshold, or a later acceptance. Found by the gate when it happened, it is shown even
    where the series' steps do not tell it: a merge reverted after one run is a step and
    its revert to the gate, and one odd run to a step finder that reads the whole window."""

    verdict: dict[str, Any]
    row: dict[str, Any]
    """Its run: the first at the regressed level."""
    fixed_by: dict[str, Any] | None = None
    """The first later base run of its environment back within its threshold."""
    accepted_by: dict[str, Any] | None = None
    """The run of a later `accepted` verdict of its case and metric (a reviewed trailer)."""

    @property
    def metric(self) -> str:
        return str(self.verdict["metric"])

    def describe(self) -> str:
        """'+8.00 MiB (+4.4%)'."""
        return _size(self.verdict.get("delta"), self.verdict.get("baseline_value"))


def gate_regressions(
    rows_newest_first: Sequence[dict[str, Any]],
    verdicts: Iterable[dict[str, Any]],
    base_branch: str,
) -> list[GateRegression]:
    """The regressions the gate found on the base branch's runs among these rows, newest
    first, each with the run that fixed it or the one that accepted it, as the rows and
    verdicts show them (memtrack.judge.gather.baseline.open_regressions reads the same rule from
    the store, whatever the age)."""
    base = [r for r in reversed(rows_newest_first) if r.get("git_branch") == base_branch]
    at = {r["run_id"]: i for i, r in enumerate(base)}
    found = list(verdicts)
    out = []
    for v in found:
        i = at.get(v.get("run_id"))
        if (
            i is None
            or v.get("context") != "base"
            or v.get("kind") != "regression"
            or v.get("metric") not in METRIC_COLUMNS
            or v.get("threshold") is None
        ):
            continue
        row, metric = base[i], v["metric"]
        fixed = next(
            (
                r
                for r in base[i + 1 :]
                if r.get("fingerprint") == row.get("fingerprint")
                and r.get("status") == "ok"
                and (x := metric_value(r, metric)) is not None
                and x <= v["threshold"]
            ),
            None,
        )
        accepted = next(
            (
                base[j]
                for a in found
                if a.get("context") == "base"
                and a.get("kind") == "accepted"
                and a.get("metric") == metric
                and a.get("case_id") == v.get("case_id")
                and (j := at.get(a.get("run_id"), -1)) > i
            ),
            None,
        )
        out.append(GateRegression(v, row, fixed, accepted))
    out.sort(key=lambda g: g.row.get("started_at") or "", reverse=True)
    return out


def accepted_reasons(verdicts: Iterable[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(run id, metric) -> the reason of an `accepted` verdict recorded there."""
    return {
        (v["run_id"], v["metric"]): v.get("accepted_reason") or "accepted"
        for v in verdicts
        if v.get("kind") == "accepted"
    }


def open_dicts(found: Iterable[Any]) -> list[dict[str, Any]]:
    """The gate's open regressions of the base branch (memtrack.judge.verdict's
    OpenRegression, whatever their age) as plain dicts for the views, each with its line."""
    out = []
    for o in found:
        d = dataclasses.asdict(o)
        d["message"] = o.describe()
        out.append(d)
    return out


_VERSION_KEYS = (
    ("gpu", "GPU"),
    ("driver", "driver"),
    ("cuda_runtime", "CUDA"),
    ("cudnn", "cuDNN"),
    ("nccl", "NCCL"),
    ("torch", "torch"),
    ("python", "Python"),
)


def _env_fields(env: dict[str, Any] | None) -> dict[str, Any]:
    env = env or {}
    return {**env, "gpu": ", ".join(gpu_names(env)) or "CPU"}


def env_label(env: dict[str, Any] | None) -> str:
    """'NVIDIA H200 · driver 580.65 · CUDA 13.0 · torch 2.14.1' (what is known)."""
    e = _env_fields(env)
    parts = [e["gpu"]]
    for key, name in _VERSION_KEYS[1:6]:
        if e.get(key):
            parts.append(f"{name} {e[key]}")
    return " · ".join(parts)


def env_short(env: dict[str, Any] | None) -> str:
    """'NVIDIA H200 · torch 2.14.1' : enough to tell the environments of one chart apart."""
    e = _env_fields(env)
    return " · ".join(
        x
        for x in (
            e["gpu"],
            f"torch {e['torch']}" if e.get("torch") else "",
            f"driver {e['driver']}" if e.get("driver") else "",
        )
        if x
    )


def env_changes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """The versions that differ, as the gate says them ('torch 2.13.0 → 2.14.1'); the
    fingerprint where nothing listed differs."""
    a, b = environment(old), environment(new)
    out = [
        f"{what} {change.replace(' -> ', ' → ')}"
        for what, _, change in (d.partition(": ") for d in environment_diff(a, b))
    ]
    return out or [f"fingerprint {a.fingerprint} → {b.fingerprint}"]


def environment(env: dict[str, Any] | None) -> Environment:
    """An environment row (queries.environments) as the record it was stored from."""
    env = env or {}
    fields = [f.name for f in dataclasses.fields(GpuInfo)]
    found: list[dict[str, Any]] = [g for g in env.get("gpus") or () if isinstance(g, dict)]
    gpus = tuple(GpuInfo(*(g.get(k) for k in fields)) for g in found)  # type: ignore[arg-type]
    return Environment(
        fingerprint=str(env.get("fingerprint") or ""),
        gpus=gpus,
        driver=env.get("driver"),
        cuda_runtime=env.get("cuda_runtime"),
        cudnn=env.get("cudnn"),
        nccl=env.get("nccl"),
        torch=env.get("torch"),
        python=env.get("python"),
        os=env.get("os"),
        packages=dict(env.get("packages") or {}),
        env_vars=dict(env.get("env_vars") or {}),
    )


def headroom_band(verdict: dict[str, Any]) -> tuple[int, int] | None:
    """(baseline, threshold) of a verdict: the gate's threshold is baseline + headroom,
    the justified band a candidate may move in. None without that arithmetic."""
    base, threshold = verdict.get("baseline_value"), verdict.get("threshold")
    if base is None or threshold is None or threshold < base:
        return None
    return int(base), int(threshold)


def describe_status(s: CaseStatus) -> str:
    """One line for a reviewer: the figure against its budget."""
    label = METRIC_LABELS.get(s.metric, s.metric)
    if s.status == "failed":
        return s.note or "failed"
    if s.budget is not None and s.value is not None:
        margin = s.margin or 0
        where = f"{format_size(-margin)} over" if margin < 0 else f"{format_size(margin)} left"
        line = (
            f"{format_size(s.value)} of {format_size(s.budget.limit_bytes)} {label} "
            f"({s.used:.0%}, {where})"
        )
    else:
        line = f"{format_size(s.value)} {label}, no budget"
    return f"{line}; {s.note}" if s.note else line


# -- the Plan page -------------------------------------------------------------------------


def case_params(case: str) -> tuple[str, dict[str, str]]:
    """'serve[concurrency=4,max_len=256]' -> ('serve', {'concurrency': '4', ...}): the
    values as the case id spells them; an id that does not parse has no params."""
    name, bracket, rest = case.partition("[")
    if not bracket or not rest.endswith("]"):
        return name, {}
    params: dict[str, str] = {}
    for item in rest[:-1].split(","):
        k, eq, v = item.partition("=")
        if not eq:
            return name, {}
        params[k] = v
    return name, params


def number(text: str) -> int | float | None:
    """A param value read as a number; None where it is not one."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def sweepable(cases: Iterable[str]) -> dict[str, list[str]]:
    """Per workload, its numeric params that take two or more values among these cases."""
    seen: dict[str, dict[str, set[str]]] = {}
    for c in cases:
        name, params = case_params(c)
        for k, v in params.items():
            seen.setdefault(name, {}).setdefault(k, set()).add(v)
    out: dict[str, list[str]] = {}
    for name, values in sorted(seen.items()):
        found = [
            k for k, vs in values.items() if len(vs) >= 2 and all(number(v) is not None for v in vs)
        ]
        if found:
            out[name] = sorted(found)
    return out


def newest_sweep(rows: Iterable[dict[str, Any]], param: str) -> dict[str, Any] | None:
    """The newest commit that measured two or more values of `param` (the other params and
    the environment alike): each value's newest ok figure in the view that must fit (device
    where every point has it, else reserved, else allocated). None where no commit did."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        _, params = case_params(r["case_id"])
        x = number(params.pop(param, ""))
        if x is None:
            continue
        key = (r.get("git_commit"), r.get("fingerprint"), tuple(sorted(params.items())))
        g = groups.setdefault(key, {"rows": {}, "newest": "", "others": params})
        kept = g["rows"].get(x)
        if kept is None or (r.get("started_at") or "") > (kept.get("started_at") or ""):
            g["rows"][x] = r
        g["newest"] = max(g["newest"], r.get("started_at") or "")
    for key, g in sorted(groups.items(), key=lambda kv: kv[1]["newest"], reverse=True):
        if len(g["rows"]) < 2:
            continue
        chosen = list(g["rows"].values())
        metric = next(
            (
                m
                for m in metrics.DEFAULT_BUDGET
                if all(metric_value(r, m) is not None for r in chosen)
            ),
            None,
        )
        if metric is None:
            continue
        points = sorted((x, metric_value(r, metric) or 0) for x, r in g["rows"].items())
        newest = max(chosen, key=lambda r: r.get("started_at") or "")
        return {
            "commit": key[0],
            "fingerprint": key[1],
            "others": g["others"],
            "metric": metric,
            "points": points,
            "device": newest.get("device"),
            "subject": newest.get("git_subject"),
            "branch": newest.get("git_branch"),
            "started_at": g["newest"],
        }
    return None
