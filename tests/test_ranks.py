"""Multi-rank cases: one worker per rank under torch.distributed, recorded per rank and
judged by the largest per-device peak (devices do not pool)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import GiB, commit_all, git, init_repo, make_measurement

from memtrack.cli import main
from memtrack.config import Budget, load_config
from memtrack.errors import RecordError, WorkloadError
from memtrack.judge.budgets import budget_use, device_memory
from memtrack.judge.verdict import Verdict
from memtrack.measure.case import run_case
from memtrack.records import (
    DeviceMeasurement,
    RankMeasurement,
    read_json,
    run_from_dict,
    to_dict,
)
from memtrack.report.words import budget_words, details
from memtrack.store.database import Store
from memtrack.workload.registry import Case, discover, ranks_of, workload

MiB = 2**20

WORKLOADS = """\
import time

import torch
import torch.distributed as dist

import memtrack

EXTRA_FLOATS = 4 * 1024 * 1024  # 16 MiB of float32, on rank 1 only


@memtrack.workload(params={"ranks": 2})
def sharded(ctx):
    weights = torch.nn.Linear(256, 256)
    ctx.mark(weights)

    def step():
        x = weights(torch.ones(64, 256))
        if ctx.rank == 1:  # a buffer only rank 1 holds
            x = x + torch.ones(EXTRA_FLOATS).sum()
        dist.all_reduce(x)  # every rank takes part: the ranks run together
        return x.sum()

    return step


@memtrack.workload(params={"ranks": 2})
def one_fails(ctx):
    if ctx.rank == 1:
        raise RuntimeError("rank one gives up")
    time.sleep(3600)  # rank 0 would hold the case until its timeout


@memtrack.workload(params={"ranks": 2})
def both_hang(ctx):
    time.sleep(3600)


@memtrack.workload(params={"ranks": 1})
def on_cuda(ctx):
    ctx.mark()
    extra = torch.ones(16 * 1024 * 1024, device=ctx.device)  # 64 MiB

    def step():
        x = extra * 2
        dist.all_reduce(x)
        return x.sum()

    return step


@memtrack.workload(params={"ranks": 2})
def two_gpus(ctx):
    ctx.mark()
    extra = torch.ones((1 + ctx.rank) * 16 * 1024 * 1024, device=ctx.device)  # 64/128 MiB

    def step():
        x = torch.ones(1024, device=ctx.device) * extra[:1024]
        dist.all_reduce(x)
        return x.sum()

    return step
"""

CONFIG = """\
modules = ["workloads.py"]
warmup = 1
repeats = 2
timeout = "{timeout}"
"""


def _cli(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = init_repo(tmp_path_factory.mktemp("ranks"))
    (repo / "workloads.py").write_text(WORKLOADS)
    (repo / "memtrack.toml").write_text(CONFIG.format(timeout="5 min"))
    (repo / ".gitignore").write_text("data/\n__pycache__/\n")
    commit_all(repo, "a sharded workload")
    git(repo, "checkout", "-q", "-b", "feature")  # a pull request's run: budgets block it
    return repo


@pytest.fixture(scope="module")
def sharded_run(project: Path):
    out = _cli(project, "run", "-k", "sharded", "--json", "run.json")
    assert out.returncode == 0, out.stdout + out.stderr
    db = project / "data" / "memtrack.db"
    with Store.open(db, readonly=True) as store:
        (run_id,) = store.run_ids()
        run = store.get_run(run_id)
    return project, db, run, out


def test_each_rank_is_recorded_and_the_headline_is_the_largest_per_device_peak(sharded_run):
    repo, db, run, out = sharded_run
    (m,) = run.measurements
    assert m.status == "ok", m.message
    assert m.case_id == "sharded[ranks=2]"
    assert [(r.rank, r.device, r.status) for r in m.ranks] == [(0, "cpu", "ok"), (1, "cpu", "ok")]
    r0, r1 = m.ranks
    assert r1.peak_allocated_bytes - r0.peak_allocated_bytes >= 16 * MiB  # its extra buffer
    assert m.peak_allocated_bytes == r1.peak_allocated_bytes
    # the breakdown is rank 1's: its parts add up to the headline
    assert m.weights_bytes == 256 * 257 * 4
    # (the allocator also saw a few bytes no tensor the tracker follows held: unattributed)
    assert (
        m.weights_bytes + m.intermediates_bytes + m.caches_bytes + m.unattributed_bytes
        == m.peak_allocated_bytes
    )
    assert m.unattributed_bytes < 4096
    # the host is shared: its figures are the ranks' sum
    assert m.host_peak_rss_bytes == r0.host_peak_rss_bytes + r1.host_peak_rss_bytes
    # one row per rank in SQLite, and the JSON record holds the same run
    rows = (
        sqlite3.connect(db)
        .execute("select rank, device, peak_allocated_bytes from rank_measurements order by rank")
        .fetchall()
    )
    assert rows == [(0, "cpu", r0.peak_allocated_bytes), (1, "cpu", r1.peak_allocated_bytes)]
    assert read_json(repo / "run.json") == run


def test_show_lists_a_row_per_rank(sharded_run):
    repo, db, run, _ = sharded_run
    res = CliRunner().invoke(main, ["show", run.run_id, "--db", str(db)], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "sharded[ranks=2] · per rank" in res.output
    table = res.output.split("per rank", 1)[1]
    assert [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")] == [
        "0",
        "1",
    ]


def _check_with_budget(repo: Path, db: Path, run_id: str, limit: int):
    cfg = repo / f"budget-{limit}.toml"
    cfg.write_text(
        CONFIG.format(timeout="5 min")
        + textwrap.dedent(f"""
        [[budgets]]
        workload = "sharded"
        metric = "allocated"
        limit = {limit}
        reason = "each rank's shard must fit its own device"
        """)
    )
    return CliRunner().invoke(
        main, ["check", "--config", str(cfg), "--db", str(db), "--run", run_id], terminal_width=400
    )


def test_a_budget_between_the_ranks_peaks_blocks_and_names_the_rank(sharded_run):
    repo, db, run, _ = sharded_run
    r0, r1 = run.measurements[0].ranks
    res = _check_with_budget(
        repo, db, run.run_id, (r0.peak_allocated_bytes + r1.peak_allocated_bytes) // 2
    )
    assert res.exit_code == 1, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("BLOCK over budget ·"))
    assert "allocated" in line and "largest per-device peak, rank 1 (device cpu)" in line


def test_a_budget_above_both_peaks_passes(sharded_run):
    repo, db, run, _ = sharded_run
    r1 = run.measurements[0].ranks[1]
    res = _check_with_budget(repo, db, run.run_id, r1.peak_allocated_bytes + MiB)
    assert res.exit_code == 0, res.output
    assert "largest per-device peak, rank 1 (device cpu)" in res.output


def _measure(repo: Path, name: str, timeout: str, device: str = "cpu"):
    (repo / "case.toml").write_text(CONFIG.format(timeout=timeout))
    config = load_config(repo / "case.toml")
    (wl,) = [w for w in discover(config) if w.name == name]
    (case,) = wl.cases()
    return run_case(config, case, device)


def test_a_failing_rank_fails_the_case_with_its_message_and_the_others_are_ended(project):
    # rank 0 sleeps for an hour: only ending it on rank 1's failure finishes the case
    # before its timeout, which would record `timeout` instead
    m = _measure(project, "one_fails", "2 min")
    assert m.status == "error", m.message
    assert m.message.startswith("rank 1: RuntimeError: rank one gives up")
    assert "rank one gives up" in m.traceback
    r0, r1 = m.ranks
    assert (r1.status, r1.message) == ("error", "RuntimeError: rank one gives up")
    assert (r0.status, r0.message) == ("crashed", "ended by memtrack after rank 1 failed")


def test_ranks_past_the_timeout_are_a_timeout_and_end(project):
    m = _measure(project, "both_hang", "3 s")
    assert m.status == "timeout"
    # where it was depends on how long starting took; that it ended does not
    assert re.match(r"rank 0: timed out after 3 s in phase '(start|setup)'", m.message)
    assert [r.status for r in m.ranks] == ["timeout", "timeout"]


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True])
def test_ranks_must_be_a_whole_number_of_ranks(value):
    with pytest.raises(WorkloadError, match=r"param 'ranks': .* is not a number of ranks"):
        workload(lambda ctx: None, name="bad_ranks", params={"ranks": value})


def test_ranks_set_in_the_config_are_checked_too(tmp_path):
    (tmp_path / "workloads.py").write_text(WORKLOADS)
    (tmp_path / "memtrack.toml").write_text(
        CONFIG.format(timeout="1 min") + "\n[workloads.sharded]\nparams = {ranks = [2, 0]}\n"
    )
    with pytest.raises(WorkloadError, match=r"workloads\.sharded\.params\.ranks: 0 is not"):
        discover(load_config(tmp_path / "memtrack.toml"))


def test_ranks_sweep_as_a_param_with_their_own_case_ids(tmp_path):
    (tmp_path / "workloads.py").write_text(WORKLOADS)
    (tmp_path / "memtrack.toml").write_text(
        CONFIG.format(timeout="1 min") + "\n[workloads.sharded]\nparams = {ranks = [1, 2, 4]}\n"
    )
    config = load_config(tmp_path / "memtrack.toml")
    (wl,) = [w for w in discover(config) if w.name == "sharded"]
    assert [c.case_id for c in wl.cases()] == [
        "sharded[ranks=1]",
        "sharded[ranks=2]",
        "sharded[ranks=4]",
    ]
    assert ranks_of(wl.cases()[2].params) == 4
    assert ranks_of(Case("x", {"batch": 1}).params) is None


def test_a_record_with_ranks_out_of_order_is_refused(sharded_run):
    _, _, run, _ = sharded_run
    m = run.measurements[0]
    bad = replace(run, measurements=(replace(m, ranks=m.ranks[::-1]),))
    with pytest.raises(RecordError, match=r"measurements\[0\]\.ranks: ranks \[1, 0\] are not"):
        run_from_dict(json.loads(json.dumps(to_dict(bad))))


@pytest.mark.gpu
def test_one_rank_on_cuda_runs_under_nccl_on_its_own_device(project):
    m = _measure(project, "on_cuda", "5 min", device="cuda")
    assert m.status == "ok", m.message
    (r0,) = m.ranks
    assert r0.device == "cuda:0" and r0.peak_allocated_bytes >= 128 * MiB
    assert m.peak_allocated_bytes == r0.peak_allocated_bytes
    assert m.peak_reserved_bytes == r0.peak_reserved_bytes
    if m.device_view == "nvml":
        assert m.devices[0].peak_process_bytes >= r0.peak_reserved_bytes


@pytest.mark.gpu
def test_two_ranks_on_two_gpus_each_measure_their_own_device(project):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    m = _measure(project, "two_gpus", "5 min", device="cuda")
    assert m.status == "ok", m.message
    r0, r1 = m.ranks
    assert (r0.device, r1.device) == ("cuda:0", "cuda:1")
    assert r1.peak_allocated_bytes - r0.peak_allocated_bytes >= 64 * MiB
    assert m.peak_allocated_bytes == r1.peak_allocated_bytes
    if m.device_view == "nvml":
        by_index = {d.index: d.peak_process_bytes for d in m.devices}
        assert by_index[1] > by_index[0]  # each device apart: devices do not pool


def _two_gpu_case(peaks: tuple[int, int], total: int = 141 * GiB):
    """Made-up figures of a 2-rank CUDA case: the judging of them is under test."""
    devices = tuple(
        DeviceMeasurement(i, f"GPU-{i}", "NVIDIA H200", total, 0, p + GiB, p + GiB, "pid", p, p, 10)
        for i, p in enumerate(peaks)
    )
    ranks = tuple(
        RankMeasurement(i, f"cuda:{i}", "ok", peak_allocated_bytes=p, peak_reserved_bytes=p)
        for i, p in enumerate(peaks)
    )
    m = make_measurement(
        "sharded", {"ranks": 2}, device="cuda", peak=max(peaks), reserved=max(peaks)
    )
    return replace(m, devices=devices, ranks=ranks)


def _allocated_verdict(m, limit: int) -> tuple[bool, Verdict]:
    """Whether the case's allocated peak is over a budget of `limit`, and a verdict carrying
    that budget, as the gate makes it (judge.budgets)."""
    budget = budget_use(m, "allocated", Budget("sharded", limit, "fits one", metric="allocated"))
    assert budget is not None
    value = float(m.peak_allocated_bytes)
    v = Verdict(
        m.case_id, m.workload, "allocated", "ok", False, candidate_value=value, budget=budget
    )
    return budget.over(value), v


def test_a_budget_above_the_device_memory_is_reported_as_such():
    m = _two_gpu_case((10 * GiB, 20 * GiB))
    over, v = _allocated_verdict(m, 200 * GiB)
    assert v.candidate_value == 20 * GiB and not over
    assert details(v) == [
        "budget 200.00 GiB is above the 141.00 GiB of device 1 (NVIDIA H200): "
        "a peak that fits the device is all it can hold",
    ]
    assert device_memory(m, "device") == (141 * GiB, "device 1 (NVIDIA H200)")


def test_a_per_device_peak_above_the_device_memory_cannot_be_within_budget():
    m = _two_gpu_case((10 * GiB, 20 * GiB), total=16 * GiB)
    over, v = _allocated_verdict(m, 200 * GiB)
    assert over
    assert budget_words(v).endswith(
        "but above the 16.00 GiB of device 1 (NVIDIA H200): it cannot be within budget"
    )
