"""The CPU framework view (probes/framework.py): the CPU allocator's peak with the tensor
tracker's breakdown. Kernel scratch, setup tensors given to `ctx.mark`, a cache the model
builds inside its forward, a forward with autograd on, what each iteration retains; measured
by real workers on the CPU, and judged by `memtrack check` in a real repository."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from factories import commit_all, git, init_repo, memtrack_cli

from memtrack.config import load_config
from memtrack.examples.gpt import GPT, generate
from memtrack.measure.suite import run_suite
from memtrack.probes.framework import MemTrackerProbe
from memtrack.workload.context import Context
from memtrack.workload.registry import discover, select_cases

MiB = 2**20

WORKLOADS = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F

    import memtrack
    from memtrack.examples import gpt

    CACHE = torch.float32
    KEEP = 0  # MiB kept through the peak


    @memtrack.workload()
    def sdpa(ctx):
        q = ctx.randn(1, 8, 1024, 64)
        ctx.mark(q)

        @torch.no_grad()
        def step():
            return F.scaled_dot_product_attention(q, q, q)

        return step


    @memtrack.workload()
    def marked(ctx):
        lin = torch.nn.Linear(32, 32)
        x = ctx.randn(1024, 1024)  # 4 MiB built in setup, given to the mark
        ctx.mark(lin, x)

        @torch.no_grad()
        def step():
            return lin(x[:64, :32])

        return step


    @memtrack.workload()
    def autograd_on(ctx):
        # inference written without torch.no_grad(): autograd records every call's graph
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 256))
        ctx.mark(model)
        x = ctx.randn(64, 256)

        def step():
            kept = torch.ones(KEEP * 2**18)  # float32: KEEP MiB, alive through the peak
            out = model(x)
            return out + kept.sum()

        return step


    def _attention(self, x, past):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v = k.to(CACHE, copy=True), v.to(CACHE, copy=True)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype),
                                             is_causal=past is None)
        return self.proj(out.transpose(1, 2).reshape(b, t, d)), (k, v)


    gpt.Attention.forward = _attention  # this worker's model keeps its cache at CACHE


    @memtrack.workload(params={"sessions": 1, "max_len": 128, "new_tokens": 4,
                               "d_model": 64, "heads": 4, "layers": 2, "vocab": 1024})
    def cached(ctx):
        p = ctx.params
        model = gpt.GPT(p["vocab"], p["d_model"], p["heads"], p["layers"], p["max_len"]).eval()
        ctx.mark(model)
        prompt = ctx.randint(p["vocab"], p["sessions"], p["max_len"] - p["new_tokens"])

        @torch.no_grad()
        def step():
            return gpt.generate(model, prompt, p["new_tokens"], ctx)

        return step
    """
)

ALLOCATOR_SDPA = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        q = torch.randn(1, 8, 1024, 64, generator=g)
        with torch.no_grad():
            y = F.scaled_dot_product_attention(q, q, q)
        del y
    prof.export_chrome_trace(sys.argv[1])
    """
)


def _memtrack(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memtrack_cli(repo, *args, timeout=900)


def _run(repo: Path) -> dict[str, dict]:
    out = _memtrack(repo, "run", "--json", str(repo / "run.json"))
    assert out.returncode == 0, out.stderr
    record = json.loads((repo / "run.json").read_text())
    return {m["workload"]: m for m in record["measurements"]}


def test_a_cache_built_inside_forward_and_tagged_after_the_peak_counts_at_the_peak(tmp_path):
    # The peak is inside prefill (every position's logits); the model's forward creates the
    # cache there, and generation tags it when the forward returns, after the peak.
    ctx = Context({}, 0, "cpu", tmp_path)
    model = GPT(2048, 128, 4, 2, 256).eval()
    prompt = ctx.randint(2048, 1, 240)
    probe = MemTrackerProbe(torch.device("cpu"))
    probe.mark((model,))
    ctx.tag_hook = probe.tag

    @torch.no_grad()
    def step():
        return generate(model, prompt, 16, ctx)

    step()
    with probe.iteration():
        step()
    cats = probe.summary()["categories"]
    assert cats["Other"] == 2 * 2 * 1 * 240 * 128 * 4  # k, v x layers x batch x prompt x d
    params = sum(p.numel() for p in model.parameters())
    assert cats["Parameter"] == 4 * params


def test_the_cpu_view_is_the_allocators_and_repeats_with_autograd_on(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / "wl.py").write_text(WORKLOADS)
    (repo / "memtrack.toml").write_text(
        'modules = ["wl.py"]\ndevice = "cpu"\nrepeats = 4\nmin_baseline_runs = 1\n'
    )
    (repo / ".gitignore").write_text("data/\nrun.json\n")
    commit_all(repo, "workloads")
    main = _run(repo)
    for m in main.values():
        assert m["status"] == "ok", m["message"]
        assert m["framework"] == "cpu-allocator"

    # SDPA's scratch is allocated inside the kernel: the allocator's own running total
    # (its "Total Allocated", as torch's profiler exports it) is the figure, within 1 %
    trace = tmp_path / "trace.json"
    subprocess.run(
        [sys.executable, "-c", ALLOCATOR_SDPA, str(trace)], check=True, capture_output=True
    )
    totals = [
        e["args"]["Total Allocated"]
        for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("name") == "[memory]"
    ]
    sdpa = main["sdpa"]
    assert abs(sdpa["peak_allocated_bytes"] / max(totals) - 1) < 0.01, (sdpa, max(totals))
    assert sdpa["peak_allocated_bytes"] > sdpa["persistent_bytes"] + 2 * MiB + 512 * 1024
    assert sdpa["unattributed_bytes"] > 0  # the kernel's scratch: no tensor the tracker saw

    # a tensor built in setup and given to the mark is in the persistent set and the peak,
    # as an input: the weights are the parameters
    marked = main["marked"]
    assert marked["persistent_bytes"] == 4 * MiB + (32 * 32 + 32) * 4
    assert marked["weights_bytes"] == (32 * 32 + 32) * 4
    assert marked["inputs_bytes"] == 4 * MiB
    assert marked["peak_allocated_bytes"] >= marked["persistent_bytes"]

    # autograd on: every repeat reads the same peak (each call's graph is freed with it)
    samples = main["autograd_on"]["allocated_samples"]
    assert len(samples) == 4 and len(set(samples)) == 1, samples

    # the cache the model builds in its forward is the cache, exactly
    cached = main["cached"]
    assert cached["caches_bytes"] == 2 * 2 * 1 * 124 * 64 * 4

    # A pull request that keeps its cache at float64 and 1 MiB more through the peak
    git(repo, "checkout", "-q", "-b", "pr")
    wl = repo / "wl.py"
    wl.write_text(
        wl.read_text()
        .replace("CACHE = torch.float32", "CACHE = torch.float64")
        .replace("KEEP = 0 ", "KEEP = 1 ")
    )
    commit_all(repo, "float64 cache, 1 MiB more")
    pr = _run(repo)
    assert pr["cached"]["caches_bytes"] == 2 * cached["caches_bytes"]
    assert len(set(pr["autograd_on"]["allocated_samples"])) == 1
    out = _memtrack(repo, "check", "--markdown", str(tmp_path / "verdict.md"))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    cache_line = next(
        x for x in lines if x.startswith("BLOCK regression · cached") and "allocated" in x
    )
    assert re.search(r"caches grew \+\d", cache_line), cache_line
    grad_line = next(
        x for x in lines if x.startswith("BLOCK regression · autograd_on") and "allocated" in x
    )
    assert "delta +1.00 MiB (+1,048,576 B)" in grad_line, grad_line


RETAINING = textwrap.dedent(
    """
    import torch
    import memtrack

    KEPT = []


    @memtrack.workload()
    def leaks(ctx):
        def step():
            KEPT.append(torch.ones(1600))  # float32: 6,400 B kept by every call
        return step


    @memtrack.workload()
    def frees(ctx):
        lin = torch.nn.Linear(64, 64)
        ctx.mark(lin)
        x = ctx.randn(32, 64)

        @torch.no_grad()
        def step():
            return lin(x).relu().sum()

        return step


    @memtrack.workload()
    def autograd_graph(ctx):
        # gradients on: the result holds its graph, which the tracker's module hooks keep in
        # a reference cycle until a collection
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 256))
        ctx.mark(model)
        x = ctx.randn(64, 256)
        return lambda: model(x).sum()


    @memtrack.workload(params={"concurrency": 3})
    def leaks_per_session(ctx):
        def step():
            KEPT.append(torch.ones(1600))
        return step
    """
)


@pytest.fixture(scope="module")
def retaining(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("retaining")
    (root / "wl.py").write_text(RETAINING)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 4\n')
    config = load_config(root / "memtrack.toml")
    run = run_suite(config, select_cases(discover(config)))
    return {m.workload: m for m in run.measurements}


def test_each_iteration_retains_exactly_what_it_leaves_alive(retaining):
    assert all(m.status == "ok" for m in retaining.values()), retaining
    assert retaining["leaks"].retained_samples == (6400,) * 4
    assert retaining["frees"].retained_samples == (0,) * 4
    # the graph is collected inside the iteration's window: freed, not retained; the peak
    # of every iteration is the same
    graph = retaining["autograd_graph"]
    assert graph.retained_samples == (0,) * 4
    assert len(set(graph.allocated_samples)) == 1, graph.allocated_samples
    # with sessions in threads, the tracker's totals: every session's tensor
    assert retaining["leaks_per_session"].retained_samples == (3 * 6400,) * 4


def test_every_timed_iteration_has_its_cpu_time_and_no_device_time_on_the_cpu(retaining):
    for m in retaining.values():
        assert len(m.iteration_cpu_times_s) == m.repeats == 4
        assert all(t > 0 for t in m.iteration_cpu_times_s), m.iteration_cpu_times_s
        assert m.iteration_device_times_s == ()
