"""Models as the field writes them, measured: frozen parameters (a peft LoRA fine-tune of a
Llama, a frozen first layer, a model served with `requires_grad_(False)`) and quantized
weights packed by torch.ao, run by memtrack's runner in fresh processes on the CPU. The
expected figures are counted here, by hand, from the same models built in this process; the
packed weights' bytes by the malloc interposer (tests/malloc_reference.c) in a process of
their own. The breadth (a zoo of families) is scripts/bench_zoo.py's."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memtrack.config import load_config
from memtrack.measure.launcher import PINNED_ENV
from memtrack.measure.suite import run_suite
from memtrack.workload.registry import discover, import_workload_module, select_cases

HERE = Path(__file__).parent

WORKLOADS = textwrap.dedent(
    """
    import torch
    from torch import nn

    import memtrack

    LAYERS, HEADS, KV_HEADS, HIDDEN, VOCAB = 4, 4, 2, 64, 256
    PROMPT, NEW = 24, 8


    def llama():
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, max_position_embeddings=128,
        )
        model = LlamaForCausalLM(config)
        return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))


    def mlp():
        return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


    def train(model, optimizer, loss):
        def step():
            value = loss()
            value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return value.detach()

        return step


    @memtrack.workload
    def lora_train(ctx):
        model = llama().train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=False)
        ctx.mark(model, optimizer)
        ids = ctx.randint(VOCAB, 2, 32)
        return train(model, optimizer, lambda: model(input_ids=ids, labels=ids).loss)


    @memtrack.workload
    def lora_generate(ctx):
        model = llama().eval()
        ctx.mark(model)

        def tag(module, args, out):  # the KV cache, as generate grows it
            cache = out.past_key_values
            ctx.tag_cache(*(t for layer in cache.layers for t in (layer.keys, layer.values)))

        model.get_base_model().register_forward_hook(tag)  # peft's generate calls it
        prompt = ctx.randint(VOCAB, 2, PROMPT)

        @torch.no_grad()
        def step():
            return model.generate(
                input_ids=prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=0
            )

        return step


    @memtrack.workload
    def frozen_mlp(ctx):
        model = mlp().eval().requires_grad_(False)
        ctx.mark(model)
        x = ctx.randn(32, 256)
        return lambda: model(x)


    @memtrack.workload
    def frozen_first(ctx):
        # a small batch: the peak is in AdamW's step, every gradient made
        model = nn.Sequential(
            nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        model[0].requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-3, foreach=False)
        ctx.mark(model, optimizer)
        x = ctx.randn(2, 256)
        return train(model, optimizer, lambda: model(x).square().mean())


    @memtrack.workload
    def int8_dynamic(ctx):
        model = torch.ao.quantization.quantize_dynamic(mlp().eval(), {nn.Linear}, torch.qint8)
        ctx.mark(model)
        x = ctx.randn(32, 256)

        @torch.no_grad()
        def step():
            return model(x)

        return step
    """
)

PACKED = """
import copy, ctypes, gc, sys, warnings
warnings.filterwarnings("ignore")
lib = ctypes.CDLL(sys.argv[1])
lib.memref_current.restype = ctypes.c_longlong
import torch
from torch import nn
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).eval()
model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, torch.qint8)
total = 0
for layer in (model[0], model[2]):
    gc.collect()
    start = lib.memref_current()
    # one more copy of each packed object, made through its pickling (unpacked and packed
    # again, as torch.load makes it): the bytes it holds once made
    clone = copy.deepcopy(layer._packed_params._packed_params)
    gc.collect()
    total += lib.memref_current() - start
    del clone
print(total)
"""


def storage_bytes(tensors) -> int:
    """The bytes of the distinct storages of `tensors` (a tied weight once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("anymodel")
    (root / "wl.py").write_text(WORKLOADS)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\ndevice = "cpu"\nrepeats = 2\n')
    os.environ["HF_HUB_OFFLINE"] = "1"  # built from configs: nothing to fetch, ever
    config = load_config(root / "memtrack.toml")
    run = run_suite(config, select_cases(discover(config)))
    module = sys.modules[import_workload_module(str(root / "wl.py"), root)]
    return {m.case_id: m for m in run.measurements}, module, root


def test_a_lora_fine_tune_counts_frozen_weights_once_and_trains_only_the_adapters(zoo):
    measured, wl, _ = zoo
    m = measured["lora_train"]
    assert m.status == "ok", m.message
    model = wl.llama()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert 0 < len(trainable) < len(list(model.parameters()))
    assert m.weights_bytes == storage_bytes([*model.parameters(), *model.buffers()])
    lora = storage_bytes(trainable)
    assert m.gradients_bytes <= lora  # those alive at the peak; the frozen weights have none
    # AdamW: exp_avg and exp_avg_sq per trainable parameter, and its `step` (a float32
    # scalar tensor on the CPU)
    assert m.optimizer_state_bytes == 2 * lora + 4 * len(trainable)
    assert len(set(m.allocated_samples)) == 1, m.allocated_samples


def test_generating_with_a_lora_model_measures_and_tags_its_kv_cache(zoo):
    measured, wl, _ = zoo
    m = measured["lora_generate"]
    assert m.status == "ok", m.message
    model = wl.llama()
    assert m.weights_bytes == storage_bytes([*model.parameters(), *model.buffers()])
    # the cache's largest moment: every layer's keys and values for the prompt and all but
    # the last new token (the last one is never fed back)
    head_dim = wl.HIDDEN // wl.HEADS
    full = wl.LAYERS * 2 * 2 * wl.KV_HEADS * (wl.PROMPT + wl.NEW - 1) * head_dim * 4
    assert m.largest_cache_bytes == full
    assert 0 < m.caches_bytes <= full


def test_a_model_served_frozen_is_measured(zoo):
    measured, _, _ = zoo
    m = measured["frozen_mlp"]
    assert m.status == "ok", m.message
    assert m.weights_bytes == (256 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert m.gradients_bytes == 0 and m.optimizer_state_bytes == 0
    assert m.inputs_bytes == 32 * 256 * 4


def test_a_frozen_first_layer_has_no_gradient_or_optimizer_state(zoo):
    measured, _, _ = zoo
    m = measured["frozen_first"]
    assert m.status == "ok", m.message
    frozen, trainable = (256 * 1024 + 1024) * 4, (1024 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert m.weights_bytes == frozen + trainable
    assert m.gradients_bytes == trainable  # at the peak, in the optimizer's step
    assert m.optimizer_state_bytes == 2 * trainable + 4 * 4  # four trainable tensors
    assert len(set(m.allocated_samples)) == 1, m.allocated_samples


def test_int8_weights_read_as_their_packed_bytes(zoo):
    measured, _, root = zoo
    m = measured["int8_dynamic"]
    assert m.status == "ok", m.message
    if shutil.which("gcc") is None or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("needs gcc for the interposer and glibc's mallinfo2 for the figure")
    lib = root / "libmemref.so"
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(HERE / "malloc_reference.c")],
        check=True,
    )
    done = subprocess.run(
        [sys.executable, "-c", PACKED, str(lib)],
        env={**os.environ, **PINNED_ENV, "LD_PRELOAD": str(lib)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    packed = int(done.stdout.strip().splitlines()[-1])
    int8 = 256 * 1024 + 1024 * 10  # the int8 weights alone; the packing pads and adds
    biases = (1024 + 10) * 4
    assert packed > int8 + biases
    # the packed objects' bytes (their float biases too), as the interposer counts them:
    # two heap counters (usable sizes here, glibc's in-use chunks there) read an aligned
    # block's padding differently, by where it lands (1.4 KiB apart at most here)
    assert m.weights_bytes == pytest.approx(packed, rel=0.005)
    assert m.weights_bytes == m.categories["Packed"] + m.categories["Parameter"]
    assert m.peak_allocated_bytes >= m.weights_bytes + m.inputs_bytes
    assert any("packed quantized weights" in n for n in m.notes), m.notes
    assert "dtype: the case has no dtype param; its tensors are qint8" in m.notes
