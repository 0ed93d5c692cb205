"""The breakdown adds up, on real CPU workloads in their own processes: an fp32 AdamW step
(weights 4P, gradients 4P, optimizer state 8P) and KV caches, preallocated or grown by
concatenation (2 x layers x batch x positions x heads x head_dim x bytes), within 1 %.
Workspace, beyond the framework, is never below 0: a real CPU step of untouched pages, and
GPU figures as NVML and the allocator give them (this machine has no GPU)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
from factories import GiB, commit_all, init_repo, make_measurement, make_run

from memtrack.config import load_config
from memtrack.measure.case import run_case
from memtrack.measure.suite import start_run
from memtrack.records import DeviceMeasurement
from memtrack.records.breakdown import NO_WORKSPACE, with_breakdown
from memtrack.store.database import Store
from memtrack.store.save import save_run
from memtrack.workload.registry import select_cases

WORKLOADS = textwrap.dedent(
    """
    import torch
    import memtrack

    @memtrack.workload(params={"width": 1024})
    def adamw_step(ctx):
        # weights dominate: the peak is in the optimizer step, with every gradient alive
        n = ctx["width"]
        model = torch.nn.Sequential(torch.nn.Linear(n, n), torch.nn.Linear(n, n))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        ctx.mark(model, opt)
        x = ctx.randn(1, n)

        def step():
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    LAYERS, BATCH, POSITIONS, HEADS, HEAD_DIM = 2, 2, 200, 4, 32

    @memtrack.workload(params={"grow": ["static", "concat"]})
    def kv_cache(ctx):
        shape = (BATCH, HEADS, 1, HEAD_DIM)
        q = ctx.randn(*shape)

        def step():
            if ctx["grow"] == "static":
                cache = [torch.zeros(BATCH, HEADS, POSITIONS, HEAD_DIM) for _ in range(2 * LAYERS)]
                ctx.tag_cache(*cache)
                for pos in range(POSITIONS):
                    for c in cache:
                        c[:, :, pos : pos + 1] = q
                return sum(c.sum() for c in cache)
            cache = [torch.zeros(BATCH, HEADS, 0, HEAD_DIM) for _ in range(2 * LAYERS)]
            for pos in range(POSITIONS):
                cache = [torch.cat([c, q], dim=2) for c in cache]  # a new storage each step
                ctx.tag_cache(*cache)
            return sum(c.sum() for c in cache)
        return step
    """
)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """The module's cases, each forked by one fork server, as `memtrack run` forks them."""
    root = tmp_path_factory.mktemp("suite")
    (root / "workloads.py").write_text(WORKLOADS)
    (root / "memtrack.toml").write_text('modules = ["workloads.py"]\nrepeats = 3\n')
    config = load_config(root / "memtrack.toml")
    with start_run(config) as start:
        cases = {c.case_id: c for c in select_cases(start.workloads())}
        yield config, cases, start.server


def test_an_fp32_adamw_step_breaks_down_into_weights_gradients_and_optimizer_state(suite):
    config, cases, server = suite
    m = run_case(config, cases["adamw_step[width=1024]"], "cpu", server=server)
    assert m.status == "ok", m.message
    params = 2 * (1024 * 1024 + 1024)
    assert m.weights_bytes == pytest.approx(4 * params, rel=0.01)
    assert m.gradients_bytes == pytest.approx(4 * params, rel=0.01)
    assert m.optimizer_state_bytes == pytest.approx(8 * params, rel=0.01)
    assert m.inputs_bytes == 1024 * 4  # the batch, made in setup
    parts = (
        m.weights_bytes,
        m.inputs_bytes,
        m.caches_bytes,
        m.gradients_bytes,
        m.optimizer_state_bytes,
        m.intermediates_bytes,
        m.unattributed_bytes,
    )
    assert sum(parts) == m.peak_allocated_bytes  # the parts add up to the peak


@pytest.mark.parametrize("grow", ["static", "concat"])
def test_a_kv_cache_counts_what_is_alive_at_the_peak_each_storage_once(suite, grow):
    config, cases, server = suite
    m = run_case(config, cases[f"kv_cache[grow={grow}]"], "cpu", server=server)
    assert m.status == "ok", m.message
    # 2 x layers x batch x positions x heads x dim x 4 B
    if grow == "static":
        assert m.caches_bytes == 2 * 2 * 2 * 200 * 4 * 32 * 4
    else:
        # The peak is the last concatenation: the 199-position storages (tagged a step
        # before) and the 200-position ones that replace them (tagged just after the peak)
        # are both alive, both the cache; each storage counts once.
        assert m.caches_bytes == 2 * 2 * 2 * (199 + 200) * 4 * 32 * 4
    assert m.inputs_bytes == 2 * 4 * 1 * 32 * 4  # q, made in setup
    assert (
        m.weights_bytes
        + m.inputs_bytes
        + m.caches_bytes
        + m.intermediates_bytes
        + m.unattributed_bytes
        + m.gradients_bytes
        + m.optimizer_state_bytes
        == m.peak_allocated_bytes
    )


def test_a_training_step_reads_the_same_peak_with_one_two_or_three_repeats(tmp_path):
    config = load_config(None, cwd=tmp_path)  # the shipped example suite
    peaks = {}
    with start_run(config) as start:
        (case,) = [c for c in select_cases(start.workloads()) if c.workload == "train_step"]
        # Three repeats read one peak each, all equal (no odd first one), so a run of two,
        # its first two repeats, reads the same again: one run of three and one of one hold it.
        for repeats in (1, 3):
            m = run_case(
                dataclasses.replace(config, repeats=repeats), case, "cpu", server=start.server
            )
            assert m.status == "ok", m.message
            assert not any("fresh interpreter" in n for n in m.notes), m.notes  # forked
            assert len(m.allocated_samples) == repeats
            assert len(set(m.allocated_samples)) == 1, m.allocated_samples  # no odd first one
            peaks[repeats] = m.peak_allocated_bytes
    assert peaks[1] == peaks[3]


# -- workspace is never below 0, and no record that says so is written -----------------------

UNTOUCHED = textwrap.dedent(
    """
    import torch
    import memtrack

    @memtrack.workload
    def untouched(ctx):
        def step():
            # 1 GiB that is never written: allocated, but none of its pages is resident
            return torch.empty(2**30, dtype=torch.uint8).shape
        return step
    """
)


def _cli(cwd, *args):
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_peak_of_pages_never_touched_has_no_workspace_and_the_run_reads_back(tmp_path):
    # The host's RSS stays far below the 1 GiB framework peak: RSS - peak was stored as a
    # negative workspace, and every later read of the database called it damaged.
    repo = init_repo(tmp_path / "repo")
    (repo / "wl.py").write_text(UNTOUCHED)
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n')
    commit_all(repo, "a step of untouched pages")
    out = _cli(repo, "run", "--json", str(tmp_path / "run.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    db = repo / "data" / "memtrack.db"
    with Store.open(db, readonly=True) as store:
        (run_id,) = store.run_ids()
        (m,) = store.get_run(run_id).measurements  # read back, every value checked
    assert m.status == "ok" and m.peak_allocated_bytes >= 2**30
    assert m.host_step_peak_rss_bytes < m.peak_allocated_bytes
    assert m.workspace_bytes is None
    assert any(n.endswith(NO_WORKSPACE) for n in m.notes), m.notes
    shown = _cli(repo, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    # and its JSON record is one `memtrack ingest` takes
    ingested = _cli(repo, "ingest", str(tmp_path / "run.json"), "--db", str(tmp_path / "b.db"))
    assert ingested.returncode == 0, ingested.stderr


def test_a_record_with_a_negative_figure_is_refused_when_written_and_nothing_is_stored(tmp_path):
    # A workspace below 0, as a missed spike left it on a GPU before: `save_run` wrote it, and
    # `get_run` then said "damaged database (... workspace_bytes: -419430400 is below 0)".
    bad = make_run([make_measurement("w", device="cuda", workspace_bytes=-419430400)])
    good = make_run([make_measurement("w")])
    db = tmp_path / "db" / "memtrack.db"
    with Store.open(db) as store:
        assert store.write_run(good)
        saved, failures = save_run(bad, store, None)
        assert str(db) not in saved
        (failure, kept) = failures
        assert failure == (
            f"{db}: run {bad.run_id}: measurements[0].workspace_bytes: -419430400 is below 0; "
            "nothing written"
        )
        assert store.run_ids() == [good.run_id]
        assert store.get_run(good.run_id) == good  # the database reads as whole


def _gpu(**fields):
    device = {
        "index": 0,
        "uuid": "GPU-0",
        "name": "NVIDIA H200",
        "total_bytes": 140 * GiB,
        "peak_process_bytes": 9 * GiB,
        "memory_pass_peak_bytes": 5 * GiB,
        "peak_reserved_bytes": 4 * GiB,
        "peak_allocated_bytes": 3 * GiB,
    }
    return DeviceMeasurement(**{**device, **fields})


def _on_gpus(peak: int, reserved: int, *devices: DeviceMeasurement):
    m = make_measurement("w", device="cuda", peak=peak, reserved=reserved)
    return dataclasses.replace(m, devices=devices, device_view="nvml")


def test_a_device_whose_samples_missed_the_reserved_peak_has_no_workspace():
    # short_spike of scripts/gpu-check.sh: the step gives its 1 GiB back with empty_cache()
    # before a 10 ms sampler looks; the pass's samples read 400 MiB below reserved.
    missed = _gpu(memory_pass_peak_bytes=4 * GiB - 400 * 2**20)
    m = with_breakdown(_on_gpus(3 * GiB, 4 * GiB, missed))
    assert m.workspace_bytes is None
    caught = with_breakdown(dataclasses.replace(m, devices=(_gpu(),)))
    assert caught.workspace_bytes == GiB  # 5 GiB sampled in the pass - 4 GiB reserved


def test_workspace_is_taken_per_device_and_the_largest_kept():
    # A model spread over two GPUs: GPU 1 holds the larger reserved peak, GPU 0 the larger
    # process peak. One GPU's process peak less another's reserved (5 - 6 GiB) is nothing.
    zero = _gpu(index=0, uuid="GPU-0", memory_pass_peak_bytes=5 * GiB, peak_reserved_bytes=4 * GiB)
    half = GiB // 2
    one = _gpu(
        index=1, uuid="GPU-1", memory_pass_peak_bytes=6 * GiB + half, peak_reserved_bytes=6 * GiB
    )
    m = with_breakdown(_on_gpus(5 * GiB, 6 * GiB, zero, one))
    assert m.workspace_bytes == GiB  # GPU 0: 5 - 4 GiB; GPU 1: 0.5 GiB
    # a device that missed its spike drops out; the others keep theirs
    missed = dataclasses.replace(one, memory_pass_peak_bytes=5 * GiB)
    assert with_breakdown(dataclasses.replace(m, devices=(zero, missed))).workspace_bytes == GiB
    assert with_breakdown(dataclasses.replace(m, devices=(missed,))).workspace_bytes is None
