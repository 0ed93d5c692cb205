"""Builders for records and git repositories, shared by tests and benchmark scripts.

Synthetic records stand in for measured ones only where a test is about storing,
comparing or showing figures, never about measuring them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from memtrack.records import (
    CIInfo,
    DeviceMeasurement,
    Environment,
    GitInfo,
    GpuInfo,
    Measurement,
    RunRecord,
)

MiB = 2**20
GiB = 2**30
HOST_FILE = 90 * MiB
"""File-backed resident pages of a worker (libraries) in made-up measurements."""

CPU_ENV = Environment(
    fingerprint="cpu-env-1",
    torch="2.13.0+cpu",
    python="3.11.7",
    os="Linux",
    cpu="test cpu",
    cpu_count=2,
    host_ram_bytes=24 * GiB,
)
GPU_ENV = Environment(
    fingerprint="h200-env-1",
    gpus=(GpuInfo(0, "NVIDIA H200", "GPU-0000", 141 * GiB, "9.0", "disabled"),),
    driver="580.65",
    cuda_runtime="13.0",
    cudnn="91200",
    torch="2.14.1+cu130",
    python="3.11.7",
    os="Linux",
    cpu="test cpu",
    cpu_count=16,
    host_ram_bytes=128 * GiB,
)


def make_measurement(
    workload: str = "decoder",
    params: dict[str, Any] | None = None,
    *,
    peak: int = 100 * MiB,
    status: str = "ok",
    device: str = "cpu",
    reserved: int | None = None,
    device_peak: int | None = None,
    host: int = 400 * MiB,
    host_step: int = 10 * MiB,
    time_s: float = 0.01,
    samples: tuple[int, ...] | None = None,
    times: tuple[float, ...] | None = None,
    **fields: Any,
) -> Measurement:
    from memtrack.workload.registry import case_id

    params = params if params is not None else {"batch": 1}
    devices: tuple[DeviceMeasurement, ...] = ()
    if device_peak is not None:
        devices = (
            DeviceMeasurement(
                0,
                "GPU-0000",
                "NVIDIA H200",
                141 * GiB,
                600 * MiB,
                device_peak + 600 * MiB,
                device_peak,
                "pid",
                peak,
                reserved,
                100,
            ),
        )
    return Measurement(
        workload=workload,
        case_id=case_id(workload, params),
        params=params,
        seed=0,
        device=device,
        dtype="float32",
        warmup=1,
        repeats=3,
        status=status,
        framework="memtracker" if device == "cpu" else "cuda-caching-allocator",
        peak_allocated_bytes=peak if status == "ok" else None,
        peak_reserved_bytes=reserved,
        persistent_bytes=peak // 4,
        allocated_samples=samples if samples is not None else (peak, peak, peak),
        # `host` is the metric: peak RSS less the file-backed pages (libraries)
        host_peak_rss_bytes=host + HOST_FILE,
        host_step_peak_rss_bytes=host + HOST_FILE,
        host_setup_rss_bytes=host + HOST_FILE - host_step,
        host_file_rss_bytes=HOST_FILE,
        host_peak_source="vmhwm",
        devices=devices,
        device_view="nvml" if devices else None,
        weights_bytes=peak // 4,
        intermediates_bytes=peak - peak // 4,
        iteration_times_s=times if times is not None else (time_s, time_s, time_s),
        time_median_s=time_s,
        time_p95_s=time_s,
        time_min_s=time_s,
        duration_s=2.0,
        **fields,
    )


def make_run(
    measurements: list[Measurement] | tuple[Measurement, ...],
    *,
    commit: str | None = None,
    branch: str = "main",
    started_at: str = "2026-01-01T00:00:00+00:00",
    env: Environment = CPU_ENV,
    merge_base: str | None = None,
    subject: str = "a commit",
    run_id: str | None = None,
    ci: CIInfo | None = None,
) -> RunRecord:
    commit = commit or uuid.uuid4().hex + uuid.uuid4().hex[:8]
    return RunRecord(
        run_id=run_id or uuid.uuid4().hex,
        started_at=started_at,
        finished_at=started_at,
        git=GitInfo(
            commit=commit,
            branch=branch,
            subject=subject,
            dirty=False,
            base_branch="main",
            merge_base=merge_base or commit,
        ),
        ci=ci or CIInfo(),
        environment=env,
        suite_hash="suite",
        config_path=None,
        measurements=tuple(measurements),
    )


def with_env(run: RunRecord, env: Environment) -> RunRecord:
    return replace(run, environment=env)


GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def venv_with_this_environment(venv: Path) -> Path:
    """A fresh venv that sees the packages of the interpreter running the tests (torch,
    Streamlit, ...), as an adopter's machine has them, whatever that interpreter is: its
    system site-packages, and, through a .pth file, its own. `--system-site-packages` alone
    sees the base interpreter's, which are not this one's when the tests run in a venv.
    pip too is this interpreter's (ensurepip would take 2 CPU-s a venv); it installs into the
    venv, whose interpreter runs it. Returns the venv's python."""
    import sys
    import sysconfig

    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "memtrack-tests-parent.pth").write_text("\n".join(sorted(here)) + "\n")
    return python


def memtrack_cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`memtrack ARGS` in a process of its own, in `cwd`, with `env` added to this one's."""
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` with a fixed identity; return stdout stripped."""
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    )
    return out.stdout.strip()


def init_repo(repo: Path, branch: str = "main") -> Path:
    """A new repository that ignores Python's bytecode caches, as every Python project's does.
    A test's workload module is imported from the repository, and where Python writes bytecode
    (unless PYTHONDONTWRITEBYTECODE is set) its `__pycache__/` would be committed by
    `commit_all` and stop a later `git checkout`. It is ignored in `.git/info/exclude`, so that
    the test's own `.gitignore` stays the test's."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", branch)
    (repo / ".git" / "info").mkdir(exist_ok=True)
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("__pycache__/\n")
    return repo


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def committed(folder: Path, message: str = "a suite") -> str:
    """`folder` made a git repository holding what is in it, in one commit: `memtrack run`
    records a run against its commit, and refuses a tree without one."""
    init_repo(folder)
    return commit_all(folder, message)


# -- a realistic history, from real reruns of the shipped suite -----------------------------

RERUNS = Path(__file__).parent / "data" / "reruns.json.gz"
"""Real runs of the shipped example suite on one unchanged commit, every case and figure of
today's records (how they were made: its "how" field; scripts/bench_check.py --reruns N
--save FILE makes another)."""


def read_reruns(path: Path = RERUNS) -> list[RunRecord]:
    import gzip
    import json

    from memtrack.records import run_from_dict

    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return [run_from_dict(r, where=f"{path}: record {i}") for i, r in enumerate(data["records"])]


HISTORY_COMMITS = 150
STEP_AT, STEP_CASE, STEP = 90, "train_step", 0.12
"""From commit 90 on, train_step's allocated peak is 12 % higher (its intermediates)."""
CREEP_FROM, CREEP_CASE, CREEP = 100, "image_classify", 3 * MiB
"""From commit 100 to 150, image_classify's host peak creeps up by 3 MiB in all."""
OOM_AT, OOM_CASE = 120, "decoder_generate"
UPGRADE_AT = 60
"""torch 2.13.0 -> 2.14.0 at commit 60: another environment, its host peak 6 MiB up."""
GROW_PR, GROW_CASE = 7, "sessions=4"
"""Of the ten pull requests the eighth grows decoder_generate[sessions=4]'s KV cache by
2 MiB; the others change nothing."""


def history_commit(i: int) -> str:
    return f"{i:04d}" + "c" * 36


def pr_commit(k: int) -> str:
    return f"{k:04d}" + "f" * 36


def _grow(m: Measurement, delta: int, part: str) -> Measurement:
    return replace(
        m,
        peak_allocated_bytes=m.peak_allocated_bytes + delta,
        allocated_samples=tuple(s + delta for s in m.allocated_samples),
        **{part: (getattr(m, part) or 0) + delta},
    )


def realistic_history(
    store_path: Path, reruns: list[RunRecord] | None = None, check: bool = True
) -> dict[str, Any]:
    """150 main commits, each a real rerun of the shipped suite (drawn in turn from the
    recorded ones, so the noise is real), with what a team's history holds: a +12 %
    allocated step from commit 90 (train_step), a +3 MiB host creep over 100-150
    (image_classify), one OOM (decoder_generate at 120), a torch upgrade at 60, and ten pull
    requests off the newest commits, one growing a KV cache by 2 MiB. Each main commit is
    checked as CI checks a push (base context, verdicts recorded), each pull request as a
    pull request. Without git (the baseline is chosen by commit time, as in a shallow clone).
    Returns the pull requests' run ids and the commits."""
    import random

    from memtrack.config import Config
    from memtrack.judge.check import check as run_check
    from memtrack.report.check import record as record_verdicts
    from memtrack.store.database import Store

    runs = reruns or read_reruns()
    suite = [r for r in runs if len(r.measurements) > 1]
    rng = random.Random(19)
    order: list[RunRecord] = []
    while len(order) < HISTORY_COMMITS + 10:
        order += rng.sample(suite, len(suite))
    config = Config(path=None, root=store_path.parent)
    upgraded = replace(
        suite[0].environment,
        fingerprint=suite[0].environment.fingerprint + "-torch2.14",
        torch="2.14.0+cpu",
    )

    def figures(i: int, src: RunRecord) -> list[Measurement]:
        out = []
        for m in src.measurements:
            if m.workload == STEP_CASE and i >= STEP_AT:
                m = _grow(m, int(m.peak_allocated_bytes * STEP), "intermediates_bytes")
            if i >= UPGRADE_AT:
                m = replace(m, host_peak_rss_bytes=m.host_peak_rss_bytes + 6 * MiB)
            if m.workload == CREEP_CASE and i >= CREEP_FROM:
                m = replace(
                    m,
                    host_peak_rss_bytes=m.host_peak_rss_bytes
                    + CREEP * (i - CREEP_FROM) // (HISTORY_COMMITS - CREEP_FROM),
                )
            if m.workload == OOM_CASE and i == OOM_AT and "sessions=1" in m.case_id:
                m = replace(
                    m,
                    status="oom",
                    peak_allocated_bytes=None,
                    allocated_samples=(),
                    message="CUDA out of memory. Tried to allocate 64.00 MiB",
                    traceback="Traceback (most recent call last):\n  ...\n"
                    "torch.OutOfMemoryError: out of memory",
                )
            out.append(m)
        return out

    def at(i: int, minutes: int = 0) -> str:
        day, minute = divmod(i * 60 + minutes, 24 * 60)
        return (
            f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}T{minute // 60:02d}:"
            f"{minute % 60:02d}:00+00:00"
        )

    prs: list[str] = []
    with Store.open(store_path) as store:
        for i in range(1, HISTORY_COMMITS + 1):
            src = order[i - 1]
            sha = history_commit(i)
            run = replace(
                src,
                run_id=f"{i:04d}" + "d" * 28,
                started_at=at(i, 5),
                finished_at=at(i, 6),
                environment=upgraded if i >= UPGRADE_AT else src.environment,
                git=replace(
                    src.git,
                    commit=sha,
                    branch="main",
                    subject=f"main commit {i}",
                    committed_at=at(i),
                    merge_base=sha,
                    base_branch="main",
                    dirty=False,
                ),
                ci=CIInfo(
                    provider="github-actions",
                    event="push",
                    run_url=f"https://github.com/acme/model/actions/runs/{i}",
                ),
                measurements=tuple(figures(i, src)),
            )
            store.write_run(run)
            if check:
                record_verdicts(store, run_check(store, config, run_id=run.run_id))
        for k in range(10):
            base = HISTORY_COMMITS - 9 + k
            src = order[HISTORY_COMMITS + k]
            ms = figures(base, src)
            if k == GROW_PR:
                ms = [
                    _grow(m, 2 * MiB, "caches_bytes")
                    if GROW_CASE in m.case_id and m.workload == "decoder_generate"
                    else m
                    for m in ms
                ]
            run = replace(
                src,
                run_id=f"{k:04d}" + "e" * 28,
                started_at=at(base, 30 + k),
                finished_at=at(base, 31 + k),
                environment=upgraded,
                git=replace(
                    src.git,
                    commit=pr_commit(k),
                    branch=f"feature/pr-{k}",
                    subject=(
                        "grow the KV cache" if k == GROW_PR else f"a change that keeps memory ({k})"
                    ),
                    committed_at=at(base, 20 + k),
                    merge_base=history_commit(base),
                    base_branch="main",
                    dirty=False,
                ),
                ci=CIInfo(provider="github-actions", event="pull_request", pr_number=100 + k),
                measurements=tuple(ms),
            )
            store.write_run(run)
            if check:
                record_verdicts(store, run_check(store, config, run_id=run.run_id))
            prs.append(run.run_id)
    return {"prs": prs, "grow": prs[GROW_PR], "config": config}


# -- a merge, its revert, and an accepted step: as a reviewer reads them -------------------

STORY_MERGE, STORY_REVERT, STORY_ACCEPT = 9, 10, 15
"""Main commits of `story_history`: decoder's KV cache grows 8 MiB at 9 and is reverted at
10; encoder's new head (+48 MiB allocated, +40 MiB in the step's host growth) is accepted
with a trailer at 15, merged from a pull request that was checked first."""
STORY_REASON = "the new head is the feature"
STORY_RELAND, STORY_LEAK_AT, STORY_LEAK = 12, 17, 2 * MiB
"""With `messier`: decoder's growth re-landed at 12; encoder keeps 2 MiB more each call
from 17."""


def story_history(
    work: Path, until: int = 18, *, also: tuple[Any, ...] = (), messier: bool = False
) -> dict[str, Any]:
    """A real repository and its recorded history, one main commit an hour from
    2026-02-01, each run checked as CI checks a push (verdicts recorded): two cases,
    decoder and encoder, with a merge of +8 MiB to decoder's cache and its revert one
    commit later, then a pull request that grows encoder by one intentional change and
    accepts it with one trailer (`Memtrack-Accept: encoder +64 MiB ...`), checked, then
    merged. `until`: the last main commit recorded (the story so far). `also`: databases
    (paths or server URLs) each run is recorded and checked in too, in the same order;
    `messier`: decoder's cache growth re-landed at STORY_RELAND, and encoder leaking
    STORY_LEAK bytes a call from STORY_LEAK_AT. Returns the repository, the database, the
    config, each main commit's sha by number and each run's id in the order recorded."""
    from memtrack.config import load_config
    from memtrack.judge.check import check as run_check
    from memtrack.report.check import record as record_verdicts
    from memtrack.store.opening import open_store

    repo = init_repo(work / "repo")
    db = work / "memtrack.db"
    (repo / "memtrack.toml").write_text('base_branch = "main"\nmin_baseline_runs = 3\n')
    config = load_config(repo / "memtrack.toml", cwd=repo)
    shas: dict[int, str] = {}

    run_ids: list[str] = []

    def figures(i: int, branch_grows: bool = False) -> list[Measurement]:
        cache = 8 * MiB if i == STORY_MERGE or (messier and i >= STORY_RELAND) else 0
        leaking = messier and i >= STORY_LEAK_AT
        retained = tuple(k * STORY_LEAK for k in range(1, 4)) if leaking else ()
        head = 48 * MiB if i >= STORY_ACCEPT or branch_grows else 0
        noise = (i * 7919 % 5) * 256 * 1024  # host RSS moves a little run to run
        # decoder's allocations move with its sampled lengths: a few discrete values
        jitter = (i * 7919 % 5) * 768 * 1024
        return [
            make_measurement(
                "decoder",
                {"batch": 1},
                peak=900 * MiB + cache + jitter,
                samples=(900 * MiB + cache + jitter,) * 3,
                host=600 * MiB + noise + cache,
                caches_bytes=32 * MiB + cache,
            ),
            make_measurement(
                "encoder",
                {"batch": 8},
                peak=300 * MiB + head,
                host=700 * MiB + noise + head,
                host_step=20 * MiB + 40 * MiB * bool(head),
                retained_samples=retained,
            ),
        ]

    def at(i: int, minute: int = 0) -> str:
        return f"2026-02-01T{i:02d}:{minute:02d}:00+00:00"

    def record(i: int, sha: str, branch: str, ms: list[Measurement], when: str, **kw) -> None:
        committed, subject = git(repo, "show", "-s", "--format=%cI%n%s", sha).splitlines()
        run = make_run(ms, commit=sha, branch=branch, started_at=when, subject=subject, **kw)
        run = replace(run, git=replace(run.git, committed_at=committed))
        run_ids.append(run.run_id)
        for where in (db, *also):
            with open_store(where) as store:
                store.write_run(run)
                record_verdicts(store, run_check(store, config, run_id=run.run_id, root=repo))

    def commit(i: int, message: str, minute: int = 0) -> str:
        os.environ["GIT_COMMITTER_DATE"] = os.environ["GIT_AUTHOR_DATE"] = at(i, minute)
        (repo / "model.py").write_text(f"VERSION = {i}\nminute = {minute}\n")
        return commit_all(repo, message)

    dates = {k: os.environ.get(k) for k in ("GIT_COMMITTER_DATE", "GIT_AUTHOR_DATE")}
    try:
        _story(until, commit, record, figures, at, repo, shas, messier)
    finally:
        for k, v in dates.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {
        "repo": repo,
        "db": db,
        "config": repo / "memtrack.toml",
        "shas": shas,
        "runs": run_ids,
    }


def _story(
    until, commit, record, figures, at, repo: Path, shas: dict[int, str], messier: bool = False
) -> None:
    """The main commits of `story_history`, each recorded and checked."""
    ci = CIInfo(provider="github-actions", event="push")
    for i in range(1, until + 1):
        if i == STORY_MERGE:
            sha = commit(i, "a bigger KV cache for decoder")
        elif i == STORY_REVERT:
            sha = commit(i, 'Revert "a bigger KV cache for decoder"')
        elif messier and i == STORY_RELAND:
            sha = commit(i, 'Reapply "a bigger KV cache for decoder"')
        elif messier and i == STORY_LEAK_AT:
            sha = commit(i, "encoder keeps each call's scores")
        elif i == STORY_ACCEPT:
            git(repo, "checkout", "-q", "-b", "feature/encoder-head")
            pr = commit(
                i - 1,
                f"a wider head for encoder\n\nMemtrack-Accept: encoder +64 MiB {STORY_REASON}",
                minute=30,
            )
            record(
                i,
                pr,
                "feature/encoder-head",
                figures(i - 1, branch_grows=True),
                at(i - 1, 40),
                merge_base=shas[i - 1],
                ci=CIInfo(provider="github-actions", event="pull_request", pr_number=13),
            )
            git(repo, "checkout", "-q", "main")
            os.environ["GIT_COMMITTER_DATE"] = os.environ["GIT_AUTHOR_DATE"] = at(i)
            git(repo, "merge", "-q", "--no-ff", "-m", "Merge feature/encoder-head", pr)
            sha = git(repo, "rev-parse", "HEAD")
        else:
            sha = commit(i, f"main commit {i}")
        shas[i] = sha
        record(i, sha, "main", figures(i), at(i, 5), merge_base=sha, ci=ci)


FED_BY_WORKERS = """\
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import memtrack

CORPUS_MIB = {corpus}  # each worker builds its own copy of the corpus
WORK_S = {work}  # each worker's CPU time per item
corpus = b""


class Items(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.05)  # the workers live at least as long as a few of the tree's samples
        spent = time.process_time() + WORK_S  # and each item costs the worker CPU time
        while time.process_time() < spent:
            pass
        return torch.full((4,), float(i) + len(corpus))


def build_corpus(worker_id):
    global corpus
    corpus = b"\\x01" * (CORPUS_MIB * 2**20)
    with open("/proc/self/smaps_rollup") as f:
        private = sum(int(x.split()[1]) * 1024 for x in f if x.startswith("Private_Dirty:"))
    with open(os.path.join(os.environ["REFERENCE_DIR"], f"worker-{{worker_id}}"), "w") as f:
        f.write(str(private))


@memtrack.workload
def feed(ctx):
    loader = DataLoader(
        Items(), batch_size=2, num_workers=2, persistent_workers=True, worker_init_fn=build_corpus
    )

    def step():
        return sum(float(b.sum()) for b in loader)

    return step
"""
FED_BY_WORKERS_CONFIG = 'modules = ["wl.py"]\nrepeats = 3\nwarmup = 1\ntime_regression = "off"\n'


def fed_by_workers(
    root: Path, corpora: dict[str, int], work_s: float
) -> tuple[Path, Path, dict[str, dict[str, int]]]:
    """A repository whose case `feed` iterates a DataLoader with two persistent worker
    processes, each spending `work_s` of its own CPU time per item and building its own copy
    of a corpus: one commit per entry of `corpora` (branch name -> MiB per worker; the first
    on main, each later one on a branch of its own from the one before), each recorded by
    `memtrack run`. Returns the repository, the database and, by branch, what each worker
    wrote down of its private memory once its corpus was built."""
    repo, db = init_repo(root / "repo"), root / "memtrack.db"
    (repo / "memtrack.toml").write_text(FED_BY_WORKERS_CONFIG)
    (repo / ".gitignore").write_text("__pycache__/\n")
    references = {}
    for i, (name, corpus) in enumerate(corpora.items()):
        if i:
            git(repo, "checkout", "-q", "-b", name)
        (repo / "wl.py").write_text(FED_BY_WORKERS.format(corpus=corpus, work=work_s))
        commit_all(repo, f"corpus of {corpus} MiB per worker")
        out = root / f"reference-{name}"
        out.mkdir()
        ran = memtrack_cli(repo, "run", "--db", str(db), env={"REFERENCE_DIR": str(out)})
        if ran.returncode != 0:
            raise RuntimeError(f"memtrack run failed: {ran.stdout}{ran.stderr}")
        references[name] = {f.name: int(f.read_text()) for f in out.iterdir()}
    return repo, db, references
