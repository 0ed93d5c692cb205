"""The model zoo (scripts/zoo.py) measured, and held to references memtrack did not make.

In a temporary git repository holding the zoo's workloads, `memtrack run` measures every
case on the CPU and `memtrack estimate` estimates it; then each case runs again in a fresh
process outside memtrack, under the malloc interposer (tests/malloc_reference.c, loaded with
LD_PRELOAD: every malloc-family call of the process by usable size), which gives:

- the persistent set: the heap that a setup and its two warm-up steps left held, less
  what the process held before it (setups made and dropped before it, until one left
  nothing behind, made the imports and what libraries build once per process; Python
  objects of more than 512 B count here too, so it reads a little high);
- each step's rise: its peak above its start, over three steps after the warm-up;
- the weights by hand: the bytes of the distinct storages of the marked modules' parameters
  and buffers (a tensor subclass by its inner tensors), and for packed quantized weights the
  heap bytes of one copy of each packed object, by the interposer.

Prints per case: status; whether memtrack's weights equal the hand count; the framework peak
against the interposer's (persistent + largest rise); whether every repeat read the same
peak; the estimate (fake tensors alone, no kernel scratch) against the measured peak; the
median step time. Goals: all ok, weights exact, framework peak within 2 % of the
interposer's where the case is deterministic, repeats equal, estimates within 5 % or the
reason why not.

Needs gcc and the zoo extra: `pip install -e ".[zoo]"`. The estimate of a trainer's case
(`hf_trainer_train`, `lightning_fit`) is refused: its loop runs in a thread of its own,
which fake tensors do not follow.

    python scripts/bench_zoo.py [-k PATTERN ...] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_estimate import commit, git, memtrack  # run as scripts/bench_zoo.py: a sibling

from memtrack.measure.launcher import PINNED_ENV
from memtrack.records import Measurement
from memtrack.store.database import Store
from memtrack.units import format_size

HERE = Path(__file__).resolve().parent
CONFIG = """\
[tool.memtrack]
modules = ["zoo.py"]
database = "memtrack.db"
device = "cpu"
warmup = 2
repeats = 3
timeout = 600
"""
PEAK_GOAL, ESTIMATE_GOAL = 0.02, 0.05

FAMILIES = {
    "llama_lora_train": "HF Llama + peft LoRA",
    "llama_lora_generate": "HF Llama + peft LoRA",
    "llama_checkpointing": "gradient checkpointing",
    "frozen_encoder_head": "frozen encoder, trainable head",
    "t5_generate": "T5 encoder-decoder",
    "mixtral_moe": "Mixture-of-Experts",
    "clip_encoders": "CLIP / ViT",
    "resnet18_train": "torchvision",
    "ssdlite_detect": "torchvision detection",
    "convnext_train": "timm",
    "unet_step": "diffusers",
    "tied_shared_train": "tied and shared weights",
    "compiled_mlp": "torch.compile",
    "autocast_train": "autocast",
    "ao_int8_dynamic": "torch.ao int8 dynamic",
    "torchao_int8_weight_only": "torchao int8 weight-only",
    "hf_trainer_train": "HF Trainer",
    "lightning_fit": "Lightning",
}

REFERENCE = r"""
import copy, ctypes, gc, json, sys, warnings
from pathlib import Path

warnings.filterwarnings("ignore")
lib = ctypes.CDLL(sys.argv[1])
lib.memref_current.restype = lib.memref_peak.restype = ctypes.c_longlong
import torch
from memtrack.workload.context import Context
from memtrack.workload.registry import find, import_workload_module

import_workload_module(sys.argv[2], Path(sys.argv[2]).parent)
torch.manual_seed(0)
params = json.loads(sys.argv[4])
# Set up and dropped until a round leaves nothing behind (three at most): imports, and what
# libraries make once per process (kernel caches, lazily built tables, which may fill over
# more than one model), are not the case's persistent set.
for _ in range(3):
    start = lib.memref_current()
    ctx = Context(params, 0, "cpu", Path("."))
    step = find(sys.argv[3]).fn(ctx)
    for _ in range(2):
        step()
    getattr(step, "close", lambda: None)()  # a trainer's loop, in its thread, ended
    del step, ctx
    gc.collect()
    if lib.memref_current() <= start:
        break
ctx = Context(params, 0, "cpu", Path("."))
before = lib.memref_current()
step = find(sys.argv[3]).fn(ctx)
for _ in range(2):
    step()
gc.collect()
held = lib.memref_current() - before


def storages(t):
    # a wrapper subclass (torchao) holds its data in inner tensors
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from storages(getattr(t, name))
    else:
        yield t.untyped_storage()


weights, seen, packed = 0, set(), 0
for obj in ctx.marked_objects or ():
    if not isinstance(obj, torch.nn.Module):
        continue
    for t in [*obj.parameters(), *obj.buffers()]:
        for st in storages(t):
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                weights += st.nbytes()
    for module in obj.modules():
        for value in vars(module).values():
            if isinstance(value, torch._C.ScriptObject):
                gc.collect()
                start = lib.memref_current()
                clone = copy.deepcopy(value)
                gc.collect()
                packed += lib.memref_current() - start
                del clone
rises = []
for _ in range(3):
    gc.collect()
    start = lib.memref_current()
    lib.memref_reset_peak()
    step()
    rises.append(lib.memref_peak() - start)
print(json.dumps({"held": held, "rises": rises, "weights": weights, "packed": packed}))
"""


def latest(db: Path, kind: str) -> dict[str, Measurement]:
    with Store.open(db, readonly=True) as store:
        for run_id in store.run_ids():  # newest first
            run = store.get_run(run_id)
            if run.measurements and run.measurements[0].kind == kind:
                return {m.case_id: m for m in run.measurements}
    return {}


def reference(lib: Path, repo: Path, m: Measurement) -> dict[str, object]:
    """The case outside memtrack, under the interposer, in a fresh process."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            REFERENCE,
            str(lib),
            str(repo / "zoo.py"),
            m.workload,
            json.dumps(m.params),
        ],
        cwd=repo,
        env={**os.environ, **PINNED_ENV, "LD_PRELOAD": str(lib)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail}
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(m: Measurement, e: Measurement | None, ref: dict[str, object]) -> list[str]:
    family = FAMILIES.get(m.workload, m.workload)
    if m.status != "ok":
        return [family, m.case_id, f"{m.status}: {m.message}", "", "", "", "", "", ""]
    if "error" in ref:
        return [family, m.case_id, "ok", "-", f"reference failed: {ref['error']}", "", "", "", ""]
    return [
        family,
        m.case_id,
        "ok",
        weights_exact(m, ref),
        *peak_against(m, ref),
        "yes" if len(set(m.allocated_samples)) == 1 else "no",
        estimate_against(m, e),
        f"{(m.time_median_s or 0) * 1000:.1f} ms",
    ]


def weights_exact(m: Measurement, ref: dict[str, object]) -> str:
    """'yes' where memtrack's weights are the hand count to the byte. Packed quantized
    weights are counted by two heap counters (glibc's mallinfo2 in memtrack, the interposer
    here), which differ by a few bytes a block: within 0.1 % they are said to agree."""
    tensors, packed = int(ref["weights"]), int(ref["packed"])  # type: ignore[call-overload]
    hand = tensors + packed
    if m.weights_bytes == hand:
        return "yes"
    off = ((m.weights_bytes or 0) - hand) / hand
    if packed and abs(off) <= 0.001:
        return f"yes (packed: {off:+.3%}, heap counters)"
    return f"no: {m.weights_bytes:,} vs {hand:,} B"


def peak_against(m: Measurement, ref: dict[str, object]) -> list[str]:
    """The framework peak against the interposer's, and where they differ beyond the goal:
    the persistent set (what the heap holds beyond tensors: a library's caches) or the
    step's rise (a kernel's own buffers, allocated outside torch's allocator)."""
    held, rise = int(ref["held"]), max(ref["rises"])  # type: ignore[call-overload,type-var]
    need, peak = held + rise, m.peak_allocated_bytes or 0
    figure = f"{format_size(peak)} / {format_size(need)} = {peak / need:.3f}"
    if abs(peak / need - 1) <= PEAK_GOAL:
        return [figure, ""]
    level = m.persistent_bytes or 0
    return [
        figure,
        f"persistent {format_size(level)} vs {format_size(held)}; "
        f"rise {format_size(peak - level)} vs {format_size(rise)}",
    ]


def estimate_against(m: Measurement, e: Measurement | None) -> str:
    """The estimate (fake tensors alone, no kernel scratch) against the measured peak, or
    why there is none."""
    if e is None or e.status != "ok" or not e.peak_allocated_bytes:
        why = (e.message or e.status) if e is not None else "not estimated"
        return f"- ({why.splitlines()[0]})"
    tensors = e.peak_allocated_bytes - (e.scratch_bytes or 0)
    ratio = tensors / (m.peak_allocated_bytes or 1)
    if abs(ratio - 1) <= ESTIMATE_GOAL:
        return f"{ratio:.3f}"
    scratch = (m.peak_allocated_bytes or 0) - tensors
    return f"{ratio:.3f} (kernel scratch no fake tensor holds: {format_size(scratch)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="patterns", action="append", default=[], help="case pattern")
    ap.add_argument("--keep", action="store_true", help="keep the repository and database")
    args = ap.parse_args()
    if shutil.which("gcc") is None:
        sys.exit("bench_zoo: the malloc interposer is compiled with gcc, which is not here")
    patterns = [a for p in args.patterns for a in ("-k", p)]
    folder = Path(tempfile.mkdtemp(prefix="memtrack-bench-zoo-"))
    repo = folder / "repo"
    repo.mkdir()
    lib = folder / "libmemref.so"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-shared",
            "-fPIC",
            "-o",
            str(lib),
            str(HERE.parent / "tests" / "malloc_reference.c"),
        ],
        check=True,
    )
    git(repo, "init", "-q")
    (repo / "pyproject.toml").write_text(CONFIG)
    (repo / ".gitignore").write_text("memtrack.db*\n")
    shutil.copy(HERE / "zoo.py", repo / "zoo.py")
    commit(repo, "zoo")
    memtrack(repo, "run", *patterns)
    memtrack(repo, "estimate", *patterns)
    measured, estimates = (
        latest(repo / "memtrack.db", "measured"),
        latest(repo / "memtrack.db", "estimate"),
    )
    head = [
        "family",
        "case",
        "status",
        "weights exact",
        "framework peak / interposer",
        "beyond 2 %: where",
        "repeats equal",
        "estimate / measured",
        "median time",
    ]
    rows = [head]
    for case_id, m in measured.items():
        ref = reference(lib, repo, m) if m.status == "ok" else {}
        rows.append(row(m, estimates.get(case_id), ref))
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows[1:]:
        print("| " + " | ".join(r) + " |")
    if args.keep:
        print(f"kept: {repo}")


if __name__ == "__main__":
    main()
