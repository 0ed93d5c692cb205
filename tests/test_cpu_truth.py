"""The CPU figures held to an independent reference: a malloc interposer (every malloc,
calloc, realloc, aligned allocation and free of the process, by usable size, with its
running peak; tests/malloc_reference.c), loaded with LD_PRELOAD into a fresh process that
runs the same case outside memtrack's runner, and hand arithmetic for what setup made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memtrack.config import load_config
from memtrack.measure.suite import run_suite
from memtrack.workload.context import Context
from memtrack.workload.registry import discover, find, select_cases

HERE = Path(__file__).parent

WORKLOADS = textwrap.dedent(
    """
    import threading

    import torch
    import torch.nn.functional as F
    from torch import nn

    import memtrack
    from memtrack.examples.gpt import GPT


    @memtrack.workload(params={"tags": ["each", "end"]})
    def gpt_tags(ctx):
        # the cache is built by the model's forward; the peak is in prefill
        model = GPT(2048, 128, 4, 2, 256).eval()
        ctx.mark(model)
        prompt = ctx.randint(2048, 1, 240)

        @torch.no_grad()
        def step():
            ids, past = prompt, None
            for _ in range(16):
                logits, past = model(ids, past)
                if ctx["tags"] == "each":
                    ctx.tag_cache(*(t for kv in past for t in kv))
                ids = logits[:, -1:].argmax(-1)
                del logits
            if ctx["tags"] == "end":  # once, long after the peak
                ctx.tag_cache(*(t for kv in past for t in kv))
            return ids

        return step


    class Attention(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)

        def forward(self, x, cache):
            q, k, v = self.qkv(x).chunk(3, -1)
            cache.append(k)
            return F.scaled_dot_product_attention(q, k, v)


    @memtrack.workload(params={"grad": [0, 1]})
    def attention(ctx):
        # three attention layers, batch 2, sequence 256; a step that returns a loss
        model = nn.Sequential(*(Attention(64) for _ in range(3)))
        x = ctx.randn(2, 256, 64)
        ctx.mark(model)

        def step():
            with torch.set_grad_enabled(bool(ctx["grad"])):
                cache = []
                h = x
                for layer in model:
                    h = layer(h, cache)
                return h.sum()

        return step


    @memtrack.workload(params={"concurrency": [1, 3]})
    def held(ctx):
        model = nn.Linear(64, 64)
        ctx.mark(model)
        x = ctx.randn(1, 8, 512, 64)  # the input batch, made in setup, never marked
        table = torch.ones(2**20)  # 4 MiB, a plain attribute the step never reads
        lock = threading.Lock()

        @torch.no_grad()
        def step():
            with lock:  # one session's kernels at a time: the peak is one session's
                return F.scaled_dot_product_attention(model(x), x, x).sum()

        step.table = table
        return step
    """
)

PARAMS = 3 * (64 * 192 + 192) * 4  # the three qkv projections
BATCH = 2 * 256 * 64 * 4
HELD_WEIGHTS = (64 * 64 + 64) * 4
HELD_INPUTS = 8 * 512 * 64 * 4 + 4 * 2**20  # the batch and the plain attribute

REFERENCE = """
import ctypes, gc, json, sys
from pathlib import Path

lib = ctypes.CDLL(sys.argv[1])
lib.memref_current.restype = lib.memref_peak.restype = ctypes.c_longlong
import torch
from memtrack.workload.context import Context
from memtrack.workload.registry import find, import_workload_module
from memtrack.workload.sessions import Sessions

import_workload_module(sys.argv[2], Path(sys.argv[2]).parent)
torch.manual_seed(0)
ctx = Context(json.loads(sys.argv[4]), 0, "cpu", Path("."))
step = find(sys.argv[3]).fn(ctx)
if ctx.concurrency > 1:
    step = Sessions(step, ctx.concurrency, ctx.device)
for _ in range(2):
    step()
rises = []
for _ in range(3):
    gc.collect()
    start = lib.memref_current()
    lib.memref_reset_peak()
    step()
    rises.append(lib.memref_peak() - start)
print(json.dumps(rises))
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each step's peak rise above its start, by the interposer, in a fresh process."""
    if shutil.which("gcc") is None:
        pytest.skip("the malloc reference is compiled with gcc, which this machine lacks")
    root = tmp_path_factory.mktemp("truth")
    lib = root / "libmemref.so"
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(HERE / "malloc_reference.c")],
        check=True,
    )
    (root / "wl.py").write_text(WORKLOADS)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\ndevice = "cpu"\nrepeats = 4\n')

    def rises(workload: str, params: dict) -> list[int]:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                REFERENCE,
                str(lib),
                str(root / "wl.py"),
                workload,
                json.dumps(params),
            ],
            env={**os.environ, "LD_PRELOAD": str(lib)},
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return json.loads(out.stdout)

    config = load_config(root / "memtrack.toml")
    run = run_suite(config, select_cases(discover(config)))
    return {m.case_id: m for m in run.measurements}, rises


def test_every_repeat_of_an_autograd_on_step_reads_what_one_step_needs(reference):
    measured, rises = reference
    for grad in (0, 1):
        m = measured[f"attention[grad={grad}]"]
        assert m.status == "ok", m.message
        assert m.persistent_bytes == PARAMS + BATCH  # the batch is held from setup
        assert m.weights_bytes == PARAMS and m.inputs_bytes == BATCH
        # what the step needs, by the interposer: the same in every step
        need = PARAMS + BATCH + max(rises("attention", {"grad": grad}))
        for sample in m.allocated_samples:
            assert sample == pytest.approx(need, rel=0.02), (grad, m.allocated_samples, need)
        assert len(set(m.allocated_samples)) == 1, m.allocated_samples
        assert set(m.retained_samples) == {0}  # each call's graph is freed with its loss


def test_the_cpu_figure_counts_every_live_tensor_and_follows_session_threads(reference):
    measured, rises = reference
    for n in (1, 3):
        m = measured[f"held[concurrency={n}]"]
        assert m.status == "ok", m.message
        # the batch and the plain attribute are live tensors: counted, as inputs
        assert m.persistent_bytes == HELD_WEIGHTS + HELD_INPUTS
        assert m.weights_bytes == HELD_WEIGHTS and m.inputs_bytes == HELD_INPUTS
        # each session's scratch inside SDPA, in its own thread, is counted
        need = HELD_WEIGHTS + HELD_INPUTS + max(rises("held", {"concurrency": n}))
        for sample in m.allocated_samples:
            assert sample == pytest.approx(need, rel=0.01), (n, m.allocated_samples, need)


def test_caches_at_the_peak_and_the_largest_cache_whenever_the_tags_come(reference, tmp_path):
    measured, _ = reference
    at_peak = 2 * 2 * 1 * 240 * 128 * 4  # k, v x layers x batch x prompt x d_model x 4 B
    largest = 2 * 2 * 1 * 255 * 128 * 4  # after the 16th forward: 240 + 15 positions
    each, end = measured["gpt_tags[tags=each]"], measured["gpt_tags[tags=end]"]
    assert each.caches_bytes == at_peak and each.largest_cache_bytes == largest
    assert not any("caches at the peak read 0 B" in n for n in each.notes)
    # tagged once at the end: no storage of the peak's cache is tagged, and a note says so
    assert end.caches_bytes == 0 and end.largest_cache_bytes == largest
    assert any(
        "every cache tag of the peak's iteration came after its peak" in n for n in end.notes
    )

    # the same tags outside memtrack's runner give the same largest cache
    for tags in ("each", "end"):
        ctx = Context({"tags": tags}, 0, "cpu", tmp_path)
        step = find("gpt_tags").fn(ctx)  # discovered by the run above, in this process
        step()
        step()
        assert ctx.cache_peak_bytes == largest, tags
