"""The breakdown adds up, on real CPU workloads in their own processes: an fp32 AdamW step
(weights 4P, gradients 4P, optimizer state 8P) and KV caches, preallocated or grown by
concatenation (2 x layers x batch x positions x heads x head_dim x bytes), within 1 %."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from memtrack.config import load_config
from memtrack.measure.case import run_case
from memtrack.workload.registry import discover, select_cases

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
    root = tmp_path_factory.mktemp("suite")
    (root / "workloads.py").write_text(WORKLOADS)
    (root / "memtrack.toml").write_text('modules = ["workloads.py"]\nrepeats = 3\n')
    config = load_config(root / "memtrack.toml")
    return config, {c.case_id: c for c in select_cases(discover(config))}


def test_an_fp32_adamw_step_breaks_down_into_weights_gradients_and_optimizer_state(suite):
    config, cases = suite
    m = run_case(config, cases["adamw_step[width=1024]"], "cpu")
    assert m.status == "ok", m.message
    params = 2 * (1024 * 1024 + 1024)
    assert m.weights_bytes == pytest.approx(4 * params, rel=0.01)
    assert m.gradients_bytes == pytest.approx(4 * params, rel=0.01)
    assert m.optimizer_state_bytes == pytest.approx(8 * params, rel=0.01)
    parts = (
        m.weights_bytes,
        m.caches_bytes,
        m.gradients_bytes,
        m.optimizer_state_bytes,
        m.intermediates_bytes,
        m.unattributed_bytes,
    )
    assert sum(parts) == m.peak_allocated_bytes  # the parts add up to the peak


@pytest.mark.parametrize("grow", ["static", "concat"])
def test_a_kv_cache_counts_what_is_alive_at_the_peak_each_storage_once(suite, grow):
    config, cases = suite
    m = run_case(config, cases[f"kv_cache[grow={grow}]"], "cpu")
    assert m.status == "ok", m.message
    # 2 x layers x batch x positions x heads x dim x 4 B
    if grow == "static":
        assert m.caches_bytes == 2 * 2 * 2 * 200 * 4 * 32 * 4
    else:
        # The peak is the last concatenation: the 199-position storages (tagged a step
        # before) and the 200-position ones that replace them (tagged just after the peak)
        # are both alive, both the cache; each storage counts once.
        assert m.caches_bytes == 2 * 2 * 2 * (199 + 200) * 4 * 32 * 4
    assert (
        m.weights_bytes
        + m.caches_bytes
        + m.intermediates_bytes
        + m.unattributed_bytes
        + m.gradients_bytes
        + m.optimizer_state_bytes
        == m.peak_allocated_bytes
    )


def test_a_training_step_reads_the_same_peak_with_one_two_or_three_repeats(tmp_path):
    config = load_config(None, cwd=tmp_path)  # the shipped example suite
    (case,) = [c for c in select_cases(discover(config)) if c.workload == "train_step"]
    peaks = {}
    for repeats in (1, 2, 3):
        m = run_case(dataclasses.replace(config, repeats=repeats), case, "cpu")
        assert m.status == "ok", m.message
        assert len(set(m.allocated_samples)) == 1, m.allocated_samples  # no odd first one
        peaks[repeats] = m.peak_allocated_bytes
    assert peaks[1] == peaks[2] == peaks[3]
