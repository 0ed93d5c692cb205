"""The runner's own cost: tracked vs bare time of the example workloads' timing pass.

For each example case, in one process, alternate rounds of a bare loop (one clock around
N iterations) and memtrack's timing pass (a clock, and a device sync on CUDA, around each
iteration), and print tracked / bare: of the totals, and of the fastest round of each (the
least disturbed by the rest of the machine). Goal: at most 1.03. The instrumented
memory pass (MemTracker on the CPU) is printed beside it for comparison: it is why time is
measured in a separate pass.

    python scripts/bench_runner.py [--rounds 7] [--iters 20]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from memtrack.config import load_config
from memtrack.probes.framework import MemTrackerProbe
from memtrack.worker.measure import _sync, _timing_pass
from memtrack.workload.context import Context
from memtrack.workload.registry import discover, select_cases


def bare(step, device, iters: int) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    _sync(device)
    return time.perf_counter() - t0


def memory_pass(step, device, iters: int, objects) -> float:
    probe = MemTrackerProbe(device)
    probe.mark(objects)
    t0 = time.perf_counter()
    for _ in range(iters):
        with probe.iteration():
            step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = load_config(cwd=Path("/nonexistent-so-the-default-suite-is-used"))
    cases = select_cases(discover(config))
    print(
        f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"rounds={args.rounds} iters/round={args.iters}"
    )
    print(
        f"{'case':<60} {'bare s':>9} {'tracked s':>10} {'ratio':>7} {'min ratio':>10} "
        f"{'memory pass x':>14}"
    )
    total_bare = total_tracked = min_bare = min_tracked = 0.0
    for case in cases:
        ctx = Context(case.params, case.seed, device, Path("data"))
        fn = next(w for w in discover(config) if w.name == case.workload).fn
        step = fn(ctx)
        objects = ctx.marked_objects or ()
        for _ in range(3):
            step()
        bs, ts = [], []
        for _ in range(args.rounds):  # interleaved, so drift hits both sides alike
            bs.append(bare(step, ctx.device, args.iters))
            ts.append(sum(_timing_pass(step, ctx.device, args.iters)["iteration_times_s"]))
        b, t = sum(bs), sum(ts)
        min_bare += min(bs)
        min_tracked += min(ts)
        mem = (
            memory_pass(step, ctx.device, args.iters, objects) if device == "cpu" else float("nan")
        )
        total_bare += b
        total_tracked += t
        print(
            f"{case.case_id[:60]:<60} {b:9.3f} {t:10.3f} {t / b:7.3f} "
            f"{min(ts) / min(bs):10.3f} {mem / (b / args.rounds):14.2f}"
        )
    print(
        f"{'all example cases':<60} {total_bare:9.3f} {total_tracked:10.3f} "
        f"{total_tracked / total_bare:7.3f} {min_tracked / min_bare:10.3f}   (goal <= 1.03)"
    )


if __name__ == "__main__":
    main()
