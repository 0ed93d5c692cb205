"""memtrack.probes.sites on real CPU work: the blocks alive at a span's peak, by module path
and by the line of the caller's code, summing to the peak the span probe reads."""

from __future__ import annotations

import torch

from memtrack.probes.sites import NO_MODULE, is_users, record_sites
from memtrack.probes.span import SpanProbe

MiB = 2**20


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x).relu()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(Block(), Block())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([layer(x) for layer in self.layers])


NET = Net()


def kept_blocks(n: int) -> list[torch.Tensor]:
    return [torch.ones(256 * 1024) for _ in range(n)]  # 1 MiB each


def step() -> tuple[list[torch.Tensor], torch.Tensor]:
    keep = kept_blocks(3)
    with torch.no_grad():
        out = NET(torch.ones(512, 256))  # 512 KiB input; 2 MiB per layer; 4 MiB cat
    return keep, out


def test_the_sites_of_a_peak_sum_to_the_peak_the_span_reads_and_name_module_and_line():
    step()  # once unmeasured: what a first call makes once is not the step's
    probe = SpanProbe("cpu")
    with probe.span():
        step()
    with record_sites(top=5) as recording:
        step()
    sites = recording.sites
    assert probe.figures is not None
    assert sites.peak_bytes == probe.figures.allocated_bytes
    for group in (sites.by_module, sites.by_source):
        assert sum(s.nbytes for s in group) == sites.peak_bytes
    # at the peak: the kept blocks and the input, each layer's output (its Linear's freed
    # after the relu), and their concatenation
    modules = {s.label: s.nbytes for s in sites.by_module}
    assert modules == {
        NO_MODULE: 3 * MiB + 512 * 1024,
        "Net (Net)": 4 * MiB,
        "Net.layers.0 (Block)": 2 * MiB,
        "Net.layers.1 (Block)": 2 * MiB,
    }
    # the file as the import path found it: test_sites.py, from the tests/ folder
    sources = {s.label.rpartition("/")[2]: s.nbytes for s in sites.by_source}
    kept = kept_blocks.__code__.co_firstlineno + 1
    relu = Block.forward.__code__.co_firstlineno + 1
    cat = Net.forward.__code__.co_firstlineno + 1
    assert sources == {
        f"test_sites.py:<listcomp>:{kept}": 3 * MiB,
        f"test_sites.py:forward:{relu}": 4 * MiB,  # both layers' outputs
        f"test_sites.py:forward:{cat}": 4 * MiB,
        f"test_sites.py:step:{step.__code__.co_firstlineno + 3}": 512 * 1024,
    }


def test_a_remainder_line_gathers_the_sites_past_the_top():
    with record_sites(top=1) as recording:
        step()
    labels = [s.label for s in recording.sites.by_source]
    assert len(labels) == 2 and labels[1].endswith(" other sites")


def test_frames_of_torch_pytest_the_standard_library_and_memtrack_are_not_the_users():
    assert not is_users("torch/nn/modules/module.py")
    assert not is_users("_pytest/python.py")
    assert not is_users("enum.py")
    assert not is_users("memtrack/probes/span.py")
    assert not is_users("<frozen importlib._bootstrap>")
    assert is_users(__file__)
