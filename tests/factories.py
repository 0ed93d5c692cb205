"""Builders for records and git repositories, shared by tests and benchmark scripts.

Synthetic records stand in for measured ones only where a test is about storing,
comparing or showing figures, never about measuring them.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from memtrack.records import (
    CIInfo,
    DeviceMeasurement,
    Environment,
    GitInfo,
    GpuInfo,
    Measurement,
    RunRecord,
)

MiB = 2**20
GiB = 2**30
HOST_FILE = 90 * MiB
"""File-backed resident pages of a worker (libraries) in made-up measurements."""

CPU_ENV = Environment(
    fingerprint="cpu-env-1",
    torch="2.13.0+cpu",
    python="3.11.7",
    os="Linux",
    cpu="test cpu",
    cpu_count=2,
    host_ram_bytes=24 * GiB,
)
GPU_ENV = Environment(
    fingerprint="h200-env-1",
    gpus=(GpuInfo(0, "NVIDIA H200", "GPU-0000", 141 * GiB, "9.0", "disabled"),),
    driver="580.65",
    cuda_runtime="13.0",
    cudnn="91200",
    torch="2.14.1+cu130",
    python="3.11.7",
    os="Linux",
    cpu="test cpu",
    cpu_count=16,
    host_ram_bytes=128 * GiB,
)


def make_measurement(
    workload: str = "decoder",
    params: dict[str, Any] | None = None,
    *,
    peak: int = 100 * MiB,
    status: str = "ok",
    device: str = "cpu",
    reserved: int | None = None,
    device_peak: int | None = None,
    host: int = 400 * MiB,
    host_step: int = 10 * MiB,
    time_s: float = 0.01,
    samples: tuple[int, ...] | None = None,
    times: tuple[float, ...] | None = None,
    **fields: Any,
) -> Measurement:
    from memtrack.workload import case_id

    params = params if params is not None else {"batch": 1}
    devices: tuple[DeviceMeasurement, ...] = ()
    if device_peak is not None:
        devices = (
            DeviceMeasurement(
                0,
                "GPU-0000",
                "NVIDIA H200",
                141 * GiB,
                600 * MiB,
                device_peak + 600 * MiB,
                device_peak,
                "pid",
                peak,
                reserved,
                100,
            ),
        )
    return Measurement(
        workload=workload,
        case_id=case_id(workload, params),
        params=params,
        seed=0,
        device=device,
        dtype="float32",
        warmup=1,
        repeats=3,
        status=status,
        framework="memtracker" if device == "cpu" else "cuda-caching-allocator",
        peak_allocated_bytes=peak if status == "ok" else None,
        peak_reserved_bytes=reserved,
        persistent_bytes=peak // 4,
        allocated_samples=samples if samples is not None else (peak, peak, peak),
        # `host` is the metric: peak RSS less the file-backed pages (libraries)
        host_peak_rss_bytes=host + HOST_FILE,
        host_step_peak_rss_bytes=host + HOST_FILE,
        host_setup_rss_bytes=host + HOST_FILE - host_step,
        host_file_rss_bytes=HOST_FILE,
        host_peak_source="vmhwm",
        devices=devices,
        device_view="nvml" if devices else None,
        weights_bytes=peak // 4,
        intermediates_bytes=peak - peak // 4,
        iteration_times_s=times if times is not None else (time_s, time_s, time_s),
        time_median_s=time_s,
        time_p95_s=time_s,
        time_min_s=time_s,
        duration_s=2.0,
        **fields,
    )


def make_run(
    measurements: list[Measurement] | tuple[Measurement, ...],
    *,
    commit: str | None = None,
    branch: str = "main",
    started_at: str = "2026-01-01T00:00:00+00:00",
    env: Environment = CPU_ENV,
    merge_base: str | None = None,
    subject: str = "a commit",
    run_id: str | None = None,
    ci: CIInfo | None = None,
) -> RunRecord:
    commit = commit or uuid.uuid4().hex + uuid.uuid4().hex[:8]
    return RunRecord(
        run_id=run_id or uuid.uuid4().hex,
        started_at=started_at,
        finished_at=started_at,
        git=GitInfo(
            commit=commit,
            branch=branch,
            subject=subject,
            dirty=False,
            base_branch="main",
            merge_base=merge_base or commit,
        ),
        ci=ci or CIInfo(),
        environment=env,
        suite_hash="suite",
        config_path=None,
        measurements=tuple(measurements),
    )


def with_env(run: RunRecord, env: Environment) -> RunRecord:
    return replace(run, environment=env)


GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` with a fixed identity; return stdout stripped."""
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    )
    return out.stdout.strip()


def init_repo(repo: Path, branch: str = "main") -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", branch)
    return repo


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


# -- a realistic history, from real reruns of the shipped suite -----------------------------

RERUNS = Path(__file__).parent / "data" / "reruns.json.gz"
"""Real runs of the shipped example suite on one unchanged commit (how they were made:
its "how" field; scripts/bench_check.py --reruns N --save FILE makes another)."""


def read_reruns(path: Path = RERUNS) -> list[RunRecord]:
    import gzip
    import json

    from memtrack.records import run_from_dict

    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return [run_from_dict(r, where=f"{path}: record {i}") for i, r in enumerate(data["records"])]

