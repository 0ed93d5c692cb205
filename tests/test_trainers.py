"""Trainers as cases without hand work (memtrack.integrations): a Hugging Face `Trainer` and a
Lightning `Trainer`, each driving its own loop with real DataLoader workers, one optimizer
step per iteration; their loop (workload.driven) on its own first. Real repositories, real
`memtrack run` and `memtrack check`."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from factories import GIT_ENV, commit_all, git, init_repo, memtrack_cli

from memtrack.errors import WorkloadError
from memtrack.workload.driven import Driven


def test_a_driven_loop_runs_one_step_per_call_and_says_when_it_ran_out():
    """Each call lets the loop run to its next pause; a loop that returns while memtrack still
    calls is an error naming the loop and how far it got."""
    done = []
    driven = Driven(lambda: loop(driven, 3, done), "trainer.train()")
    driven.start()  # paused at its begin: nothing stepped yet
    assert done == []
    driven()
    driven()
    assert done == [0, 1] and driven.steps == 2
    driven()
    with pytest.raises(WorkloadError, match=r"trainer.train\(\) ended after 3 optimizer steps"):
        driven()
    with pytest.raises(WorkloadError, match="ended after 3 optimizer steps"):
        driven()  # and every call after it


def loop(driven: Driven, steps: int, done: list[int]) -> None:
    """A training loop as a framework runs it: a pause at its begin, one after each step."""
    driven.pause()
    for i in range(steps):
        done.append(i)
        driven.pause()


def test_a_loops_error_is_raised_by_the_call_and_close_ends_the_loop_at_its_pause():
    def fails() -> None:
        driven.pause()
        driven.pause()
        raise MemoryError("the step ran the host out of memory")

    driven = Driven(fails, "trainer.fit()")
    driven.start()
    driven()
    with pytest.raises(MemoryError, match="ran the host out"):
        driven()

    endless = Driven(lambda: loop(endless, 10**9, []), "trainer.fit()")
    endless.start()
    endless()
    endless.close()
    assert not endless.thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        endless()


def test_each_step_runs_inside_the_scope_set_before_it_in_the_loop_s_thread():
    """memtrack's CPU tracker is per thread: the loop's thread enters the scope around each
    step, the one set when the step begins."""
    entered: list[tuple[str, str]] = []

    class Scope:
        def __init__(self, name: str):
            self.name = name

        def __enter__(self) -> None:
            entered.append((self.name, threading.current_thread().name))

        def __exit__(self, *exc: object) -> None:
            entered.append((f"/{self.name}", threading.current_thread().name))

    driven = Driven(lambda: loop(driven, 5, []), "trainer.train()")
    driven.start()
    driven.scope = lambda: Scope("a")
    driven()
    driven.scope = lambda: Scope("b")
    driven()
    assert entered == [(n, "memtrack-loop") for n in ("a", "/a", "b", "/b")]
    driven.close()


# -- Hugging Face -----------------------------------------------------------------------------

FINE_TUNE = """\
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import memtrack
from memtrack.integrations.huggingface import train_steps
{callback_import}

CONFIG = LlamaConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=4,
)


class Tokens(Dataset):
    def __init__(self, n, length):
        self.ids = torch.randint(0, 512, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {{"input_ids": self.ids[i], "labels": self.ids[i]}}


@memtrack.workload(params={params})
def fine_tune(ctx):
    args = TrainingArguments(
        output_dir=str(ctx.scratch_dir),
        per_device_train_batch_size=4,
        bf16=ctx["bf16"],
        use_cpu=True,
        dataloader_num_workers=2,
        dataloader_persistent_workers=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=LlamaForCausalLM(CONFIG),
        args=args,
        train_dataset=Tokens(16, 32),  # 4 steps an epoch: the loop goes on past its epochs
        callbacks=[{callbacks}],
    )
    return train_steps(ctx, trainer)
"""

KEEPS = """\
import torch
from transformers import TrainerCallback


class KeepsEveryStep(TrainerCallback):
    def __init__(self):
        self.kept = []

    def on_step_end(self, args, state, control, **kwargs):
        self.kept.append(torch.ones(128 * 1024))  # 512 KiB kept by every optimizer step
"""

TOML = (
    'modules = ["wl.py"]\nrepeats = 3\nwarmup = 1\nmin_baseline_runs = 1\ntime_regression = "off"\n'
)


def _repository(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    repo, db = init_repo(tmp_path / "repo"), tmp_path / "memtrack.db"
    for name, text in {**files, "memtrack.toml": TOML, ".gitignore": "__pycache__/\n"}.items():
        (repo / name).write_text(text)
    commit_all(repo, "a trainer's case")
    return repo, db


def _measured(repo: Path, db: Path) -> dict[str, dict]:
    """`memtrack run` of the repository: each case's measurement, by case id."""
    out = repo.parent / "run.json"
    done = memtrack_cli(repo, "run", "--json", str(out), env={**GIT_ENV, "MEMTRACK_DB": str(db)})
    assert done.returncode == 0, done.stdout + done.stderr
    return {m["case_id"]: m for m in json.loads(out.read_text())["measurements"]}


def _param_bytes(model) -> tuple[int, int]:
    """A model's parameters: their bytes and how many tensors hold them."""
    params = list(model.parameters())
    return sum(p.numel() * p.element_size() for p in params), len(params)


def test_a_hugging_face_trainer_is_a_case_in_a_few_lines_with_its_optimizer_and_workers(
    tmp_path,
):
    """`train_steps(ctx, trainer)`: the model and AdamW's state are the persistent set, each
    iteration is an optimizer step inside `train()`, the two DataLoader workers are in the
    process tree, and the declared precision is the trainer's or the case is refused."""
    transformers = pytest.importorskip("transformers")
    params = '{"bf16": [True, False], "precision": "bf16-mixed"}'
    wl = FINE_TUNE.format(callback_import="", params=params, callbacks="")
    repo, db = _repository(tmp_path, {"wl.py": wl})
    measured = _measured(repo, db)
    ok = measured["fine_tune[bf16=True,precision=bf16-mixed]"]
    assert ok["status"] == "ok", ok["message"]
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    weights, tensors = _param_bytes(transformers.LlamaForCausalLM(config))
    assert ok["categories"]["Parameter"] == weights
    # AdamW's two moments of every parameter, and its step count (a 4-byte tensor each)
    assert ok["optimizer_state_bytes"] == 2 * weights + 4 * tensors
    assert ok["dtype"] == "float32"  # bf16 autocast over float32 weights: said by `precision`
    assert not [n for n in ok["notes"] if n.startswith(("dtype", "precision"))], ok["notes"]
    processes = {s["key"] for s in ok["sites"] if s["grouping"] == "process"}
    assert {"main", "pt_data_worker 1", "pt_data_worker 2"} <= processes, processes

    refused = measured["fine_tune[bf16=False,precision=bf16-mixed]"]
    assert refused["status"] == "error"
    assert "param precision='bf16-mixed', but the trainer runs 32-true" in refused["message"]


def test_a_trainer_callback_s_leak_blocks_and_names_the_callback_s_line(tmp_path):
    """A pull request adds a callback that keeps a tensor at every optimizer step: its check
    blocks on the leak and says where, by the callback's file and line."""
    pytest.importorskip("transformers")
    plain = FINE_TUNE.format(callback_import="", params='{"bf16": False}', callbacks="")
    repo, db = _repository(tmp_path, {"wl.py": plain})
    _measured(repo, db)
    git(repo, "checkout", "-q", "-b", "keeps")
    (repo / "callbacks.py").write_text(KEEPS)
    (repo / "wl.py").write_text(
        FINE_TUNE.format(
            callback_import="from callbacks import KeepsEveryStep",
            params='{"bf16": False}',
            callbacks="KeepsEveryStep()",
        )
    )
    commit_all(repo, "a callback that keeps every step's tensor")
    (m,) = _measured(repo, db).values()
    assert m["status"] == "ok", m["message"]
    out = tmp_path / "verdicts.json"
    done = memtrack_cli(repo, "check", "--json", str(out), env={**GIT_ENV, "MEMTRACK_DB": str(db)})
    assert done.returncode == 1, done.stdout + done.stderr
    (leak,) = [v for v in json.loads(out.read_text())["verdicts"] if v["kind"] == "leak"]
    assert "+512.00 KiB in `(no module)` at callbacks.py:on_step_end (line 10)" in leak["message"]


# -- Lightning --------------------------------------------------------------------------------

FIT = """\
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import memtrack
from memtrack.integrations.lightning import fit_steps


class Regressor(L.LightningModule):
    def __init__(self, width):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        # sized by the trainer's own count of steps: finite while memtrack drives the loop
        total = self.trainer.estimated_stepping_batches
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": schedule}


@memtrack.workload(params={"width": 512, "precision": "32-true"})
def fit(ctx):
    g = torch.Generator().manual_seed(ctx.seed)
    data = TensorDataset(torch.randn(64, 64, generator=g), torch.randn(64, 1, generator=g))
    loader = DataLoader(data, batch_size=16, num_workers=2, persistent_workers=True)
    trainer = L.Trainer(
        accelerator="cpu",
        precision=ctx.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,  # 4 steps: lifted, memtrack ends the loop
    )
    return fit_steps(ctx, trainer, Regressor(ctx["width"]), train_dataloaders=loader)
"""


def test_a_lightning_fit_is_a_case_in_a_few_lines_with_its_optimizer_and_workers(tmp_path):
    pytest.importorskip("lightning")
    repo, db = _repository(tmp_path, {"wl.py": FIT})
    (m,) = _measured(repo, db).values()
    assert m["status"] == "ok", m["message"]
    weights = (64 * 512 + 512 + 512 + 1) * 4
    assert m["weights_bytes"] == weights
    assert m["optimizer_state_bytes"] == 2 * weights + 4 * 4  # AdamW's moments, 4 step counts


def test_a_declared_precision_is_one_memtrack_knows_and_a_trainer_is_never_estimated(tmp_path):
    from memtrack.integrations import drive
    from memtrack.workload.context import Context

    assert Context({"precision": "bf16-mixed"}, 0, "cpu", tmp_path).precision == "bf16-mixed"
    assert Context({}, 0, "cpu", tmp_path).precision is None
    with pytest.raises(WorkloadError, match=r"precision='bf16' is not one of .*bf16-mixed"):
        Context({"precision": "bf16"}, 0, "cpu", tmp_path)
    fake = Context({}, 0, "cpu", tmp_path, fake=True)
    started = []
    with pytest.raises(WorkloadError, match=r"trainer.fit\(\) runs in a thread of its own"):
        drive(fake, lambda: started.append(1), "trainer.fit()", lambda d: None)
    assert started == []  # refused before the loop ran


@pytest.mark.gpu
def test_on_a_gpu_a_lightning_fit_counts_its_weights_and_optimizer_state_on_the_device(tmp_path):
    """The trainer's loop runs in its own thread; CUDA's allocator counters are the
    process's, so its figures are the device's, and the breakdown's tracker is entered by
    the loop's thread."""
    pytest.importorskip("lightning")
    wl = FIT.replace('accelerator="cpu"', 'accelerator="gpu", devices=1')
    repo, db = _repository(tmp_path, {"wl.py": wl})
    (repo / "memtrack.toml").write_text(TOML + 'device = "cuda"\n')
    commit_all(repo, "on the GPU")
    (m,) = _measured(repo, db).values()
    assert m["status"] == "ok" and m["device"] == "cuda", m["message"]
    weights = (64 * 512 + 512 + 512 + 1) * 4
    assert weights <= m["weights_bytes"] <= weights + 4 * 512  # CUDA's 512-byte blocks
    assert m["categories"]["Optstate"] >= 2 * weights  # AdamW's moments, on the device
    assert m["peak_allocated_bytes"] >= 4 * weights  # weights, gradients, both moments


def test_a_lightning_case_takes_a_snapshot_of_the_loop_s_step(tmp_path):
    """`memtrack snapshot` on the CPU follows the step into the loop's thread: its peak
    holds the optimizer's state, and its modules are the model's."""
    pytest.importorskip("lightning")
    repo, db = _repository(tmp_path, {"wl.py": FIT})
    db = tmp_path / "db" / "memtrack.db"
    (tmp_path / "snapshots").mkdir()
    out = tmp_path / "snapshots" / "snap.json"  # outside the repository and the database's
    done = memtrack_cli(repo, "snapshot", "fit", "--db", str(db), "--out", str(out), env=GIT_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    snap = json.loads(out.read_text())
    weights = (64 * 512 + 512 + 512 + 1) * 4
    held = 4 * weights + 4 * 4  # weights, gradients, AdamW's moments and step counts
    assert snap["peak_by_category"]["Optstate"] >= 2 * weights
    # above what is held between steps: the step's own tensors, made in the loop's thread
    assert snap["peak_bytes"] > held, snap["peak_by_category"]
    modules = {m["module"] for m in snap["modules"]}
    assert {"Sequential.0", "Sequential.2"} <= modules


LOOP = """\
import memtrack
from memtrack.workload.driven import Driven


@memtrack.workload(params={params}, tolerance={tolerance})
def looped(ctx):
    steps = []

    def loop():
        driven.pause()
        while True:
            steps.append(len(steps))
            driven.pause()

    driven = Driven(loop, "the loop")
    driven.start()
    return driven
"""


@pytest.mark.parametrize(
    "params, tolerance, why",
    [
        ('{"concurrency": 2}', "None", "concurrent sessions cannot share"),
        ("{}", '{"max_abs": 0.0}', "returns no output to compare"),
    ],
)
def test_a_trainer_s_loop_is_refused_with_sessions_or_a_tolerance(tmp_path, params, tolerance, why):
    repo, db = _repository(tmp_path, {"wl.py": LOOP.format(params=params, tolerance=tolerance)})
    out = repo.parent / "run.json"
    done = memtrack_cli(repo, "run", "--json", str(out), env={**GIT_ENV, "MEMTRACK_DB": str(db)})
    (m,) = json.loads(out.read_text())["measurements"]
    assert m["status"] == "error" and why in m["message"], (done.stderr, m["message"])


def test_the_reserved_precision_param_s_reference_is_full_precision():
    from memtrack.workload.registry import _precision

    grid = {"precision": ("bf16-mixed", "32-true"), "batch": (8,)}
    assert _precision("workload 'w'", grid, ()) == {"precision": "32-true"}
    assert _precision("workload 'w'", {"batch": (8,)}, ()) == {}


def test_a_hugging_face_trainer_over_bfloat16_weights_runs_bf16_true(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    from memtrack.integrations.huggingface import precision

    model = torch.nn.Linear(8, 8)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True)
    assert precision(transformers.Trainer(model=model, args=args)) == "bf16-mixed"
    trainer = transformers.Trainer(model=model.to(torch.bfloat16), args=args)
    assert precision(trainer) == "bf16-true"  # autocast over weights already in bfloat16
