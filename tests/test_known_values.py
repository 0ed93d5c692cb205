"""`memtrack estimate` of models whose construction reads tensor values (timm's drop-path
rates, transformers' computed buffers and branches on them): a workload's setup runs
unchanged, small tensors it makes keep their values, and nothing large is made for real."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import commit_all, init_repo

from memtrack.cli import main
from memtrack.records import run_from_dict
from memtrack.store.database import Store

WORKLOADS = """\
import torch
from torch import nn

import memtrack


class DropPath(nn.Module):
    \"\"\"timm's stochastic depth: a sample's residual branch dropped with probability p.\"\"\"

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)


class Block(nn.Module):
    def __init__(self, dim, heads, drop_path):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.drop1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.drop1(self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])
        return x + self.drop2(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    def __init__(self, image, patch, dim, depth, heads, classes, drop_path_rate):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        # timm: the stochastic depth decay rule, read while the model is built
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.ModuleList(Block(dim, heads, p) for p in dpr)
        # transformers: a buffer computed at construction, a branch on its value
        self.register_buffer("position_ids", torch.arange(tokens).float(), persistent=False)
        if int(self.position_ids.max()) + 1 == tokens:
            self.pos = nn.Embedding(tokens, dim)
        else:
            self.pos = nn.Embedding(64 * tokens, dim)
        self.mask_value = torch.finfo(torch.float32).min
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        # _init_weights: random fills of the weights
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = x + self.pos(self.position_ids.long())
        n = x.shape[1]
        mask = torch.full((n, n), self.mask_value, device=x.device).triu(1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x).mean(1))


@memtrack.workload()
def vit_train(ctx):
    model = VisionTransformer(
        image=64, patch=8, dim=128, depth=4, heads=4, classes=10, drop_path_rate=0.1
    ).to(ctx.device)
    model.train()
    images = ctx.randn(8, 3, 64, 64)
    ctx.mark(model)

    def step():
        model(images).sum().backward()
        model.zero_grad(set_to_none=True)

    return step


@memtrack.workload(params={"rows": 1})
def bigger_than_memory(ctx):
    # timm's construction pattern around a layer larger than this machine's memory
    dpr = [x.item() for x in torch.linspace(0, 0.1, 2)]
    head = nn.Linear(4096, ctx.params["rows"])
    nn.init.trunc_normal_(head.weight, std=dpr[1])
    x = ctx.randn(1, 4096)
    ctx.mark(head)
    return lambda: head(x)


@memtrack.workload()
def reads_a_random_value(ctx):
    x = torch.rand(4)
    threshold = x.max().item()
    return lambda: x * threshold
"""


def _invoke(repo: Path, *args: str):
    return CliRunner().invoke(
        main, [*args, "--config", str(repo / "memtrack.toml")], catch_exceptions=False
    )


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = init_repo(tmp_path_factory.mktemp("known-values") / "repo")
    # twice this machine's memory, in float32 weights
    rows = 2 * _memory_bytes() // (4096 * 4) + 1
    (repo / "memtrack.toml").write_text(
        textwrap.dedent(f"""\
        modules = ["workloads.py"]
        database = "memtrack.db"
        warmup = 1
        repeats = 1
        timeout = "5 min"

        [workloads.bigger_than_memory]
        params = {{rows = {rows}}}
        """)
    )
    (repo / "workloads.py").write_text(WORKLOADS)
    commit_all(repo, "workloads")
    return repo


def test_a_model_built_like_timm_and_transformers_is_estimated_as_measured(repo: Path):
    measured = _invoke(repo, "run", "-k", "vit_train")
    assert measured.exit_code == 0, measured.output
    estimated = _invoke(repo, "estimate", "-k", "vit_train")
    assert estimated.exit_code == 0, estimated.output
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        runs = {
            run.measurements[0].kind: run.measurements[0]
            for run in (store.get_run(r) for r in store.run_ids())
        }
    m, e = runs["measured"], runs["estimate"]
    assert m.status == "ok", m.message
    assert e.status == "ok", e.message
    # The branch on the buffer's value chose the embedding a real run chose: the weights
    # are the measured ones, to the byte.
    assert e.weights_bytes == m.weights_bytes
    # within 10% of the tensors the measured CPU run held (the allocator's figure less
    # the scratch kernels allocate inside themselves), as the shipped examples are
    tensors = m.peak_allocated_bytes - (m.unattributed_bytes or 0)
    assert abs(e.peak_allocated_bytes / tensors - 1) <= 0.10, (e.peak_allocated_bytes, tensors)


def test_a_model_larger_than_this_machine_is_built_with_its_values_and_never_for_real(
    repo: Path, tmp_path: Path
):
    # Building it for real would need twice the machine's memory: the worker would be
    # killed, or the case an error.
    res = _invoke(
        repo, "estimate", "-k", "bigger_than_memory", "--no-db", "--json", str(tmp_path / "e.json")
    )
    assert res.exit_code == 0, res.output
    (e,) = run_from_dict(json.loads((tmp_path / "e.json").read_text())).measurements
    assert e.status == "ok", e.message
    rows = e.params["rows"]
    assert e.weights_bytes == (4096 * rows + rows) * 4 > 2 * _memory_bytes()


def test_reading_a_random_value_in_setup_is_still_an_error_naming_its_line(
    repo: Path, tmp_path: Path
):
    # Values are kept only where they are known: random numbers are not drawn for real.
    res = _invoke(
        repo,
        "estimate",
        "-k",
        "reads_a_random_value",
        "--no-db",
        "--json",
        str(tmp_path / "e.json"),
    )
    assert res.exit_code == 0, res.output
    (e,) = run_from_dict(json.loads((tmp_path / "e.json").read_text())).measurements
    assert e.status == "error"
    assert e.message.startswith(
        "cannot be faked: aten._local_scalar_dense.default reads a tensor's value"
    ), e.message
    code = "threshold = x.max().item()"
    line = WORKLOADS.splitlines().index(f"    {code}") + 1
    assert e.message.endswith(f" at workloads.py:{line}: {code}"), e.message
