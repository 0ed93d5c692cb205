"""Multi-rank cases: every rank started at once as `torchrun` would, and one record made of
the ranks' own figures.

Each rank is its own worker process, measuring its own device. Devices do not pool, so the
case's framework peaks are the largest per-device peak over its ranks (the breakdown is
that of the rank with the largest allocated peak), and the NVML view keeps each GPU apart.
The host's memory does pool: host figures are summed over the ranks. If one rank fails, the
case fails with that rank's message and the others are ended at once: they would otherwise
wait for it in a collective until the timeout.
"""

from __future__ import annotations

import dataclasses
import socket
import statistics
import tempfile
from pathlib import Path
from typing import Any

from memtrack.config import Config
from memtrack.measure.launcher import CaseOutcome, launch, new_spec, worker_env
from memtrack.measure.outcome import case_status, to_measurement
from memtrack.measure.sampler import start_sampler
from memtrack.measure.timeout import contended
from memtrack.records import Measurement, RankMeasurement
from memtrack.records.breakdown import with_breakdown
from memtrack.records.redact import redact
from memtrack.worker.protocol import Result, Spec
from memtrack.workload.registry import Case

LOOPBACK = "127.0.0.1"
PORT_RETRIES = 1
"""A free port can be taken by another process between choosing it and rank 0 listening on
it: the case is started once more on a new port when that happened."""


def free_port() -> int:
    """A port nothing listens on now, on the loopback interface (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The worker's environment: torchrun's variables, all on the loopback interface."""
    env = worker_env()
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
    )
    # gloo and NCCL otherwise pick an interface from the host name, which may not reach
    # the others (or anything); a user's own choice is kept.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    return env


def snapshot_paths(path: Path, world: int) -> list[Path]:
    """Where each rank of a `memtrack snapshot` writes its own file (each is created with
    O_EXCL: one path for all would fail every rank but the first): rank 0 `path` itself,
    rank r `<stem>.rank<r><suffix>` beside it."""
    return [path, *(path.with_name(f"{path.stem}.rank{r}{path.suffix}") for r in range(1, world))]


def run_ranks(
    config: Config,
    case: Case,
    device: str,
    visible_uuids: tuple[str, ...],
    world: int,
    timeout_s: float,
    *,
    snapshot_path: Path | None = None,
) -> tuple[Measurement, str | None]:
    """Measure a case of `world` ranks within `timeout_s`: one Measurement with a
    RankMeasurement per rank, and why the machine was contended where a rank timed out on a
    busy one (measure.timeout)."""
    warmup, repeats, _ = config.settings_for(case.workload)
    snapshots = snapshot_paths(snapshot_path, world) if snapshot_path else [None] * world
    for attempt in range(PORT_RETRIES + 1):
        with tempfile.TemporaryDirectory(prefix="memtrack-") as tmp:
            specs = []
            for r in range(world):
                scratch = Path(tmp) / f"scratch-{r}"  # each rank's own, removed with tmp
                scratch.mkdir(mode=0o700)
                specs.append(
                    new_spec(
                        config,
                        case,
                        device,
                        warmup,
                        repeats,
                        Path(tmp) / f"result-{r}.json",
                        scratch_dir=scratch,
                        ranks=world,
                        snapshot_path=snapshots[r],
                    )
                )
            port = free_port()
            sampler = start_sampler(device, config.nvml_interval_s, visible_uuids)
            outcomes, exited = launch(
                specs,
                timeout_s,
                sampler=sampler,
                envs=[rank_env(r, world, port) for r in range(world)],
            )
        if attempt < PORT_RETRIES and any(_port_taken(o) for o in outcomes):
            continue
        break
    m = to_case(case, specs[0], outcomes, exited, config.nvml_interval_s, timeout_s)
    return m, next((why for o in outcomes if (why := contended(o))), None)


def _port_taken(outcome: CaseOutcome) -> bool:
    text = (outcome.result.message or "").lower()
    return "eaddrinuse" in text or "address already in use" in text


# -- one record of the ranks' figures --------------------------------------------------------


def to_case(
    case: Case,
    spec: Spec,
    outcomes: list[CaseOutcome],
    exited: dict[int, float],
    interval_s: float,
    timeout_s: float,
) -> Measurement:
    """The case's Measurement: its status is the first failing rank's, its figures the
    largest per-device peaks (host figures summed), and one RankMeasurement per rank."""
    statuses = [_rank_status(r, o, exited, timeout_s) for r, o in enumerate(outcomes)]
    failed = [r for r in exited if statuses[r][0] != "ok"]
    timed_out = [r for r, o in enumerate(outcomes) if o.timed_out]
    status, message, traceback = "ok", None, None
    if failed:
        first = min(failed, key=lambda r: _failed_at(outcomes[r], exited[r]))
        status, message = statuses[first][0], f"rank {first}: {statuses[first][1]}"
        traceback = outcomes[first].result.traceback
        for r, (st, _) in enumerate(statuses):
            if r not in exited and st != "ok":
                statuses[r] = ("crashed", f"ended by memtrack after rank {first} failed")
    elif timed_out:
        status = "timeout"
        message = f"rank {timed_out[0]}: {statuses[timed_out[0]][1]}"
    elif any(st != "ok" for st, _ in statuses):  # ended without a result, yet exited 'ok'
        first = next(r for r, (st, _) in enumerate(statuses) if st != "ok")
        status, message = statuses[first][0], f"rank {first}: {statuses[first][1]}"
    data = {
        **merge_figures([o.result.to_dict() for o in outcomes]),
        "status": status,
        "message": message,
        "traceback": traceback,
    }
    merged = dataclasses.replace(
        outcomes[0], result=Result(**data), returncode=0, timed_out=False, stderr_tail=""
    )
    m = to_measurement(case, spec, merged, interval_s, timeout_s)
    ranks = tuple(_rank(r, o, statuses[r], spec.device) for r, o in enumerate(outcomes))
    m = dataclasses.replace(m, ranks=ranks)
    # a peak from samples: each rank's exact peak (less its file-backed pages, as the
    # samples leave them out) is a bound too (their sum is not)
    own = [
        r.host_peak_rss_bytes - r.host_file_rss_bytes
        for r in ranks
        if r.host_peak_rss_bytes is not None and r.host_file_rss_bytes is not None
    ]
    tree = max([merged.tree_peak_bytes or 0, *own])
    m = dataclasses.replace(
        m,
        host_tree_peak_rss_bytes=tree or None,
        host_tree_source=merged.tree_source if tree else None,
    )
    return _rank_breakdown(m)


def _rank_status(
    r: int, o: CaseOutcome, exited: dict[int, float], timeout_s: float
) -> tuple[str, str | None]:
    if o.timed_out or r in exited:
        return case_status(o, timeout_s)
    # ended by memtrack because another rank failed: unless it had finished, it did not end
    # by itself (the caller says so)
    return ("ok", None) if o.result.status == "ok" else ("crashed", None)


def _failed_at(o: CaseOutcome, exited_at: float) -> float:
    """When a rank failed: its own last write (its error), else when it was seen to exit."""
    written = o.result.written_at
    if o.result.status != "running" and written is not None:
        return written
    return exited_at


def _rank(r: int, o: CaseOutcome, status: tuple[str, str | None], device: str) -> RankMeasurement:
    d = o.result.to_dict()

    def figure(key: str) -> Any:
        value = d.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return RankMeasurement(
        rank=r,
        device=f"cuda:{r}" if device == "cuda" else device,
        status=status[0],
        message=redact(status[1]),
        **{
            k: figure(k)
            for k in (
                "peak_allocated_bytes",
                "peak_reserved_bytes",
                "peak_requested_bytes",
                "persistent_bytes",
                "host_peak_rss_bytes",
                "host_step_peak_rss_bytes",
                "host_setup_rss_bytes",
                "host_file_rss_bytes",
            )
        },
        time_median_s=d.get("time_median_s") if isinstance(d.get("time_median_s"), float) else None,
    )


_PER_DEVICE = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_requested_bytes")
_OWN = (
    "status",
    "message",
    "traceback",
    "written_at",
    "memory_window",
    "cuda_devices",
    "notes",
    "phase",
)
"""A rank's result keys that say how that rank ended: the case's are decided apart."""
_SUMMED_HOST = (
    "host_peak_rss_bytes",
    "host_step_peak_rss_bytes",
    "host_setup_rss_bytes",
    "host_file_rss_bytes",
)


def _ints(datas: list[dict[str, Any]], key: str) -> list[int]:
    return [
        d[key] for d in datas if isinstance(d.get(key), int) and not isinstance(d.get(key), bool)
    ]


def merge_figures(datas: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' result data as one worker's: per-device figures the largest over ranks,
    host figures summed (the ranks share the host), iteration times the slowest rank's."""
    with_peak = [d for d in datas if _ints([d], "peak_allocated_bytes")]
    top = max(with_peak, key=lambda d: d["peak_allocated_bytes"]) if with_peak else datas[0]
    # any figure not merged below is that of the rank with the largest allocated peak
    out: dict[str, Any] = {k: v for k, v in top.items() if k not in _OWN}
    for key in _PER_DEVICE:
        values = _ints(datas, key)
        out[key] = max(values) if values else None
    for key in ("num_alloc_retries", "num_ooms"):
        values = _ints(datas, key)
        out[key] = sum(values) if values else None
    for key in _SUMMED_HOST:
        values = _ints(datas, key)
        out[key] = sum(values) if len(values) == len(datas) else None  # a part would mislead
    times = [d.get("iteration_times_s") for d in datas]
    if all(
        isinstance(t, (list, tuple)) and t and len(t) == len(datas[0]["iteration_times_s"])
        for t in times
    ):
        # a step of collectives ends when its slowest rank does
        slowest = [max(ts) for ts in zip(*times, strict=True)]
        ordered = sorted(slowest)
        out.update(
            iteration_times_s=tuple(slowest),
            time_median_s=statistics.median(slowest),
            time_p95_s=ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))],
            time_min_s=ordered[0],
        )
    devices: dict[Any, dict[str, Any]] = {}
    for d in datas:
        for dev in d.get("cuda_devices", []):
            key = dev.get("uuid") or dev.get("index")
            seen = devices.setdefault(key, dict(dev))
            for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
                if isinstance(dev.get(k), int):
                    seen[k] = max(seen.get(k) or 0, dev[k])
    if devices:
        out["cuda_devices"] = tuple(sorted(devices.values(), key=lambda x: x.get("index", 0)))
    notes: list[str] = []
    for r, d in enumerate(datas):
        for note in d.get("notes", []):
            shared = all(note in other.get("notes", []) for other in datas)
            text = note if shared else f"rank {r}: {note}"
            if text not in notes:
                notes.append(text)
    out["notes"] = tuple(notes)
    # the least advanced rank's phase: where the case as a whole was
    out["phase"] = min(
        (str(d.get("phase", "start")) for d in datas),
        key=lambda p: _PHASES.index(p) if p in _PHASES else 0,
    )
    return out


_PHASES = [
    "start",
    "setup",
    "warmup",
    "timing",
    "memory",
    "breakdown",
    "quality",
    "sessions",
    "done",
]


def _rank_breakdown(m: Measurement) -> Measurement:
    """The breakdown of the rank with the largest allocated peak, so that its parts add up
    to the headline peak with that rank's own reserved, device and host figures."""
    top = max(
        (r for r in m.ranks if r.peak_allocated_bytes is not None),
        key=lambda r: r.peak_allocated_bytes or 0,
        default=None,
    )
    if top is None:
        return m
    index = int(top.device.split(":")[1]) if top.device.startswith("cuda:") else None
    own = dataclasses.replace(
        m,
        peak_allocated_bytes=top.peak_allocated_bytes,
        peak_reserved_bytes=top.peak_reserved_bytes,
        host_step_peak_rss_bytes=top.host_step_peak_rss_bytes,
        devices=tuple(d for d in m.devices if d.index == index),
    )
    b = with_breakdown(own)
    parts = (
        "weights_bytes",
        "inputs_bytes",
        "intermediates_bytes",
        "caches_bytes",
        "training_state_bytes",
        "workspace_bytes",
        "gradients_bytes",
        "optimizer_state_bytes",
        "unattributed_bytes",
    )
    note = (
        f"{len(m.ranks)} ranks: framework figures are the largest per-device peak, the "
        f"breakdown rank {top.rank}'s ({top.device}); host figures are summed over ranks"
    )
    # b's notes: m's, with the breakdown's own said again for this rank's figures
    return dataclasses.replace(m, notes=(*b.notes, note), **{k: getattr(b, k) for k in parts})


__all__ = [
    "LOOPBACK",
    "free_port",
    "merge_figures",
    "rank_env",
    "run_ranks",
    "snapshot_paths",
    "to_case",
]
