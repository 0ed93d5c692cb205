"""Tests as cases of one run: a test's outcome and figures as a `Measurement` (case id = its
node id), and the run of every measured test, for the store's `record_run`."""

from __future__ import annotations

import hashlib
import json
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrack.probes.span import SpanFigures
from memtrack.records import CIInfo, DeviceMeasurement, Environment, GitInfo, Measurement, RunRecord
from memtrack.records.validate import MAX_TEXT

FIGURES = "memtrack"
"""The attribute of a measured test's reports holding its figures and verdict (plain data)."""
MAX_CASE_ID = 1000
"""Characters of a case id made from a node id; a longer one is cut and ends in its hash."""
MAX_MESSAGE = 2000
MAX_TRACEBACK = 20_000
SHARED = (
    "measured in the pytest process, beside other tests: allocated is the test's own and "
    "gated; reserved, device and host are the process's (what earlier tests left cached is "
    "reused, so they move with the order of the tests): kept in this note, not gated "
    "(--memtrack-forked measures each test alone and gates them)"
)
FORKED = "measured in its own process, forked from pytest's before the test"


def test_id(nodeid: str, rootdir: Path, top: Path | None) -> str:
    """A test's identity in its repository: its file's path relative to the repository's
    root (git's top level), then its name and parameters as pytest writes them. pytest's
    node id is relative to its rootdir, which moves with the arguments and ini files of
    each invocation; the repository's root does not. A file outside the repository (or no
    repository) keeps the node id."""
    path, sep, rest = nodeid.partition("::")
    if top is None or not path:
        return nodeid
    try:
        rel = (rootdir / path).resolve().relative_to(top.resolve())
    except (ValueError, OSError):
        return nodeid
    return rel.as_posix() + sep + rest


def case_id_of(nodeid: str) -> str:
    """The case id of a test: its node id, kept as it is where a record can hold it. A
    character no record or terminal should carry (a control, format or bidi character, a
    surrogate, an unassigned code point) is written as Python escapes it (`\\x1b`,
    `\\u202e`); an id over MAX_CASE_ID characters is cut and ends in '~' and the first 12
    hex digits of the sha256 of the node id. Deterministic: a test keeps its series."""
    out = "".join(
        ascii(ch)[1:-1] if unicodedata.category(ch).startswith("C") else ch for ch in nodeid
    )
    if len(out) > MAX_CASE_ID:
        digest = hashlib.sha256(nodeid.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        out = f"{out[: MAX_CASE_ID - 13]}~{digest}"
    return out or "test"


@dataclass(frozen=True)
class Outcome:
    """What became of one measured test, gathered from its reports."""

    nodeid: str
    status: str
    """ok | oom | error | crashed: 'ok' where the test ran to its end (passed, or failed only
    over its memory budget, whose figures stand); 'error' for a failure or an error."""
    figures: SpanFigures | None
    duration_s: float | None = None
    message: str | None = None
    traceback: str | None = None
    forked: bool = False
    budget_note: str | None = None
    budget: dict[str, Any] | None = None
    """The test's `memory_budget` mark: limit_bytes, metric, device."""


def _cut(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def measurement(t: Outcome) -> Measurement:
    """One test as a case: workload and case id its node id, no params."""
    f = t.figures
    cid = case_id_of(t.nodeid)
    notes = [FORKED if t.forked else SHARED]
    if t.budget_note:
        notes.append(t.budget_note)
    if f is not None:
        notes.extend(f.notes)
    shared = f is not None and not t.forked
    if f is not None and shared:
        notes.append(_process_wide(f))
    devices = tuple(
        DeviceMeasurement(
            index=d.index,
            uuid=None,
            name=None,
            total_bytes=None,
            peak_process_bytes=None if shared else d.process_bytes,
            process_view="pid" if d.process_bytes is not None and not shared else None,
            peak_allocated_bytes=d.allocated_bytes,
            peak_reserved_bytes=None if shared else d.reserved_bytes,
        )
        for d in (f.devices if f else ())
    )
    cuda = f is not None and f.device == "cuda"
    limit, metric = _gated_budget(t.budget)
    if t.budget is not None and limit is None:
        notes.append(
            f"memory budget on {t.budget['device']} is held by pytest alone: `memtrack check` "
            "holds a test to a budget on its largest device"
        )
    elif shared and metric not in (None, "allocated"):
        limit = metric = None
        notes.append(
            "its memory budget on a process-wide figure is held by pytest alone: `memtrack "
            "check` gates a test measured beside others on allocated only"
        )
    return Measurement(
        workload=cid,
        case_id=cid,
        params={},
        seed=0,
        device=f.device if f else "cpu",
        dtype=None,
        warmup=0,
        repeats=1,
        status=t.status,
        message=_cut(t.message, MAX_MESSAGE),
        traceback=_cut(t.traceback, MAX_TRACEBACK),
        framework=None if f is None else "cuda-caching-allocator" if cuda else "cpu-allocator",
        peak_allocated_bytes=f.allocated_bytes if f else None,
        peak_reserved_bytes=f.reserved_bytes if f and not shared else None,
        allocated_samples=(f.allocated_bytes,) if f and f.allocated_bytes is not None else (),
        retained_samples=(f.retained_bytes,) if f and f.retained_bytes is not None else (),
        host_step_peak_rss_bytes=f.host_peak_rss_bytes if f and not shared else None,
        host_setup_rss_bytes=f.host_start_rss_bytes if f and not shared else None,
        host_peak_source=f.host_source if f and not shared else None,
        device_view="nvml" if any(d.peak_process_bytes is not None for d in devices) else None,
        devices=devices,
        duration_s=t.duration_s,
        notes=tuple(_cut(n, MAX_TEXT) or "" for n in notes),
        budget_bytes=limit,
        budget_metric=metric,
    )


def _process_wide(f: SpanFigures) -> str:
    """The process-wide figures of a test measured beside others, said, not gated."""
    from memtrack.units import format_size

    def size(n: int | None) -> str:
        return format_size(n) if n is not None else "-"

    return (
        f"process-wide (not gated): reserved {size(f.reserved_bytes)}, device "
        f"{size(f.device_process_bytes)}, host rise {size(f.host_rise_bytes)} (peak RSS "
        f"{size(f.host_peak_rss_bytes)} from {size(f.host_start_rss_bytes)})"
    )


GATED_VIEW = {"allocated": "allocated", "reserved": "reserved", "device": "device"}
"""A budget mark's metric as the gate's (plugin.budget.VIEWS): its `host` (the test's rise
above its start) is recorded as the step's host growth, `host_step`."""


def _gated_budget(budget: dict[str, Any] | None) -> tuple[int | None, str | None]:
    """The limit and gated metric `memtrack check` holds the test to; (None, None) for no
    budget, or one on one device of several (`cuda:N`: the record keeps the largest)."""
    if budget is None or ":" in (budget.get("device") or ""):
        return None, None
    return int(budget["limit_bytes"]), GATED_VIEW.get(budget["metric"], "host_step")


def suite_hash(case_ids: Iterable[str]) -> str:
    """Changes when the set of measured tests changes."""
    payload = json.dumps(sorted(case_ids)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(payload).hexdigest()[:16]


def make_run(
    outcomes: list[Outcome],
    *,
    started_at: str,
    finished_at: str,
    git: GitInfo,
    ci: CIInfo,
    environment: Environment,
    config_path: str | None,
    selection: tuple[str, ...] = (),
) -> RunRecord:
    """The run of every measured test, in the order they ended; a test measured twice (a
    rerun plugin) keeps its last outcome."""
    last: dict[str, Measurement] = {}
    for t in outcomes:
        m = measurement(t)
        last.pop(m.case_id, None)
        last[m.case_id] = m
    return RunRecord(
        run_id=uuid.uuid4().hex,
        started_at=started_at,
        finished_at=finished_at,
        git=git,
        ci=ci,
        environment=environment,
        suite_hash=suite_hash(last),
        config_path=config_path,
        measurements=tuple(last.values()),
        selection=selection,
    )


def selection_of(option: Any, args: Iterable[str]) -> tuple[str, ...]:
    """What a pytest session was limited to beyond whole files: its `-k` and `-m`
    expressions, the node ids it was given, what it deselected, and a last-failed rerun."""
    out = [f"-k {option.keyword}"] if getattr(option, "keyword", "") else []
    out += [f"-m {option.markexpr}"] if getattr(option, "markexpr", "") else []
    out += [a for a in args if "::" in a]
    out += [f"--deselect {d}" for d in getattr(option, "deselect", None) or ()]
    out += ["--lf"] if getattr(option, "lf", False) else []
    return tuple(out)


def outcome_of(nodeid: str, reports: list[Any]) -> Outcome | None:
    """A measured test's outcome from its reports (setup, call, teardown); None for a test
    that was skipped."""
    data: dict[str, Any] = {}
    figures = None
    duration = None
    status, message, trace = "ok", None, None
    for r in reports:
        extra = getattr(r, FIGURES, None) or {}
        data.update({k: v for k, v in extra.items() if v is not None})
        if r.when == "call":
            figures = figures_from(extra.get("figures"))
            duration = r.duration
        if r.skipped and r.when in ("setup", "call"):
            return None
        if r.failed and status == "ok":
            text = r.longreprtext
            if r.when == "call" and extra.get("over"):
                continue  # over its budget only: the figures stand, and say so
            status = "crashed" if extra.get("crashed") else _status_of(text)
            message = f"{r.when}: {_last(text)}"
            trace = text
    return Outcome(
        nodeid=nodeid,
        status=status,
        figures=figures,
        duration_s=duration,
        message=message,
        traceback=trace,
        forked=bool(data.get("forked")),
        budget_note=data.get("over"),
        budget=data.get("budget"),
    )


def _status_of(text: str) -> str:
    return "oom" if "OutOfMemoryError" in text or "out of memory" in text else "error"


def _last(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else lines[-1] if lines else "failed")[:500]


def figures_from(data: Any) -> SpanFigures | None:
    """Figures carried on a report (through pytest-xdist as plain data), or None."""
    return SpanFigures.from_dict(data) if isinstance(data, dict) else None


__all__ = [
    "FIGURES",
    "FORKED",
    "MAX_CASE_ID",
    "SHARED",
    "Outcome",
    "case_id_of",
    "figures_from",
    "make_run",
    "measurement",
    "outcome_of",
    "selection_of",
    "suite_hash",
    "test_id",
]
