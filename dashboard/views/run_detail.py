"""Run detail: where a run ran, each case's exact parameters, breakdown, device gap, errors."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st
from memtrack.dashboard import charts, data, model
from memtrack.dashboard.charts import MARKER_NAMES
from memtrack.dashboard.views import Context, esc, goto, plain, resolve_run, run_label, short, when

from memtrack.records import metrics, pair_parts
from memtrack.units import format_seconds, format_size


def _pick(ctx: Context) -> None:
    st.session_state["run"] = st.query_params["run"] = st.session_state["run_pick"]


def _facts(pairs: list[tuple[str, Any]]) -> None:
    """A two-column table of facts, tall enough to need no scrolling."""
    df = pd.DataFrame([{"": k, "value": "-" if v in (None, "", []) else str(v)} for k, v in pairs])
    st.dataframe(plain(df), hide_index=True, height=35 * (len(df) + 1) + 3)


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _context_tables(run: dict[str, Any]) -> None:
    env = run["environment"]
    left, right = st.columns(2)
    with left:
        st.subheader("Commit and CI")
        ci = run.get("ci_event")
        if run.get("ci_pr_number"):
            ci = f"{ci} (PR #{run['ci_pr_number']})"
        _facts(
            [
                ("run", run["run_id"]),
                ("started", when(run["started_at"])),
                ("finished", when(run["finished_at"])),
                ("commit", run["git_commit"]),
                ("branch", run["git_branch"]),
                ("subject", run["git_subject"]),
                ("committed", when(run["git_committed_at"])),
                ("dirty", None if run["git_dirty"] is None else bool(run["git_dirty"])),
                ("merge-base", run["git_merge_base"]),
                ("base branch", run["git_base_branch"]),
                ("git notes", "; ".join(run.get("git_notes") or [])),
                ("CI", ci),
                ("CI run", run.get("ci_run_url")),
                ("runner", run.get("ci_runner_name")),
                ("shard", run.get("shard")),
                ("suite hash", run.get("suite_hash")),
            ]
        )
    with right:
        st.subheader("Environment")
        gpus = ", ".join(
            f"{g.get('name')} ({format_size(g.get('total_bytes'))}, "
            f"CC {g.get('compute_capability')}, MIG {g.get('mig_mode') or '-'})"
            for g in env.get("gpus") or []
        )
        _facts(
            [
                ("GPUs", gpus or "none (CPU)"),
                ("driver", env.get("driver")),
                ("CUDA runtime", env.get("cuda_runtime")),
                ("cuDNN", env.get("cudnn")),
                ("NCCL", env.get("nccl")),
                ("torch", env.get("torch")),
                ("CUDA arch list", " ".join(env.get("torch_cuda_arch_list") or [])),
                ("Python", env.get("python")),
                ("OS", env.get("os")),
                ("CPU", f"{env.get('cpu')} ({env.get('cpu_count')} cores)"),
                ("host RAM", format_size(env.get("host_ram_bytes"))),
                ("fingerprint", env.get("fingerprint")),
            ]
        )
        extras = {
            **(env.get("packages") or {}),
            **{f"${k}": v for k, v in (env.get("env_vars") or {}).items()},
        }
        if extras:
            with st.expander("Packages and memory-relevant variables"):
                _facts(sorted(extras.items()))


def _device_gap(ms: list[dict[str, Any]]) -> None:
    st.subheader("Device vs framework")
    rows = []
    for m in ms:
        for d in m["devices"]:
            device, reserved = d.get("peak_process_bytes"), d.get("peak_reserved_bytes")
            if reserved is None:
                reserved = m.get("peak_reserved_bytes")
            rows.append(
                {
                    "case": m["case_id"],
                    "GPU": f"{d.get('index')}: {d.get('name')}",
                    "device peak (process)": format_size(device),
                    "framework reserved": format_size(reserved),
                    "gap (context, workspaces, non-torch)": format_size(
                        None if device is None or reserved is None else device - reserved
                    ),
                    "device-wide peak": format_size(d.get("peak_device_used_bytes")),
                    "used before the case": format_size(d.get("used_before_bytes")),
                    "view": d.get("process_view"),
                    "samples": d.get("samples"),
                }
            )
    if rows:
        st.dataframe(plain(pd.DataFrame(rows)), hide_index=True)
        st.caption(
            "The gap is what the framework does not see: the CUDA context, library "
            "workspaces and allocations outside PyTorch. A device peak below reserved "
            "means the sampler missed a spike."
        )
    else:
        notes = {str(m["device_view_note"]) for m in ms if m.get("device_view_note")}
        st.caption(
            "No device view in this run"
            + (f": {esc('; '.join(sorted(notes)), 1000)}." if notes else " (a CPU run).")
        )


def _delta(v: dict[str, Any]) -> str:
    d = v.get("delta")
    if d is None or v.get("metric") in ("time", "status", "quality"):
        return ""
    pct = f" ({v['delta_pct']:+.1f}%)" if v.get("delta_pct") is not None else ""
    return f" {'+' if d >= 0 else '-'}{format_size(abs(int(d)))}{pct}"


def _banner(ctx: Context, run: dict[str, Any], labels: dict[str, str]) -> None:
    """What the gate said about this run, first: a run that blocks says so and why; a run
    of the base branch says what it reported."""
    vs = run["verdicts"]
    blocking = [v for v in vs if v["blocking"]]
    reported = [
        v
        for v in vs
        if v.get("context") == "base" and v.get("kind") in ("regression", "over_budget", "failed")
    ]
    shown = blocking or reported
    if not shown:
        if vs:
            st.success(
                f"The gate passed this run: {len(vs)} verdicts, none blocks.",
                icon=":material/check_circle:",
            )
        return
    lines = []
    for v in shown[:6]:
        what = MARKER_NAMES.get(v["kind"], v["kind"])
        grew = f", {esc(v['component'])} grew" if v.get("component") else ""
        lines.append(
            f"- {esc(labels[v['case_id']])} · {esc(v['metric'] + _delta(v))}: **{esc(what)}**{grew}"
        )
    if len(shown) > 6:
        lines.append(f"- and {len(shown) - 6} more in the verdicts below")
    if blocking:
        st.error(
            f"**This run blocks**: {len(blocking)} blocking verdict"
            f"{'s' * (len(blocking) != 1)}\n" + "\n".join(lines),
            icon=":material/block:",
        )
    else:
        st.warning(
            f"**Reported on {esc(ctx.base_branch)}** (never blocking): {len(shown)} "
            "regression(s)\n" + "\n".join(lines),
            icon=":material/trending_up:",
        )
    mb = run.get("git_merge_base")
    if mb and mb != run.get("git_commit"):
        st.button(
            "Compare with its merge-base",
            key="rd_compare",
            on_click=goto,
            args=("Compare",),
            kwargs={"a": mb, "b": run["run_id"]},
            help=f"Every figure of this run beside the base-branch commit {esc(short(mb))} "
            "it branched from",
        )


def render(ctx: Context) -> None:
    st.title("Run detail")
    run = _choose(ctx)
    if run is None:
        return
    ms = run["measurements"]
    failed = [m for m in ms if m["status"] != "ok"]
    st.markdown(
        f"**{esc(run['git_subject'] or '(no subject)', 200)}**  \n"
        f"{esc(short(run['git_commit']))} on {esc(run['git_branch'] or '-')} · "
        f"{esc(when(run['started_at']))} · {esc(model.env_label(run['environment']))} · "
        f"{len(ms)} case{'s' * (len(ms) != 1)}" + (f" · **{len(failed)} failed**" if failed else "")
    )
    # Case ids cut to a common prefix cannot be told apart: the params that differ.
    case_labels = model.short_case_labels(
        {m["case_id"] for m in ms} | {v["case_id"] for v in run["verdicts"]}
    )
    _banner(ctx, run, case_labels)
    if ms and all(m.get("kind") == "estimate" for m in ms):
        st.info(
            "An estimate run (`memtrack estimate`, fake tensors): its figures are "
            "predicted tensor memory, not measured, and never judged."
        )
    _failures(failed)
    _context_tables(run)
    _cases(ms, case_labels)
    _breakdown(ms, case_labels)
    _sites(ms, case_labels)
    _device_gap(ms)
    if run["verdicts"]:
        _verdicts(run["verdicts"], case_labels)
    _parameters(ms)


def _choose(ctx: Context) -> dict[str, Any] | None:
    """The run the visitor asked for (an id or commit prefix, or a recent run; the newest
    by default), or None with a warning where there is none."""
    recent = data.recent_runs(ctx.db, ctx.key, repository=ctx.repository)
    labels = {r["run_id"]: run_label(r) for r in recent}
    left, right = st.columns([1, 2])
    text = left.text_input(
        "Run id or commit (a prefix will do)",
        key="run",
        bind="query-params",
        placeholder="the newest run",
    )
    run_id = resolve_run(ctx, text) if text else recent[0]["run_id"]
    right.selectbox(
        "... or a recent run",
        list(labels),
        key="run_pick",
        index=list(labels).index(run_id) if run_id in labels else None,
        format_func=lambda r: labels[r],
        on_change=_pick,
        args=(ctx,),
        placeholder="choose a recent run",
    )
    if run_id is None:
        st.warning(f"No run or commit starts with “{esc(text, 40)}”.")
        return None
    run: dict[str, Any] | None = data.run_detail(ctx.db, ctx.key, run_id, repository=ctx.repository)
    if run is None:
        st.warning(f"Run {run_id} is gone from the database.")
    return run


def _failures(failed: list[dict[str, Any]]) -> None:
    for m in failed:
        st.error(
            f"{esc(m['case_id'])} **{esc(m['status'])}**: "
            f"{esc(m.get('message') or 'no message', 500)}"
        )
        left, right = st.columns([1, 4])
        left.button(
            "Its history",
            key=f"hist_{m['id']}",
            on_click=goto,
            args=("History",),
            kwargs={"case": m["case_id"]},
            help="The case's history, where its earlier runs are",
        )
        if m.get("traceback"):
            with right.expander(f"Traceback of {esc(m['case_id'])}"):
                st.code(m["traceback"], language="text")


def _cases(ms: list[dict[str, Any]], case_labels: dict[str, str]) -> None:
    # the allocator's figures beside the device view only where a case of the run has them
    views = [
        k
        for k in metrics.METRICS
        if k not in metrics.ALLOCATOR_VIEWS or any(model.metric_value(m, k) is not None for m in ms)
    ]
    st.subheader("Cases")
    st.dataframe(
        plain(
            pd.DataFrame(
                [
                    {
                        "case": case_labels[m["case_id"]],
                        "status": m["status"],
                        "device": m["device"],
                        **{
                            model.SHORT_LABELS[k]: format_size(model.metric_value(m, k))
                            for k in views
                        },
                        "weights": format_size(m.get("weights_bytes")),
                        "alloc retries": _count(m.get("num_alloc_retries")),
                        "OOMs": _count(m.get("num_ooms")),
                        "median time": format_seconds(m.get("time_median_s")),
                        "p95 time": format_seconds(m.get("time_p95_s")),
                        "case id": m["case_id"],
                    }
                    for m in ms
                ]
            )
        ),
        hide_index=True,
    )


def _breakdown(ms: list[dict[str, Any]], case_labels: dict[str, str]) -> None:
    st.subheader("Breakdown")
    chart = charts.breakdown_chart(ms, case_labels)
    if chart is None:
        st.caption("No breakdown recorded for these cases.")
        return
    st.altair_chart(chart, width="stretch")
    st.caption(
        "The framework's peak, on its own scale: weights, the parameters and buffers; "
        "inputs, the other tensors held from setup (the input batch); "
        "caches, tagged request-sized state; gradients and optimizer state (older runs: "
        "training state, the two together); intermediates, the rest of the framework peak; "
        "unattributed, what no part explains. Beside each bar, the runtime beyond the "
        "framework, not drawn: on a GPU the device view beyond the framework's reserved "
        "memory (the CUDA context, library workspaces); on the CPU the host RSS beyond live "
        "tensors (the interpreter and its libraries, not the model's memory)."
    )


SITES_SHOWN = 10


def _sites(ms: list[dict[str, Any]], case_labels: dict[str, str]) -> None:
    """Where each case's peak memory was allocated: its largest sites, module at
    file:function."""
    found = [(m, model.sites_of(m)) for m in ms]
    found = [(m, sites) for m, sites in found if sites]
    if not found:
        return
    st.subheader("Where at the peak")
    rows = [
        {
            "case": case_labels.get(m["case_id"], m["case_id"]),
            "module": pair_parts(s.key)[0] or "-",
            "file:function": pair_parts(s.key)[1],
            "line": s.line or "",
            "alive at the peak": format_size(s.size_bytes),
        }
        for m, sites in found
        for s in sorted((s for s in sites if s.grouping == "pair"), key=lambda s: -s.size_bytes)[
            :SITES_SHOWN
        ]
    ]
    st.dataframe(plain(pd.DataFrame(rows)), hide_index=True, key="sites")
    st.caption(
        "The tensors alive at each case's peak, by the module that made them and the "
        "innermost frame of the workload's own code (a pass of its own, after the measured "
        "ones): its largest sites; `memtrack show` and `memtrack diff` list them all."
    )


def _verdicts(verdicts: list[dict[str, Any]], case_labels: dict[str, str]) -> None:
    st.subheader("Verdicts")
    order = sorted(verdicts, key=lambda v: (not v["blocking"], v.get("kind") == "ok", v["case_id"]))
    st.dataframe(
        plain(
            pd.DataFrame(
                [
                    {
                        "case": case_labels[v["case_id"]],
                        "metric": v["metric"],
                        "kind": MARKER_NAMES.get(v["kind"], v["kind"]),
                        "context": v.get("context") or "pull_request",
                        "blocking": bool(v["blocking"]),
                        "provisional": bool(v["provisional"]),
                        "message": v.get("accepted_reason") or v.get("message"),
                        "case id": v["case_id"],
                    }
                    for v in order
                ]
            )
        ),
        hide_index=True,
    )


def _parameters(ms: list[dict[str, Any]]) -> None:
    st.subheader("Exact parameters")
    for m in ms:
        with st.expander(f"{esc(m['case_id'])} · {esc(m['status'])}"):
            st.code(
                json.dumps(
                    {
                        "params": m.get("params"),
                        "seed": m.get("seed"),
                        "dtype": m.get("dtype"),
                        "device": m.get("device"),
                        "warmup": m.get("warmup"),
                        "repeats": m.get("repeats"),
                        "framework view": m.get("framework"),
                        "host peak source": m.get("host_peak_source"),
                        "device view": m.get("device_view") or m.get("device_view_note"),
                        "sample interval (s)": m.get("sample_interval_s"),
                        "categories": {
                            k: format_size(v) for k, v in (m.get("categories") or {}).items()
                        },
                        "notes": m.get("notes"),
                    },
                    indent=2,
                    default=str,
                ),
                language="json",
            )
