from __future__ import annotations

import hashlib

import pytest
import torch

from memtrack.context import Context
from memtrack.errors import WorkloadError


def test_pinned_inputs_are_the_same_for_the_same_seed(tmp_path):
    a = Context({"dtype": "bfloat16"}, 7, "cpu", tmp_path)
    b = Context({"dtype": "bfloat16"}, 7, "cpu", tmp_path)
    assert a.dtype == torch.bfloat16
    assert torch.equal(a.randn(4, 8), b.randn(4, 8))
    assert torch.equal(a.randint(100, 3, 5), b.randint(100, 3, 5))
    assert not torch.equal(a.randn(4, 8), a.randn(4, 8, offset=1))


def test_a_data_file_is_refused_when_its_checksum_differs(tmp_path):
    (tmp_path / "prompts.txt").write_text("hello\n")
    digest = hashlib.sha256(b"hello\n").hexdigest()
    ctx = Context({}, 0, "cpu", tmp_path)
    assert ctx.data_file("prompts.txt", digest) == tmp_path / "prompts.txt"
    (tmp_path / "prompts.txt").write_text("hello, changed\n")
    with pytest.raises(WorkloadError, match=r"prompts.txt: sha256 .* differs from the pinned"):
        ctx.data_file("prompts.txt", digest)
    with pytest.raises(WorkloadError, match="pinned input not found"):
        ctx.data_file("missing.bin", digest)


def test_tagged_caches_count_each_storage_once_per_iteration(tmp_path):
    ctx = Context({}, 0, "cpu", tmp_path)
    kv = torch.zeros(2, 256, 64)
    ctx.tag_cache(kv, kv[0])  # a view shares the storage
    assert ctx.cache_peak_bytes == kv.nbytes
    ctx.new_iteration()
    ctx.tag_cache(torch.zeros(10))
    assert ctx.cache_peak_bytes == kv.nbytes  # the peak over iterations


def test_an_unknown_dtype_is_named():
    with pytest.raises(WorkloadError, match="param dtype='float13'"):
        Context({"dtype": "float13"}, 0, "cpu", None)


def test_under_fake_tensors_inputs_are_seeded_on_the_cpu_whatever_the_device(tmp_path):
    # A CUDA generator needs a driver: an estimate for CUDA on a machine without a GPU
    # (a CUDA build of torch) must not make one. Fake tensors hold no values anyway.
    ctx = Context({}, 3, "cuda:0", tmp_path, fake=True)
    g = ctx.generator()
    assert g.device == torch.device("cpu") and g.initial_seed() == 3
    assert Context({}, 3, "cpu", tmp_path).generator(offset=2).initial_seed() == 5
