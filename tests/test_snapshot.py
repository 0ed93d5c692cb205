"""`memtrack snapshot`: one case's step captured in a private file (a real worker on the CPU),
kept out of the database and the repository; and `memtrack check` pointing to it."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import GiB, commit_all, git, init_repo, make_measurement, make_run

from memtrack.cli import main
from memtrack.judge.decide import CheckResult
from memtrack.judge.verdict import Verdict
from memtrack.report import check as report
from memtrack.store.database import Store

MODULE = "Sequential.0.layers.1.self_attn"  # train_step's second encoder layer's attention


def _memtrack(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _db_bytes(db: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in db.parent.glob(db.name + "*")}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A repository with a recorded database beside it, and a cache folder of its own."""
    base = tmp_path_factory.mktemp("snap")
    repo = init_repo(base / "repo")
    (repo / "README.md").write_text("a project\n")
    commit_all(repo, "first commit")
    db = base / "db" / "memtrack.db"
    with Store.open(db) as store:
        store.write_run(make_run([make_measurement("train_step", {})]))
    return repo, db, base / "cache"


@pytest.fixture(scope="module")
def cpu_snapshot(project):
    repo, db, cache = project
    before = _db_bytes(db)
    result = _memtrack(
        repo, "snapshot", "train_step", "--db", str(db), env={"XDG_CACHE_HOME": str(cache)}
    )
    assert result.returncode == 0, result.stderr
    (path,) = (cache / "memtrack" / "snapshots").iterdir()
    return result, path, before


def test_the_cpu_snapshot_is_private_and_lists_the_models_modules(cpu_snapshot):
    result, path, _ = cpu_snapshot
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.name.startswith("train_step_") and path.suffix == ".json"
    assert str(path) in result.stdout and "open it: a JSON file" in result.stdout
    data = json.loads(path.read_text())
    modules = {m["module"]: m for m in data["modules"]}
    for layer in (0, 1):
        for part in ("self_attn", "linear1", "linear2", "norm1"):
            assert f"Sequential.0.layers.{layer}.{part}" in modules
    # a training step: backward peaks too, and the optimizer's state in the step's peak
    assert modules["Sequential"]["backward_peak"]["Gradient"] > 0
    assert data["peak_by_category"]["Optstate"] > 0
    assert data["peak_bytes"] == max(m["peak_bytes"] for m in data["modules"])
    assert modules[MODULE]["peak_bytes"] > modules[MODULE]["parameters_bytes"] > 0


def test_nothing_of_the_snapshot_reaches_the_database_or_the_repository(project, cpu_snapshot):
    repo, db, _ = project
    _, path, before = cpu_snapshot
    assert MODULE in path.read_text()
    after = _db_bytes(db)
    assert after == before  # not opened: not even its -wal or -shm changed
    assert not any(MODULE.encode() in b for b in after.values())
    assert git(repo, "status", "--porcelain", "--ignored") == ""  # not even a data/ folder


@pytest.mark.parametrize("where", ["data/snap.json", "notes/snap.json", "DB/snap.json"])
def test_out_inside_data_the_database_folder_or_the_repository_is_refused(project, where):
    repo, db, _ = project
    out = str(db.parent / "snap.json") if where.startswith("DB") else where
    before = _db_bytes(db)
    result = _memtrack(repo, "snapshot", "train_step", "--db", str(db), "--out", out)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--out" in result.stderr
    assert not (repo / where).exists() and not (db.parent / "snap.json").exists()
    assert _db_bytes(db) == before


def test_out_never_overwrites_and_an_unknown_case_is_named(project, tmp_path):
    repo, db, _ = project
    existing = tmp_path / "mine.json"
    existing.write_text("keep")
    result = _memtrack(repo, "snapshot", "train_step", "--db", str(db), "--out", str(existing))
    assert result.returncode == 2 and "already exists" in result.stderr
    assert existing.read_text() == "keep"
    result = _memtrack(
        repo, "snapshot", "train_stpe", "--db", str(db), "--out", str(tmp_path / "x.json")
    )
    assert result.returncode == 2 and "no case or workload 'train_stpe'" in result.stderr


RANKS = """\
from pathlib import Path

import torch
import torch.distributed as dist

import memtrack

LEFT = Path({left!r})
_destroy = dist.destroy_process_group


def _leave(*args, **kwargs):  # each rank says that it left its group, then leaves it
    (LEFT / f"rank{{dist.get_rank()}}").touch()
    return _destroy(*args, **kwargs)


dist.destroy_process_group = _leave


@memtrack.workload(params={{"ranks": 2}})
def sharded(ctx):
    model = torch.nn.Linear(64, 64)
    ctx.mark(model)

    def step():
        x = model(torch.ones(8, 64))
        if ctx.rank == 1:  # 4 MiB that only rank 1 holds at its peak
            x = x + torch.ones(2**20).sum()
        dist.all_reduce(x)
        return x.sum()

    return step
"""


def test_a_case_of_two_ranks_writes_one_snapshot_per_rank_and_each_rank_leaves_its_group(
    tmp_path,
):
    # Every rank was given the same path, opened with O_EXCL: rank 1 failed, the case failed,
    # and rank 0's good file was deleted; the ranks exited without the final barrier.
    repo = init_repo(tmp_path / "repo")
    left = tmp_path / "left"
    left.mkdir()
    (repo / "wl.py").write_text(RANKS.format(left=str(left)))
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 1\n')
    commit_all(repo, "two ranks")
    out = tmp_path / "snaps" / "sharded.json"
    out.parent.mkdir()
    db = tmp_path / "db" / "memtrack.db"
    result = _memtrack(repo, "snapshot", "sharded", "--out", str(out), "--db", str(db))
    assert result.returncode == 0, result.stderr
    rank1 = out.with_name("sharded.rank1.json")
    assert sorted(out.parent.iterdir()) == [out, rank1]
    assert f"rank 1 {rank1}" in result.stdout
    peaks = []
    for path in (out, rank1):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        peaks.append(json.loads(path.read_text())["peak_bytes"])
    assert peaks[1] - peaks[0] >= 4 * 2**20  # each file is its own rank's
    assert sorted(p.name for p in left.iterdir()) == ["rank0", "rank1"]  # teardown ran
    assert not db.parent.exists()


def test_a_rank_snapshot_path_that_exists_is_refused_before_anything_runs(tmp_path):
    repo = init_repo(tmp_path / "repo")
    left = tmp_path / "left"
    left.mkdir()
    (repo / "wl.py").write_text(RANKS.format(left=str(left)))
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    commit_all(repo, "two ranks")
    out = tmp_path / "sharded.json"
    taken = tmp_path / "sharded.rank1.json"
    taken.write_text("keep")
    db = tmp_path / "db" / "memtrack.db"
    result = _memtrack(repo, "snapshot", "sharded", "--out", str(out), "--db", str(db))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        f"{taken}: already exists; memtrack never overwrites a file"
    )
    assert taken.read_text() == "keep" and not out.exists()
    assert list(left.iterdir()) == []  # no rank started


def _verdict(case_id: str, metric: str, kind: str, blocking: bool) -> Verdict:
    return Verdict(
        case_id=case_id,
        workload=case_id.partition("[")[0],
        metric=metric,
        kind=kind,
        blocking=blocking,
        candidate_value=float(GiB),
    )


def test_the_report_suggests_a_snapshot_once_under_each_blocked_case():
    verdicts = (
        _verdict("decoder[batch=8]", "allocated", "regression", True),
        _verdict("decoder[batch=8]", "reserved", "over_budget", True),
        _verdict("decoder[batch=1]", "allocated", "ok", False),
        _verdict("loader", "load_host", "over_budget", True),  # the loading, not the step
    )
    result = CheckResult(
        run_id="r" * 32,
        commit="a" * 40,
        branch="pr",
        started_at="",
        fingerprint="f" * 16,
        base_branch="main",
        merge_base="a" * 40,
        baseline_mode="ancestry",
        verdicts=verdicts,
    )
    hint = "To see which allocation: memtrack snapshot 'decoder[batch=8]'"
    text = "\n".join(str(r) for r in report.terminal(result) if not hasattr(r, "columns"))
    assert text.count(hint) == 1
    assert "snapshot 'decoder[batch=1]'" not in text and "snapshot 'loader'" not in text
    md = report.markdown(result)
    assert md.count("To see which allocation: `memtrack snapshot 'decoder[batch=8]'`") == 1
    arithmetic = md.split("The arithmetic of what blocks or warns", 1)[1]
    assert "memtrack snapshot 'decoder[batch=8]'" in arithmetic  # under its blocking item
    assert "snapshot 'loader'" not in md


def test_check_of_a_blocked_case_prints_the_snapshot_command(tmp_path):
    db = tmp_path / "memtrack.db"
    run = make_run([make_measurement("decoder", {"batch": 8}, peak=3 * GiB)], branch="pr")
    with Store.open(db) as store:
        store.write_run(run)
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text(
        '[[budgets]]\nworkload = "decoder"\nmetric = "allocated"\nlimit = "1 GiB"\n'
        'reason = "must fit beside the server"\n'
    )
    md = tmp_path / "verdict.md"
    res = CliRunner().invoke(
        main,
        [
            "check",
            "--config",
            str(cfg),
            "--db",
            str(db),
            "--run",
            run.run_id,
            "--no-record",
            "--markdown",
            str(md),
        ],
    )
    assert res.exit_code == 1, res.output
    assert "To see which allocation: memtrack snapshot 'decoder[batch=8]'" in res.output
    assert md.read_text().count("memtrack snapshot 'decoder[batch=8]'") == 1


@pytest.mark.gpu
def test_the_cuda_snapshot_is_the_allocators_history_for_memory_viz(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / "README.md").write_text("a project\n")
    commit_all(repo, "first commit")
    out = tmp_path / "snap.pickle"
    result = _memtrack(
        repo,
        "snapshot",
        "image_classify",
        "--out",
        str(out),
        "--db",
        str(tmp_path / "db" / "memtrack.db"),
    )
    assert result.returncode == 0, result.stderr
    assert "(cuda," in result.stdout and "https://pytorch.org/memory_viz" in result.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with open(out, "rb") as f:
        snap = pickle.load(f)
    assert snap["segments"]  # the allocator's segments at the end of the step
    actions = {e["action"] for trace in snap["device_traces"] for e in trace}
    assert "alloc" in actions and "free_completed" in actions  # the step's own history
    assert not (tmp_path / "db").exists()


class FakeCudaHistory:
    """torch.cuda's recorder entry points, faked (no GPU here): what the capture asked."""

    def __init__(self, monkeypatch, backend: str = "native"):
        import torch

        self.calls: list[dict] = []
        monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: backend)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(
            torch.cuda.memory,
            "_record_memory_history",
            lambda *args, **kwargs: self.calls.append(kwargs),
        )
        monkeypatch.setattr(
            torch.cuda.memory,
            "_snapshot",
            lambda: {"segments": [], "device_traces": [[{"action": "alloc"}, {"action": "free"}]]},
        )


def test_the_cuda_snapshot_records_python_stacks_only_with_fake_cuda(tmp_path, monkeypatch):
    # torch's default, stacks="all", symbolises every C++ frame: minutes per snapshot
    import torch

    from memtrack.probes.snapshot import capture

    fake = FakeCudaHistory(monkeypatch)
    steps = []
    out = capture(
        lambda: steps.append(1), torch.device("cuda", 0), (), tmp_path / "s.pickle", "case"
    )
    assert steps == [1] and out == {"snapshot_kind": "cuda-memory-history", "snapshot_events": 2}
    assert fake.calls[0]["stacks"] == "python"
    assert fake.calls[-1] == {"enabled": None}  # the recorder is stopped again
    assert stat.S_IMODE((tmp_path / "s.pickle").stat().st_mode) == 0o600


def test_the_cuda_snapshot_refuses_cuda_malloc_async_clearly_with_fake_cuda(tmp_path, monkeypatch):
    import torch

    from memtrack.probes.snapshot import capture

    fake = FakeCudaHistory(monkeypatch, backend="cudaMallocAsync")
    steps = []
    with pytest.raises(
        RuntimeError,
        match="memtrack snapshot needs PyTorch's caching "
        "allocator: this worker runs cudaMallocAsync",
    ):
        capture(lambda: steps.append(1), torch.device("cuda", 0), (), tmp_path / "s.pickle", "case")
    assert steps == [] and fake.calls == [] and not (tmp_path / "s.pickle").exists()


def test_snapshot_refuses_cuda_malloc_async_before_running_the_case_with_a_fake_gpu_env(
    tmp_path, monkeypatch
):
    import dataclasses

    from factories import GPU_ENV

    from memtrack.config import load_config
    from memtrack.errors import ConfigError
    from memtrack.measure import snapshots, suite

    (tmp_path / "wl.py").write_text(
        "import memtrack\n\n@memtrack.workload\ndef w(ctx):\n    return lambda: None\n"
    )
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    config = load_config(tmp_path / "memtrack.toml")
    env = dataclasses.replace(GPU_ENV, cuda_available=True, allocator_backend="cudaMallocAsync")
    monkeypatch.setattr(suite.RunStart, "environment", lambda self: env)
    monkeypatch.setattr(snapshots, "run_case", lambda *a, **k: pytest.fail("a case ran"))
    with pytest.raises(ConfigError, match="backend:cudaMallocAsync, which keeps no allocation"):
        snapshots.take(config, "w", tmp_path / "db" / "m.db", tmp_path / "snap.pickle")
