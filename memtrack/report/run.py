"""Terminal views of recorded runs (rich renderables; the caller prints them)."""

from __future__ import annotations

from statistics import median
from typing import Any

from rich.markup import escape
from rich.table import Table

from memtrack.escape import terminal_text
from memtrack.judge.load import Load
from memtrack.records import Measurement, RunRecord, device_peak, host_peak, host_step, metrics
from memtrack.units import format_seconds, format_size
from memtrack.workload.registry import short_case_labels


def _t(text: object) -> str:
    """Recorded text for a rich cell or title: its markup and control characters inert."""
    return escape(terminal_text(text))


VIEWS = ("framework peak", "reserved", "device", "host peak")
"""Each view's peak, as the run and history tables head them."""


def run_table(run: RunRecord) -> Table:
    """One line per case: status and each view's peak."""
    t = Table(title=_t(f"run {run.run_id[:12]} · {_where(run)}"), title_justify="left")
    for col in ("case", "status", *VIEWS, "weights", "median time"):
        t.add_column(col, justify="left" if col in ("case", "status") else "right")
    loads = any(m.load_duration_s is not None for m in run.measurements)
    if loads:  # only where a workload marks its loading step
        t.add_column("loading peak", justify="right")
    labels = short_case_labels(m.case_id for m in run.measurements)
    for m in run.measurements:
        t.add_row(
            _t(labels[m.case_id]),
            _status(m),
            format_size(m.peak_allocated_bytes),
            format_size(m.peak_reserved_bytes),
            format_size(device_peak(m)),
            format_size(m.host_peak_rss_bytes),
            format_size(m.weights_bytes),
            format_seconds(m.time_median_s),
            *([format_size(m.load_host_peak_rss_bytes)] if loads else []),
        )
    return t


def is_estimate_run(run: RunRecord) -> bool:
    """Every case of the run is an estimate (`memtrack estimate`), none measured."""
    return bool(run.measurements) and all(m.kind == "estimate" for m in run.measurements)


def estimate_table(run: RunRecord) -> Table:
    """One line per case: the estimated peak and its parts, or why it could not be made."""
    m0 = run.measurements[0] if run.measurements else None
    target = f" · for {m0.device}" if m0 else ""
    t = Table(
        title=_t(
            f"estimate run {run.run_id[:12]} · {_where(run)}{target} · fake tensors, not measured"
        ),
        title_justify="left",
    )
    parts = ("weights", "caches", "gradients", "optimizer state", "intermediates")
    t.add_column("case")
    t.add_column("status")
    for col in ("estimated peak", "kernel scratch", *parts):
        t.add_column(col, justify="right")
    labels = short_case_labels(m.case_id for m in run.measurements)
    for m in run.measurements:
        sizes = map(format_size, (getattr(m, metrics.COMPONENTS[p]) for p in parts))
        scratch = "excluded" if m.scratch_bytes is None else format_size(m.scratch_bytes)
        t.add_row(
            _t(labels[m.case_id]),
            _status(m),
            format_size(m.peak_allocated_bytes),
            "-" if m.peak_allocated_bytes is None else scratch,
            *sizes,
        )
    return t


def estimate_view(run: RunRecord) -> list[Any]:
    """The estimate table, then one line per case: what its figure holds (the kernel
    scratch and the measured run it came from, or that it excludes scratch), or why it
    could not be estimated."""
    from rich.text import Text

    out: list[Any] = [estimate_table(run)]
    for m in run.measurements:
        if m.status == "ok" and m.peak_allocated_bytes is not None:
            out.append(Text(terminal_text(f"scratch · {m.case_id} · {scratch_words(m)}")))
        if m.status != "ok":
            out.append(
                Text(
                    terminal_text(f"{m.status} · {m.case_id} · {m.message or 'no message'}"),
                    style="red",
                )
            )
    return out


def _where(run: RunRecord) -> str:
    g, e = run.git, run.environment
    commit = (g.commit or "no commit")[:12] + (" (dirty)" if g.dirty else "")
    gpu = e.gpus[0].name if e.gpus else "CPU"
    return f"{commit} on {g.branch or '?'} · {gpu} · torch {e.torch}"


def _status(m: Measurement) -> str:
    return m.status if m.status == "ok" else f"[red]{_t(m.status)}[/red]"


def loading_line(m: Measurement) -> str:
    """The loading step's figures in one line: host peak, reads, writes, disk space, time."""

    def size(x: int | None) -> str:
        return "not measured" if x is None else format_size(x)

    return (
        f"host peak {size(m.load_host_peak_rss_bytes)}, read {size(m.load_rchar_bytes)} "
        f"({size(m.load_read_bytes)} from storage), written {size(m.load_wchar_bytes)} "
        f"({size(m.load_write_bytes)} to storage), files on disk {size(m.disk_bytes)}, "
        f"{format_seconds(m.load_duration_s)}"
    )


def history_table(case: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=f"history of {_t(case)} (newest first)", title_justify="left")
    for col in ("time", "run", "commit", "branch", "case", "status", *VIEWS, "median time"):
        t.add_column(col)
    labels = short_case_labels(r["case_id"] for r in rows)
    for r in rows:
        t.add_row(
            (r["started_at"] or "")[:19],
            r["run_id"][:12],
            (r["git_commit"] or "-")[:10],
            _t(r["git_branch"] or "-"),
            _t(labels[r["case_id"]]),
            _t(r["status"]),
            format_size(r["peak_allocated_bytes"]),
            format_size(r["peak_reserved_bytes"]),
            format_size(r["device_peak_bytes"]),
            format_size(r["host_peak_rss_bytes"]),
            format_seconds(r["time_median_s"]),
        )
    return t


def cudnn_version(value: str | None) -> str | None:
    """cuDNN's version number as torch reports it (92400) in dotted form (9.24.0).

    cuDNN 9 encodes major*10000 + minor*100 + patch; earlier ones major*1000 + minor*100 +
    patch (8907 is 8.9.7). Anything else is shown as given.
    """
    if value is None or not value.isdigit():
        return value
    n = int(value)
    major, rest = divmod(n, 10000) if n >= 90000 else divmod(n, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def run_detail(
    run: RunRecord,
    estimates: dict[str, dict[str, Any]] | None = None,
    measured: dict[str, dict[str, Any]] | None = None,
) -> list[Any]:
    """The run's context, then one block per case. `estimates` (case id -> the store's
    `latest_estimates` row) puts each measured case's estimate beside its framework peak;
    `measured` (case id -> the store's `latest_measured` row) each estimated case's
    measured figure beside the estimate."""
    estimates = estimates or {}
    measured = measured or {}
    blocks: list[Any] = [
        _context(run),
        estimate_table(run) if is_estimate_run(run) else run_table(run),
    ]
    for m in run.measurements:
        other = (measured if m.kind == "estimate" else estimates).get(m.case_id)
        blocks.append(_case_detail(m, other, run.run_id))
        if m.ranks:
            blocks.append(rank_table(m))
    return blocks


def _context(run: RunRecord) -> Table:
    """Where the run ran: its commit, CI event and environment."""
    g, ci, e = run.git, run.ci, run.environment
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for k, v in (
        ("run", run.run_id),
        ("started", run.started_at),
        ("commit", g.commit),
        ("branch", g.branch),
        ("subject", g.subject),
        ("dirty", g.dirty),
        ("merge-base", g.merge_base),
        ("git notes", "; ".join(g.notes) or None),
        ("ci", f"{ci.event} #{ci.pr_number}" if ci.pr_number else ci.event),
        ("gpus", ", ".join(f"{x.name} ({format_size(x.total_bytes)})" for x in e.gpus) or "none"),
        (
            "driver / CUDA / cuDNN",
            " / ".join(v or "none" for v in (e.driver, e.cuda_runtime, cudnn_version(e.cudnn))),
        ),
        ("torch / python", f"{e.torch or 'none'} / {e.python or 'none'}"),
        ("fingerprint", e.fingerprint),
        ("variables", ", ".join(f"{k}={v}" for k, v in e.env_vars.items()) or None),
    ):
        head.add_row(k, "-" if v is None else _t(v))
    return head


def _case_detail(m: Measurement, other: dict[str, Any] | None, run_id: str) -> Table:
    """One case: its params, counts, message, estimate (or, of an estimate, the measured
    figure `other`), breakdown, host, loading, timing pass, device view, quality and
    notes."""
    title = m.case_id + (" (estimate, not measured)" if m.kind == "estimate" else "")
    t = Table(title=_t(title), title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("params", _t(", ".join(f"{k}={v}" for k, v in m.params.items())))
    t.add_row("counts", f"seed {m.seed}, warm-up {m.warmup}, repeats {m.repeats}")
    if m.message:
        t.add_row("message", _t(m.message))
    if m.traceback and m.status != "ok":
        t.add_row("traceback", "\n".join(_t(line) for line in traceback_tail(m.traceback)))
    if m.kind == "estimate":
        t.add_row(
            "estimated peak",
            _t(
                f"{format_size(m.peak_allocated_bytes)} for "
                f"{m.device}, {m.dtype} "
                f"({m.framework or 'fake tensors'}): {scratch_words(m)}"
            ),
        )
        if other is not None:
            t.add_row("measured", _t(_measured_line(m, other)))
    elif other is not None:
        t.add_row("estimate", _t(_estimate_line(m, other, run_id)))
    # On a GPU the gap is the device's beyond the allocator (context, libraries); on
    # the CPU it is the process's RSS beyond live tensors: the interpreter and the
    # libraries, not a workspace of the model's.
    gap = (
        "workspace/runtime"
        if m.device.startswith("cuda")
        else "host RSS beyond tensors (interpreter, libraries)"
    )
    for name, column in metrics.COMPONENTS.items():
        value = getattr(m, column)
        if name == "unattributed" and not value:
            continue  # only where the allocator held more than the tracker saw
        t.add_row(gap if name == "workspace" else name, format_size(value))
        if name == "caches" and m.largest_cache_bytes:
            t.add_row("largest cache", format_size(m.largest_cache_bytes))
    if m.kind != "estimate":
        t.add_row("host peak", _t(host_line(m)))
        if m.load_duration_s is not None:
            t.add_row("loading", _t(loading_line(m)))
        for label, line in iteration_rows(m):
            t.add_row(label, _t(line))
        if any(s.grouping == "pair" for s in m.sites):
            t.add_row("where at the peak", _t(sites_line(m)))
        if m.host_tree_peak_rss_bytes is not None:
            t.add_row("process tree", _t(tree_line(m)))
        t.add_row(
            "device view",
            _t(m.device_view or f"absent: {m.device_view_note or 'no reason recorded'}"),
        )
        # the allocator's figures beside the device view, on a GPU
        for name in metrics.ALLOCATOR_VIEWS:
            if (shown := metrics.value(m, name)) is not None:
                t.add_row(metrics.METRICS[name].label, format_size(shown))
    if m.quality_status is not None:
        t.add_row(
            "quality",
            _t(f"{m.quality_status} against {m.quality_reference}: {m.quality_message or '-'}"),
        )
    for note in m.notes:
        t.add_row("note", _t(note))
    return t


TRACEBACK_LINES = 30
"""The lines of a failed case's traceback `memtrack show` prints: its end, where the error
is (`--json` has the whole, as recorded: redacted, its last 20,000 characters)."""


def traceback_tail(text: str) -> list[str]:
    lines = text.rstrip().splitlines()
    if len(lines) <= TRACEBACK_LINES:
        return lines
    cut = len(lines) - TRACEBACK_LINES
    return [f"({cut} earlier lines: --json has them)", *lines[cut:]]


def scratch_words(m: Measurement) -> str:
    """What an estimate's figure holds: its tensors, and the kernel scratch added from a
    measured run, or that it excludes scratch."""
    if m.peak_allocated_bytes is None:
        return "no figure"
    if m.scratch_bytes is None:
        return "tensors only, excludes kernel scratch (no measured run to calibrate it)"
    return (
        f"{format_size(m.peak_allocated_bytes - m.scratch_bytes)} of tensors + "
        f"{format_size(m.scratch_bytes)} kernel scratch from measured run "
        f"{(m.scratch_run_id or 'unknown')[:12]}"
    )


def _measured_line(m: Measurement, found: dict[str, Any]) -> str:
    """An estimate's drift: the latest measured figure of its case (the store's
    `latest_measured` row) and the estimate's ratio to it, and the fake tensors' alone."""
    peak, measured = m.peak_allocated_bytes, found["peak_allocated_bytes"]
    commit = (found["git_commit"] or "no commit")[:12]
    line = f"{format_size(measured)} (run {found['run_id'][:12]} of {commit})"
    if peak is not None and measured:
        line += f"; estimate / measured {peak / measured:.3f}"
        if m.scratch_bytes is not None:
            line += f" (tensors alone {(peak - m.scratch_bytes) / measured:.3f})"
    return line


def _estimate_line(m: Measurement, est: dict[str, Any], run_id: str) -> str:
    """A measured case's estimate (the store's `latest_estimates` row) beside its peak: how
    far it is from the measured figure (its drift), and the tensors' alone where it was
    calibrated; calibrated from this very run, it matches by construction, and says so."""
    peak, measured = est["peak_allocated_bytes"], m.peak_allocated_bytes
    scratch = est.get("scratch_bytes")
    commit = (est["git_commit"] or "no commit")[:12]
    line = f"{format_size(peak)} (estimate run {est['run_id'][:12]} of {commit}"
    if scratch is None:
        line += ", tensors only: excludes kernel scratch)"
    else:
        line += (
            f", {format_size(peak - scratch)} of tensors + {format_size(scratch)} kernel "
            f"scratch from run {str(est.get('scratch_run_id') or 'unknown')[:12]})"
        )
    line += f"; measured framework peak {format_size(measured)}"
    if measured:
        line += f", estimate / measured {peak / measured:.3f}"
        if scratch is not None:
            line += f" (tensors alone {(peak - scratch) / measured:.3f})"
            if est.get("scratch_run_id") == run_id:
                line += ", calibrated from this run"
    return line


def host_line(m: Measurement) -> str:
    """The host peak RSS, and how the gated `host` and `host_step` figures come from it, so
    that the figure `check` names can be found in the one `show` prints."""
    source = f" ({m.host_peak_source})" if m.host_peak_source else ""
    line = f"{format_size(m.host_peak_rss_bytes)}{source}"
    gated = host_peak(m)
    if gated is not None:
        line += (
            f" = {format_size(m.host_file_rss_bytes)} file-backed (shared libraries) + "
            f"{format_size(gated)} gated as `host`"
        )
    step = host_step(m)
    if step is not None:
        line += f"; the step's growth {format_size(step)}, gated as `host_step`"
    return line


def tree_line(m: Measurement) -> str:
    """The host peak of the case's process tree, how it was measured, and each process's
    part at it (the case's own, its data-loader workers'), as `host_tree` gates it."""
    figure = metrics.value(m, "host_tree")
    line = f"{format_size(m.host_tree_peak_rss_bytes)} ({m.host_tree_source or 'unknown'})"
    if figure is not None:
        line += ", gated as `host_tree`"
    parts = [f"{s.key} {format_size(s.size_bytes)}" for s in m.sites if s.grouping == "process"]
    return line + (f": {', '.join(parts)}" if parts else "")


SITES_SHOWN = 5


def sites_line(m: Measurement) -> str:
    """The largest sites at the peak (module at file:function, line), largest first: where
    the peak's memory was allocated."""
    pairs = sorted((s for s in m.sites if s.grouping == "pair"), key=lambda s: -s.size_bytes)
    shown = [
        f"{format_size(s.size_bytes)} {s.key}" + (f" (line {s.line})" if s.line else "")
        for s in pairs[:SITES_SHOWN]
    ]
    more = len(pairs) - SITES_SHOWN
    return "; ".join(shown) + (f"; {more} more in the record" if more > 0 else "")


def iteration_rows(m: Measurement) -> list[tuple[str, str]]:
    """What each measured iteration retained, the timing pass's CPU (and device) time and
    the machine's load meanwhile, and a concurrent case's bounds: one line each, where
    recorded."""
    rows = []
    if m.retained_samples:
        rows.append(("retained per iteration", ", ".join(map(format_size, m.retained_samples))))
    timing = []
    if m.iteration_cpu_times_s:
        timing.append(f"CPU time median {format_seconds(median(m.iteration_cpu_times_s))}")
    if m.iteration_device_times_s:
        timing.append(f"device time median {format_seconds(median(m.iteration_device_times_s))}")
    if m.iteration_instructions:
        timing.append(f"instructions median {median(m.iteration_instructions):,.0f}")
    load = machine_load(m)
    if load:
        timing.append(f"machine: {load}")
    if timing:
        rows.append(("timing pass", "; ".join(timing)))
    if m.instructions_note and not m.iteration_instructions:
        rows.append(("instructions", f"not counted: {m.instructions_note}"))
    if m.pair_ref and m.pair_times_s and m.pair_ref_times_s:
        rows.append(
            (
                "paired timing",
                f"{len(m.pair_times_s)} rounds against {m.pair_ref[:12]}: {m.pair_figure} "
                f"median {format_seconds(median(m.pair_times_s))} here, "
                f"{format_seconds(median(m.pair_ref_times_s))} there",
            )
        )
    if m.session_peak_bytes is not None and m.sessions_sum_bytes is not None:
        n = m.params.get("concurrency", "N")
        rows.append(
            (
                "sessions",
                f"one alone {format_size(m.session_peak_bytes)}, sum of {n} "
                f"{format_size(m.sessions_sum_bytes)}, measured peak "
                f"{format_size(m.peak_allocated_bytes)}",
            )
        )
    return rows


def machine_load(m: Measurement) -> str:
    """The machine's load during the timing pass in a few words ('' where none was read)."""
    return Load.of(m).describe()


def rank_table(m: Measurement) -> Table:
    """A multi-rank case: one row per rank, each on its own device (devices do not pool)."""
    t = Table(title=f"{_t(m.case_id)} · per rank", title_justify="left")
    for col in (
        "rank",
        "device",
        "status",
        "framework peak",
        "reserved",
        "requested",
        "device (NVML)",
        "host peak",
        "median time",
    ):
        t.add_column(col, justify="left" if col in ("device", "status") else "right")
    nvml = {f"cuda:{d.index}": d.peak_process_bytes for d in m.devices}
    for r in m.ranks:
        t.add_row(
            str(r.rank),
            _t(r.device),
            r.status if r.status == "ok" else f"[red]{_t(r.status)}[/red]: {_t(r.message or '')}",
            format_size(r.peak_allocated_bytes),
            format_size(r.peak_reserved_bytes),
            format_size(r.peak_requested_bytes),
            format_size(nvml.get(r.device)),
            format_size(r.host_peak_rss_bytes),
            format_seconds(r.time_median_s),
        )
    return t
