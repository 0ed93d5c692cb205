"""Concurrency measured, not multiplied: the `concurrency` param runs overlapping sessions."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from memtrack.config import load_config
from memtrack.errors import WorkloadError
from memtrack.measure.suite import run_suite
from memtrack.workload.registry import discover, select_cases
from memtrack.workload.sessions import Sessions, concurrency

SERVE = """modules = ["memtrack.examples"]
warmup = 1
repeats = 3
[workloads.decoder_serve]
params = {{concurrency = [{levels}]}}
"""


def _serve_run(root: Path, levels: str) -> dict[int, Any]:
    """decoder_serve at each concurrency level, through the runner (a process per case)."""
    (root / "memtrack.toml").write_text(SERVE.format(levels=levels))
    config = load_config(root / "memtrack.toml")
    cases = select_cases(discover(config), ["decoder_serve"])
    run = run_suite(config, cases)
    return {m.params["concurrency"]: m for m in run.measurements}


@pytest.fixture(scope="module")
def serve_cpu(tmp_path_factory):
    return _serve_run(tmp_path_factory.mktemp("serve"), "1, 2, 4")


def test_concurrent_sessions_peak_above_one_and_below_n_times_one(serve_cpu):
    one = serve_cpu[1]
    assert all(m.status == "ok" for m in serve_cpu.values()), [
        m.message for m in serve_cpu.values()
    ]
    for n in (2, 4):
        m = serve_cpu[n]
        assert one.peak_allocated_bytes < m.peak_allocated_bytes < n * one.peak_allocated_bytes
        # The weights are shared by the sessions: counted once, as with one session.
        assert m.categories["Parameter"] == one.categories["Parameter"] > 0
        assert m.weights_bytes == one.weights_bytes
        # Each session holds its own KV cache: n of them alive at the peak.
        assert m.caches_bytes == n * one.caches_bytes
        assert f"{n} concurrent sessions per iteration (threads)" in m.notes
    assert not any("concurrent" in note for note in one.notes)  # the single-thread path


def test_one_session_alone_and_the_sum_of_sessions_bound_the_concurrent_peak(serve_cpu):
    one = serve_cpu[1]
    assert one.session_peak_bytes is None and one.sessions_sum_bytes is None  # no sessions
    for n in (2, 4):
        m = serve_cpu[n]
        # One session alone, in the concurrent case's process, is the one-session case.
        assert m.session_peak_bytes == one.peak_allocated_bytes
        # Every session adds its rise above the shared weights: the sum, what N sessions
        # would hold if each peaked at once, does not depend on how the threads interleave.
        shared = m.weights_bytes + m.inputs_bytes  # the prompts are made in setup
        rise = m.session_peak_bytes - shared
        assert m.sessions_sum_bytes == shared + n * rise
        assert m.session_peak_bytes <= m.peak_allocated_bytes <= m.sessions_sum_bytes


def test_concurrency_must_be_a_count():
    assert concurrency({}) == 1 and concurrency({"concurrency": 3}) == 3
    for bad in (0, -1, "2", True, 1.5):
        with pytest.raises(WorkloadError, match=r"param concurrency=.* must be a whole number"):
            concurrency({"concurrency": bad})


def test_sessions_overlap_and_an_error_in_one_is_raised_after_all_end():
    import torch

    inside, most, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def step() -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            if inside[0] == 3:
                release.set()
        release.wait(timeout=60)  # every session is inside before any leaves
        with lock:
            inside[0] -= 1

    Sessions(step, 3, torch.device("cpu"))()
    assert most[0] == 3 and inside[0] == 0

    def failing() -> None:
        raise ValueError("session failed")

    with pytest.raises(ValueError, match="session failed"):
        Sessions(failing, 4, torch.device("cpu"))()


def test_the_same_session_threads_serve_every_iteration():
    # On CUDA each thread holds a cuBLAS handle and a workspace per (handle, stream): new
    # threads per iteration made new pairs, and allocated grew run by run.
    import torch

    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def step() -> None:
        with lock:
            seen.append(
                (
                    threading.get_native_id(),
                    id(threading.current_thread()),
                    threading.current_thread().name,
                )
            )

    with Sessions(step, 3, torch.device("cpu")) as run:
        for _ in range(4):
            run()
        assert len(seen) == 12
        calls = [set(seen[i : i + 3]) for i in range(0, 12, 3)]
        assert len(calls[0]) == 3 and all(c == calls[0] for c in calls)
        threads = run.threads
        assert all(t.is_alive() for t in threads)
    assert not any(t.is_alive() for t in threads)  # closed: ended, not left waiting


def test_after_a_failed_call_the_same_sessions_run_the_next_one():
    import torch

    calls, lock = [0], threading.Lock()

    def step() -> None:
        with lock:
            calls[0] += 1
            first = calls[0] == 1
        if first:
            raise ValueError("one session failed")

    with Sessions(step, 3, torch.device("cpu")) as run:
        with pytest.raises(ValueError, match="one session failed"):
            run()
        before = calls[0]
        run()  # the broken start is mended: every session runs again
        assert calls[0] == before + 3


def test_solo_runs_the_step_in_the_first_session_alone():
    import torch

    seen: list[str] = []
    lock = threading.Lock()

    def step() -> None:
        with lock:
            seen.append(threading.current_thread().name)

    with Sessions(step, 3, torch.device("cpu")) as run:
        run.solo()
        assert seen == [run.threads[0].name]
        run()  # then every session again, together
        assert sorted(seen[1:]) == sorted(t.name for t in run.threads)


WORKLOAD = """
import os, threading
import memtrack

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "threads.log")
lock = threading.Lock()


@memtrack.workload(params={"concurrency": 3})
def served(ctx):
    def step():
        with lock, open(LOG, "a") as f:
            f.write(f"{threading.get_native_id()}\\n")
    return step
"""


def test_a_concurrent_case_runs_every_iteration_in_the_same_threads(tmp_path):
    # Through the runner: warm-up, timing pass and memory pass of one worker process.
    (tmp_path / "wl.py").write_text(WORKLOAD)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 2\nrepeats = 3\n')
    config = load_config(tmp_path / "memtrack.toml")
    (m,) = run_suite(config, select_cases(discover(config))).measurements
    assert m.status == "ok", m.message
    ids = (tmp_path / "threads.log").read_text().split()
    # warm-up, timing, one to prime the profiler, the memory pass, the sites pass
    iterations = 2 + 3 + 1 + 3 + 1
    # then the first session alone, primed and measured, in its own thread
    sessions, alone = ids[: 3 * iterations], ids[3 * iterations :]
    calls = [set(sessions[i : i + 3]) for i in range(0, len(sessions), 3)]
    assert len(calls) == iterations
    assert len(calls[0]) == 3 and all(c == calls[0] for c in calls)
    assert len(alone) == 2 and alone[0] == alone[1] and alone[0] in calls[0]


WAITING = """
import threading
import memtrack


@memtrack.workload(params={"concurrency": 2})
def waits_for_the_other(ctx):
    together = threading.Barrier(ctx.concurrency)  # as overlapping requests are written

    def session():
        together.wait()
    return session
"""


def test_sessions_that_wait_for_one_another_are_measured_together_but_not_alone(tmp_path):
    (tmp_path / "wl.py").write_text(WAITING)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n')
    config = load_config(tmp_path / "memtrack.toml")
    (m,) = run_suite(config, select_cases(discover(config))).measurements
    assert m.status == "ok", m.message
    assert m.peak_allocated_bytes is not None and len(m.iteration_times_s) == 2
    assert m.session_peak_bytes is None and m.sessions_sum_bytes is None
    assert any(n.startswith("one session alone did not end within") for n in m.notes), m.notes


def test_cache_tags_from_concurrent_sessions_are_all_counted(tmp_path):
    import torch

    from memtrack.workload.context import Context

    ctx = Context({"concurrency": 8}, 0, "cpu", tmp_path)
    kept: list[torch.Tensor] = []
    start = threading.Barrier(8)

    def session() -> None:
        cache = torch.zeros(1024)  # 4 KiB, one storage per session
        start.wait()
        for _ in range(200):  # many interleaved tags: a lost update would show
            ctx.tag_cache(cache)
        start.wait()  # every cache alive until every session has tagged
        with lock:
            kept.append(cache)

    lock = threading.Lock()
    threads = [threading.Thread(target=session) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ctx.cache_peak_bytes == 8 * 4096


def test_the_cpu_tracker_counts_every_session_thread(tmp_path):
    import torch

    from memtrack.probes.framework import MemTrackerProbe

    model = torch.nn.Linear(256, 256)  # 257 KiB of parameters
    x = torch.randn(1, 256)

    def step() -> None:
        buffer = torch.zeros(64 * 1024)  # 256 KiB per session, alive across the barrier
        model(x)
        barrier.wait()
        del buffer

    results = {}
    for n in (1, 4):
        barrier = threading.Barrier(n)
        probe = MemTrackerProbe(torch.device("cpu"), n)
        probe.mark((model,))
        run = Sessions(step, n, torch.device("cpu"), probe.session_scope) if n > 1 else step
        with probe.iteration():
            run()
        results[n] = probe.summary()
    params = 256 * 256 * 4 + 256 * 4
    for n, s in results.items():
        assert s["categories"]["Parameter"] == params
        assert s["peak_allocated_bytes"] >= params + n * 256 * 1024
    assert results[4]["peak_allocated_bytes"] < 4 * results[1]["peak_allocated_bytes"]


@pytest.mark.gpu
def test_concurrent_sessions_on_cuda_each_on_a_stream(tmp_path):
    runs = _serve_run(tmp_path, "1, 4")
    one, four = runs[1], runs[4]
    assert one.status == four.status == "ok", (one.message, four.message)
    assert one.device == four.device == "cuda"
    assert "4 concurrent sessions per iteration (threads, one CUDA stream each)" in four.notes
    assert one.peak_allocated_bytes < four.peak_allocated_bytes < 4 * one.peak_allocated_bytes
    assert four.persistent_bytes == one.persistent_bytes  # the weights, once
    assert four.time_median_s > 0 and len(four.iteration_times_s) == four.repeats
    # one session alone, in its own thread and on its own stream, bounds the peak from
    # below; every session's rise above the weights at once bounds it from above
    assert four.session_peak_bytes <= four.peak_allocated_bytes <= four.sessions_sum_bytes
    assert len(four.iteration_device_times_s) == four.repeats


@pytest.mark.gpu
def test_concurrent_sessions_on_cuda_keep_allocated_flat_across_repeats(tmp_path):
    # One cuBLAS workspace per (handle, stream): with the same threads in every iteration the
    # pairs, and so the workspaces, are made once, in the warm-up.
    (tmp_path / "memtrack.toml").write_text(
        'modules = ["memtrack.examples"]\nwarmup = 1\nrepeats = 8\n'
        "[workloads.decoder_serve]\nparams = {concurrency = [4]}\n"
    )
    config = load_config(tmp_path / "memtrack.toml")
    (m,) = run_suite(config, select_cases(discover(config), ["decoder_serve"])).measurements
    assert m.status == "ok" and m.device == "cuda", m.message
    assert len(m.allocated_samples) == 8
    # A new pair would add a whole workspace (8 MiB by default, 32 MiB on Hopper); how the
    # sessions' activations overlap may move the peak by less.
    assert max(m.allocated_samples) - min(m.allocated_samples) < 8 * 2**20, m.allocated_samples
