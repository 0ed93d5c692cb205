"""The figures of every case scripts/gpu-check.sh recorded, and the CUDA path's invariants,
into a summary file. Exit status 1 when an invariant fails.

    python scripts/gpu_summary.py RECORDS [SUMMARY [DATABASE ...]]

RECORDS holds the run and check records (run-1.json, ...); SUMMARY defaults to
RECORDS/summary.txt. Each DATABASE given is read back whole, every value of every run
checked as `memtrack show` reads it: a run the store would call damaged fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MiB = 2**20
RUNS = ("run-1", "run-2", "run-grow", "run-probe")
MISSED = "the sampler missed a spike"


def mib(v: int | None) -> str:
    return "-" if v is None else f"{v / MiB:.1f}"


def invariant(m: dict[str, Any], dev: dict[str, Any]) -> str | None:
    """Why a case's figures break the CUDA path's invariants, or None.

    Workspace is never below 0; allocated <= reserved always; reserved <= device (the
    process's sampled peak) where the sampler saw the peak. `short_spike` is built so that a
    10 ms sampler misses its spike: it is judged by its note, which must say so whenever its
    samples missed it, and then it has no workspace figure."""
    workspace = m.get("workspace_bytes")
    if workspace is not None and workspace < 0:
        return f"workspace {workspace} is below 0"
    if m["status"] != "ok" or m["device"] != "cuda":
        return None
    a, r, d = m["peak_allocated_bytes"], m["peak_reserved_bytes"], dev.get("peak_process_bytes")
    if m["workload"] == "short_spike":
        caught = dev.get("memory_pass_peak_bytes")
        said = any(MISSED in n for n in m["notes"])
        if a is None or r is None or a > r:
            return f"allocated <= reserved fails: {a} {r}"
        if not said and (caught is None or caught < r):
            return f"its spike was missed ({caught} < {r}) and no note says so"
        if caught is not None and caught < r and workspace is not None:
            return f"its spike was missed ({caught} < {r}), yet it has a workspace: {workspace}"
        return None
    if None in (a, r, d) or not a <= r <= d:
        return f"allocated <= reserved <= device fails: {a} {r} {d}"
    return None


def summarise(out: Path) -> tuple[list[str], list[str]]:
    lines: list[str] = []
    bad: list[str] = []
    for name in RUNS:
        path = out / f"{name}.json"
        if not path.exists():
            bad.append(f"{name}: no record")
            continue
        run = json.loads(path.read_text())
        env = run["environment"]
        gpus = ", ".join(f"{g['name']} ({mib(g['total_bytes'])} MiB)" for g in env["gpus"])
        lines.append(
            f"# {name}: {run['started_at']} driver {env['driver']} CUDA {env['cuda_runtime']} "
            f"torch {env['torch']} allocator {env.get('allocator_backend')} GPUs {gpus} "
            f"visible {env.get('visible_uuids')}"
        )
        lines.append(
            "case | status | allocated | reserved | device (process) | device (memory pass) | "
            "workspace | MiB; step median s | case duration s | samples | achieved interval "
            "ms | view"
        )
        for m in run["measurements"]:
            devs = m["devices"]
            dev = max(devs, key=lambda d: d["peak_process_bytes"] or 0) if devs else {}
            interval = m.get("sample_interval_s")
            lines.append(
                f"{m['case_id']} | {m['status']} | {mib(m['peak_allocated_bytes'])} | "
                f"{mib(m['peak_reserved_bytes'])} | {mib(dev.get('peak_process_bytes'))} | "
                f"{mib(dev.get('memory_pass_peak_bytes'))} | {mib(m['workspace_bytes'])} | "
                f"{m['time_median_s']} | {m['duration_s']} | {dev.get('samples')} | "
                f"{'-' if interval is None else f'{interval * 1e3:.1f}'} | "
                f"{m['device_view']} {dev.get('process_view')} {m['device_view_note'] or ''}"
            )
            lines.extend(f"    note: {note}" for note in m["notes"])
            why = invariant(m, dev)
            if why:
                bad.append(f"{name} {m['case_id']}: {why}")
            if name == "run-probe" and m["workload"] == "forced_oom":
                if m["status"] != "oom" or not m.get("num_ooms"):
                    bad.append(f"forced_oom: {m['status']} num_ooms={m.get('num_ooms')}")
    for name in ("check-2", "check-grow"):
        path = out / f"{name}.json"
        if path.exists():
            verdicts = json.loads(path.read_text())["verdicts"]
            blocking = sorted({(v["case_id"], v["metric"]) for v in verdicts if v["blocking"]})
            lines.append(f"# {name}: blocking {blocking}")
            if name == "check-grow":
                metrics = {metric for _, metric in blocking}
                if not {"allocated", "reserved", "device"} <= metrics:
                    bad.append(
                        f"check-grow: 64 MiB should block allocated, reserved, device: {metrics}"
                    )
    return lines, bad


def read_back(db: Path) -> tuple[list[str], list[str]]:
    """Every run of `db` read as `memtrack show` reads it, every value checked: the line
    saying how many, and what failed."""
    from memtrack.errors import MemtrackError
    from memtrack.store.database import Store

    if not db.exists():
        return [], [f"{db.name}: no database"]
    try:
        with Store.open(db, readonly=True) as store:
            ids = store.run_ids()
            for run_id in ids:
                store.get_run(run_id)
    except MemtrackError as exc:
        return [], [f"{db.name}: {exc}"]
    return [f"# {db.name}: {len(ids)} run(s) read back whole"], []


def main(argv: list[str]) -> int:
    records = Path(argv[0])
    summary = Path(argv[1]) if len(argv) > 1 else records / "summary.txt"
    lines, bad = summarise(records)
    for db in argv[2:]:
        read, failed = read_back(Path(db))
        lines += read
        bad += failed
    lines += [f"INVARIANT FAILED: {b}" for b in bad]
    summary.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
