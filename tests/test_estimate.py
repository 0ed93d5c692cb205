"""`memtrack estimate`: predicted peaks under fake tensors, against `memtrack run`'s measured
ones on the shipped examples, and kept out of everything that judges."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import (
    CPU_ENV,
    GPU_ENV,
    MiB,
    commit_all,
    git,
    init_repo,
    make_measurement,
    make_run,
)

from memtrack.cli import main
from memtrack.config import load_config
from memtrack.errors import RecordError
from memtrack.measure.forkserver import SPAWN_VARIABLE
from memtrack.records import run_from_dict, to_dict
from memtrack.store.database import Store
from memtrack.units import format_size
from memtrack.workload.registry import discover, select_cases

# The shipped examples, at params that keep the test short (the same models, smaller
# inputs), measured once after one warm-up.
CONFIG = """\
modules = ["memtrack.examples", "workloads.py"]
database = "memtrack.db"
warmup = 1
repeats = 1
timeout = "5 min"

[workloads.decoder_generate]
params = {max_len = 128, new_tokens = 8}

[workloads.train_step]
params = {batch = 8}

[workloads.image_classify]
params = {resolution = 96}
"""

# Workloads whose shapes depend on tensor values: fake tensors cannot follow them.
WORKLOADS = """\
import torch
import memtrack


@memtrack.workload()
def keep_positive(ctx):
    x = ctx.randn(64)
    ctx.mark()
    return lambda: x[torch.nonzero(x > 0).squeeze(1)].sum()


@memtrack.workload()
def sized_by_value(ctx):
    x = ctx.randint(100, 4)
    ctx.mark()
    return lambda: torch.zeros(int(x.sum().item()) + 1)
"""

SHIPPED = ("decoder_generate", "train_step", "image_classify")


def _invoke(repo: Path, *args: str):
    return CliRunner().invoke(
        main, [*args, "--config", str(repo / "memtrack.toml")], catch_exceptions=False
    )


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory):
    """One commit of a repository using the shipped examples (and two unfakeable
    workloads), measured by `memtrack run` and estimated by `memtrack estimate`, both into
    one database."""
    repo = init_repo(tmp_path_factory.mktemp("estimate") / "repo")
    (repo / "memtrack.toml").write_text(CONFIG)
    (repo / "workloads.py").write_text(WORKLOADS)
    commit_all(repo, "workloads")
    # The unfakeable workloads are only estimated (measuring them proves nothing here).
    measured = _invoke(repo, "run", *(arg for w in SHIPPED for arg in ("-k", w)))
    assert measured.exit_code == 0, measured.output
    estimated = _invoke(repo, "estimate")
    assert estimated.exit_code == 0, estimated.output
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        runs = [store.get_run(r) for r in store.run_ids()]
    by_kind = {run.measurements[0].kind: run for run in runs}
    assert len(runs) == 2 and set(by_kind) == {"measured", "estimate"}
    return repo, by_kind["measured"], by_kind["estimate"], estimated.output


def _case(run, workload: str, **params):
    found = [
        m
        for m in run.measurements
        if m.workload == workload and all(m.params.get(k) == v for k, v in params.items())
    ]
    assert len(found) == 1, [m.case_id for m in run.measurements]
    return found[0]


@pytest.mark.parametrize(
    "workload,params",
    [
        ("decoder_generate", {"sessions": 1}),
        ("decoder_generate", {"sessions": 4}),
        ("train_step", {}),
        ("image_classify", {}),
    ],
)
def test_the_shipped_examples_are_estimated_within_ten_percent(suite, workload, params):
    _, measured, estimate, _ = suite
    m, e = _case(measured, workload, **params), _case(estimate, workload, **params)
    assert e.case_id == m.case_id and e.kind == "estimate" and m.kind == "measured"
    assert e.status == "ok", e.message
    assert e.framework == "fake-tensor-estimate" and e.device == "cpu"
    # Fake tensors are tensor memory: the measured CPU figure is the allocator's, which
    # also holds scratch that kernels allocate inside themselves (unattributed), and the
    # estimate adds what the measured run of the same commit saw beyond the fake tensors.
    tensors = m.peak_allocated_bytes - (m.unattributed_bytes or 0)
    fake = e.peak_allocated_bytes - e.scratch_bytes
    assert abs(fake / tensors - 1) <= 0.10, (fake, tensors)
    assert e.scratch_run_id == measured.run_id
    assert e.peak_allocated_bytes == max(m.peak_allocated_bytes, fake)
    # The parts have the measured breakdown's names, and add up to the estimate.
    assert e.weights_bytes == m.weights_bytes
    assert e.inputs_bytes == m.inputs_bytes  # the batch made in setup, fake or real
    parts = (
        e.weights_bytes,
        e.inputs_bytes,
        e.caches_bytes,
        e.gradients_bytes,
        e.optimizer_state_bytes,
        e.intermediates_bytes,
        e.unattributed_bytes,
    )
    assert sum(parts) == e.peak_allocated_bytes


def test_training_state_and_caches_are_estimated_apart(suite):
    _, measured, estimate, _ = suite
    m, e = _case(measured, "train_step"), _case(estimate, "train_step")
    # AdamW's state is made by the warm-up's first step: two moments per parameter byte,
    # and a step count per parameter.
    assert e.optimizer_state_bytes == m.optimizer_state_bytes > 2 * e.weights_bytes
    assert e.gradients_bytes == m.gradients_bytes
    for sessions in (1, 4):
        md, ed = (_case(r, "decoder_generate", sessions=sessions) for r in (measured, estimate))
        assert ed.caches_bytes == md.caches_bytes > 0


def test_a_data_dependent_op_is_an_error_naming_it_and_the_rest_still_estimate(suite):
    _, measured, estimate, output = suite
    nonzero = _case(estimate, "keep_positive")
    assert nonzero.status == "error"
    assert nonzero.message.startswith(
        "cannot be faked: aten.nonzero.default has a data-dependent output shape"
    ), nonzero.message
    item = _case(estimate, "sized_by_value")
    assert item.status == "error"
    assert item.message.startswith(
        "cannot be faked: aten._local_scalar_dense.default reads a tensor's value (e.g. .item()"
    ), item.message
    # ...and where, in the workload's own code (not torch's or memtrack's)
    for m, code in (
        (item, "return lambda: torch.zeros(int(x.sum().item()) + 1)"),
        (nonzero, "return lambda: x[torch.nonzero(x > 0).squeeze(1)].sum()"),
    ):
        line = WORKLOADS.splitlines().index(f"    {code}") + 1
        assert m.message.endswith(f" at workloads.py:{line}: {code}"), m.message
    # every shipped case
    assert sum(m.status == "ok" for m in estimate.measurements) == 8
    assert "cannot be faked: aten.nonzero.default" in output
    # The shipped loading example writes its checkpoint in setup and loads it: under fake
    # tensors the checkpoint keeps their shapes, and the load makes new ones, as measured.
    # (scripts/bench_estimate.py holds it to the measured figure)
    checkpoint = _case(estimate, "load_checkpoint")
    assert checkpoint.status == "ok", checkpoint.message
    weights = 12 * (1024 * 1024 + 1024) * 4  # the loaded model alone: the saved one is gone
    assert checkpoint.weights_bytes == weights
    assert weights < checkpoint.peak_allocated_bytes < weights + 2**20


def test_show_labels_an_estimate_run_and_puts_the_estimate_beside_a_measured_run(suite):
    repo, measured, estimate, _ = suite
    db = str(repo / "memtrack.db")
    shown = _invoke(repo, "show", estimate.run_id, "--db", db)
    assert shown.exit_code == 0, shown.output
    assert f"estimate run {estimate.run_id[:12]}" in shown.output
    assert "(estimate, not measured)" in shown.output
    assert "host peak" not in shown.output  # nothing was measured
    shown = _invoke(repo, "show", measured.run_id, "--db", db)
    assert shown.exit_code == 0, shown.output
    m, e = _case(measured, "train_step"), _case(estimate, "train_step")
    ratio = e.peak_allocated_bytes / m.peak_allocated_bytes
    assert f"estimate / measured {ratio:.3f}" in shown.output
    assert f"estimate run {estimate.run_id[:12]}" in shown.output


def test_check_shows_the_estimate_beside_the_measured_figure_and_never_judges_it(suite):
    repo, measured, estimate, _ = suite
    db = str(repo / "memtrack.db")
    # Without --run: the commit's measured run is checked, not its newer estimate run.
    res = _invoke(repo, "check", "--db", db, "--no-record")
    assert res.exit_code == 0, res.output
    assert f"run {measured.run_id[:12]}" in res.output
    m, e = _case(measured, "image_classify"), _case(estimate, "image_classify")
    pct = 100.0 * (e.peak_allocated_bytes / m.peak_allocated_bytes - 1)
    assert f"estimate · {m.case_id} · estimate " in res.output
    assert f"(measured {m.peak_allocated_bytes / MiB:.2f} MiB, {pct:+.2f}%)" in res.output
    res = _invoke(repo, "check", "--db", db, "--run", estimate.run_id, "--no-record")
    assert res.exit_code == 0, res.output
    assert "is an estimate run" in res.output and "nothing is judged" in res.output
    assert "estimate run: nothing measured, nothing judged (8 case(s) estimated)" in res.output
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        history = store.history("image_classify")
    assert [r["run_id"] for r in history] == [measured.run_id]


def _estimates_on_main(tmp_path: Path) -> tuple[Path, Path, str]:
    """A repository whose main holds three estimate runs of a 100 MiB case, and nothing
    measured."""
    repo = init_repo(tmp_path / "repo")
    db = tmp_path / "memtrack.db"
    (repo / "memtrack.toml").write_text('base_branch = "main"\nmin_baseline_runs = 1\n')
    (repo / "model.py").write_text("V = 0\n")
    base = commit_all(repo, "main")
    estimate = [dataclasses.replace(make_measurement(peak=100 * MiB), kind="estimate")]
    with Store.open(db) as store:
        for minute in range(3):
            store.write_run(
                make_run(
                    estimate,
                    commit=base,
                    branch="main",
                    started_at=f"2026-01-01T00:0{minute}:00+00:00",
                )
            )
    return repo, db, base


def test_an_estimate_on_main_is_never_a_baseline(tmp_path, monkeypatch):
    """Estimates of a 100 MiB case on main, then a PR measured at 200 MiB: with the
    estimates as a baseline that is a regression; without, the case is new."""
    repo, db, base = _estimates_on_main(tmp_path)
    monkeypatch.chdir(repo)
    res = _invoke(repo, "check", "--db", str(db))
    assert res.exit_code == 0, res.output
    assert "is an estimate run" in res.output
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "model.py").write_text("V = 1\n")
    pr = commit_all(repo, "grow")
    with Store.open(db) as store:
        store.write_run(
            make_run(
                [make_measurement(peak=200 * MiB)],
                commit=pr,
                branch="feature",
                merge_base=base,
                started_at="2026-01-01T00:10:00+00:00",
            )
        )
    res = _invoke(repo, "check", "--db", str(db))
    assert res.exit_code == 0, res.output
    assert "new: no baseline on main" in res.output and "regression" not in res.output
    # the estimate is of the merge-base, not of the commit checked: said so
    assert (
        f"estimate of commit {base[:12]} (not the one checked) 100.00 MiB (tensors only: "
        "excludes kernel scratch) (measured 200.00 MiB, -50.00%)"
    ) in res.output
    from memtrack.store import browse as queries

    with Store.open(db, readonly=True) as store:
        series = queries.series(store.conn, "decoder[batch=1]")
        marks = queries.series(store.conn, "decoder[batch=1]", kind="estimate")
    assert [r["git_commit"] for r in series] == [pr]
    assert len(marks) == 3 and {r["kind"] for r in marks} == {"estimate"}


def test_a_pull_request_shows_estimates_of_its_commit_or_its_merge_base_only(tmp_path, monkeypatch):
    """Estimates of the merge-base on main (100 MiB), and a newer one of a commit of an
    unrelated branch (80 MiB): the pull request's report shows the merge-base's, never the
    other branch's; with only the other branch's, it shows none."""
    repo, db, base = _estimates_on_main(tmp_path)
    git(repo, "checkout", "-q", "-b", "elsewhere")
    (repo / "model.py").write_text("V = 2\n")
    other = commit_all(repo, "an unrelated branch")
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "model.py").write_text("V = 1\n")
    pr = commit_all(repo, "grow")
    monkeypatch.chdir(repo)
    alone = tmp_path / "without-the-merge-base.db"
    for path in (db, alone):
        with Store.open(path) as store:
            store.write_run(
                make_run(
                    [dataclasses.replace(make_measurement(peak=80 * MiB), kind="estimate")],
                    commit=other,
                    branch="elsewhere",
                    started_at="2026-01-01T00:09:00+00:00",
                )
            )
            store.write_run(
                make_run(
                    [make_measurement(peak=200 * MiB)],
                    commit=pr,
                    branch="feature",
                    merge_base=base,
                    started_at="2026-01-01T00:10:00+00:00",
                )
            )
    res = _invoke(repo, "check", "--db", str(db), "--no-record")
    assert res.exit_code == 0, res.output
    assert f"estimate of commit {base[:12]} (not the one checked) 100.00 MiB" in res.output
    assert other[:12] not in res.output and "80.00 MiB" not in res.output
    res = _invoke(repo, "check", "--db", str(alone), "--no-record")
    assert res.exit_code == 0, res.output
    assert "estimate" not in res.output and other[:12] not in res.output


def test_history_of_the_base_branch_has_no_estimate_in_it(tmp_path, monkeypatch):
    """Five measured commits at 100 MiB on main, then estimates of 200 MiB on two more:
    as points of the series they would be a step and a creep."""
    repo = init_repo(tmp_path / "repo")
    db = tmp_path / "memtrack.db"
    (repo / "memtrack.toml").write_text('base_branch = "main"\ncreep_anchor = 6\n')
    with Store.open(db) as store:
        for i in range(7):
            (repo / "f.txt").write_text(str(i))
            stamp = f"2026-01-01T00:{i:02d}:00+00:00"
            monkeypatch.setenv("GIT_COMMITTER_DATE", stamp)
            monkeypatch.setenv("GIT_AUTHOR_DATE", stamp)
            sha = commit_all(repo, f"change {i}")
            m = make_measurement(peak=100 * MiB)
            if i >= 5:
                m = dataclasses.replace(make_measurement(peak=200 * MiB), kind="estimate")
            store.write_run(make_run([m], commit=sha, branch="main", started_at=stamp))
    monkeypatch.chdir(repo)
    res = _invoke(repo, "check", "--db", str(db), "--history")
    assert res.exit_code == 0, res.output
    assert "0 step(s)" in res.output and "200.00 MiB" not in res.output


def test_history_marks_estimates_apart_from_the_series(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    import sys

    from streamlit.testing.v1 import AppTest

    repo, db, _ = _estimates_on_main(tmp_path)
    with Store.open(db) as store:
        for minute in (10, 11):
            store.write_run(
                make_run(
                    [make_measurement(peak=200 * MiB)],
                    branch="main",
                    started_at=f"2026-01-01T00:{minute}:00+00:00",
                )
            )
    app = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    monkeypatch.setattr(
        sys, "argv", [str(app), "--db", str(db), "--config", str(repo / "memtrack.toml")]
    )
    at = AppTest.from_file(str(app), default_timeout=60)
    at.query_params["page"] = "history"
    at.query_params["case"] = "decoder[batch=1]"
    at = at.run()
    assert not at.exception, [e.message for e in at.exception]
    panel = ET.fromstring(next(e.value for e in at.markdown if e.value.startswith("<svg")))
    assert panel.get("data-metric") == "allocated"
    drawn = [
        (e.get("class"), e.get("data-kind"), int(e.get("data-bytes")))
        for e in panel.iter()
        if e.get("data-bytes") and (e.get("class") or "").startswith(("point", "mark"))
    ]
    # The series: the two measured runs only; the estimates: three marks of their own.
    assert [b for c, _, b in drawn if c == "point base"] == [200 * MiB, 200 * MiB]
    assert [(k, b) for c, k, b in drawn if c == "mark"] == [("estimate", 100 * MiB)] * 3
    captions = "\n".join(str(c.value) for c in at.caption)
    assert "estimates (fake tensors, not measured)" in captions
    # the latest estimate's drift from the latest measured figure, and what it holds
    assert (
        "100.00 MiB, tensors only, excludes kernel scratch; estimate / measured 0.500, "
        "against the latest measured run"
    ) in captions, captions
    with Store.open(db, readonly=True) as store:
        oldest = store.run_ids()[-1]
    at = AppTest.from_file(str(app), default_timeout=60)
    at.query_params["page"] = "run-detail"
    at.query_params["run"] = oldest
    at = at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("An estimate run" in str(i.value) for i in at.info)


def _weights(run, workload: str) -> int:
    return _case(run, workload).categories["Parameter"]


def test_bf16_halves_the_weights_of_a_float32_model_and_cuda_says_what_it_lacks(suite):
    import torch

    from memtrack.examples.vision import _convnet

    repo, _, estimate, _ = suite
    db = str(repo / "memtrack.db")
    res = _invoke(
        repo, "estimate", "-k", "image_classify", "--dtype", "bf16", "--db", db, "--device", "cuda"
    )
    assert res.exit_code == 0, res.output
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        cuda = store.get_run(store.run_ids(limit=1)[0])
    params = sum(p.numel() for p in _convnet(16, 1000).parameters())
    assert _weights(estimate, "image_classify") == 4 * params
    (m,) = cuda.measurements
    assert m.case_id.endswith("dtype=bfloat16,resolution=96,width=16]") and m.device == "cuda"
    if torch.backends.cuda.is_built():
        # A CUDA build without a GPU (no driver) estimates too: inputs are seeded on the CPU.
        assert m.status == "ok", m.message
        # On CUDA the tracker rounds each storage up to the allocator's 512 B, as it does.
        rounded = sum(-(-p.numel() * 2 // 512) * 512 for p in _convnet(16, 1000).parameters())
        assert m.categories["Parameter"] == rounded
    else:
        assert m.status == "error"
        assert m.message.startswith(
            f"this torch build has no CUDA support: torch "
            f"{torch.__version__} cannot run ops on fake CUDA "
            "tensors ("
        ), m.message
    res = _invoke(repo, "estimate", "-k", "image_classify", "--dtype", "bf16", "--db", db)
    assert res.exit_code == 0, res.output
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        bf16 = store.get_run(store.run_ids(limit=1)[0])
    assert bf16.measurements[0].dtype == "bfloat16"
    assert _weights(bf16, "image_classify") == 2 * params


@pytest.mark.parametrize(
    "args,message",
    [
        (("--dtype", "float33"), "--dtype: 'float33' is not one of float32, fp32,"),
        (("--device", "tpu"), "--device: 'tpu' is not one of cpu, cuda"),
        (("-k", "no such case"), "no case matches no such case"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "memtrack.toml").write_text('modules = ["memtrack.examples"]\n')
    db = tmp_path / "m.db"
    res = CliRunner().invoke(
        main, ["estimate", "--config", str(tmp_path / "memtrack.toml"), "--db", str(db), *args]
    )
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert not db.exists()


def test_a_record_of_another_kind_is_refused():
    run = make_run([make_measurement()], env=CPU_ENV)
    data = to_dict(run)
    assert run_from_dict(data).measurements[0].kind == "measured"
    data["measurements"][0]["kind"] = "guess"
    with pytest.raises(RecordError, match="kind: 'guess' is not one of measured, estimate"):
        run_from_dict(data)


@pytest.mark.gpu
def test_a_cuda_estimate_on_a_gpu_machine(tmp_path):
    (tmp_path / "memtrack.toml").write_text(
        textwrap.dedent("""\
        modules = ["memtrack.examples"]
        [workloads.image_classify]
        params = {resolution = 96}
        """)
    )
    db = tmp_path / "m.db"
    res = CliRunner().invoke(
        main,
        [
            "estimate",
            "--config",
            str(tmp_path / "memtrack.toml"),
            "--db",
            str(db),
            "-k",
            "image_classify",
            "--device",
            "cuda",
        ],
    )
    assert res.exit_code == 0, res.output
    with Store.open(db, readonly=True) as store:
        (m,) = store.get_run(store.run_ids(limit=1)[0]).measurements
    assert m.status == "ok" and m.device == "cuda" and m.kind == "estimate", m.message
    assert m.weights_bytes > 0 and m.peak_allocated_bytes > m.weights_bytes


def test_concurrent_sessions_overlap_in_the_estimate_instead_of_adding_up(tmp_path):
    """N sessions started together overlap: the estimate holds the weights once, every
    session's cache, and lies above one session but below N sessions each at its peak
    (the sum the estimate gave before), and a note says how it was modelled."""
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text(
        'modules = ["memtrack.examples"]\nwarmup = 1\nrepeats = 1\n'
        "[workloads.decoder_serve]\nparams = {concurrency = [1, 3], max_len = 64, "
        "new_tokens = 4}\n"
    )
    commit_all(repo, "config")
    res = _invoke(
        repo, "estimate", "-k", "decoder_serve", "--json", str(tmp_path / "e.json"), "--no-db"
    )
    assert res.exit_code == 0, res.output
    run = run_from_dict(json.loads((tmp_path / "e.json").read_text()))
    one, three = (_case(run, "decoder_serve", concurrency=n) for n in (1, 3))
    assert one.status == three.status == "ok"
    assert one.weights_bytes == three.weights_bytes > 0
    step = one.peak_allocated_bytes - one.persistent_bytes
    summed = three.persistent_bytes + 3 * step
    assert one.peak_allocated_bytes < three.peak_allocated_bytes < summed
    assert three.caches_bytes == 3 * one.caches_bytes  # every session's cache is held
    parts = (
        three.weights_bytes,
        three.inputs_bytes,  # the prompts, made in setup: shared
        three.caches_bytes,
        three.intermediates_bytes,
    )
    assert sum(parts) + (three.unattributed_bytes or 0) == three.peak_allocated_bytes
    assert any(n.startswith("concurrency 3: the sessions modelled in step") for n in three.notes)


def test_an_estimate_for_cuda_never_asks_for_a_cuda_generator_with_a_fake_driverless_build(
    tmp_path, monkeypatch
):
    # A CUDA build of torch without a driver refuses a CUDA generator (torch's words below);
    # the estimate's seeded inputs come from a CPU one, which fake ops take for any device.
    import torch

    real = torch.Generator

    def generator(device="cpu"):
        if torch.device(device).type == "cuda":
            raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")
        return real(device=device)

    monkeypatch.setattr(torch, "Generator", generator)
    from memtrack.workload.context import Context

    ctx = Context({}, 3, "cuda:0", tmp_path, fake=True)
    assert ctx.generator(offset=1).initial_seed() == 4
    with pytest.raises(RuntimeError, match="CUDA driver version is insufficient"):
        Context({}, 3, "cuda:0", tmp_path).generator()  # measured on a GPU: the device's own


def test_backward_on_fake_cuda_without_a_gpu_is_named_as_what_cannot_be_estimated():
    from memtrack.worker.estimate import describe

    # autograd's engine, on a CUDA build without a driver, over fake CUDA tensors
    message = describe(RuntimeError("hasPrimaryContext expects a valid device index"))
    assert message.startswith(
        "cannot be estimated: backward on fake CUDA tensors needs a CUDA device"
    )
    assert "--device cpu" in message


@pytest.mark.gpu
def test_a_cuda_estimate_where_torch_sees_no_gpu(tmp_path):
    # A CUDA build with no device to use (CUDA_VISIBLE_DEVICES empty stands for a machine
    # without a driver): the README's path, `estimate --device cuda`, still estimates.
    import os
    import subprocess
    import sys

    (tmp_path / "memtrack.toml").write_text(
        textwrap.dedent("""\
        modules = ["memtrack.examples"]
        [workloads.image_classify]
        params = {resolution = 96}
        """)
    )
    out = tmp_path / "estimate.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "memtrack.cli",
            "estimate",
            "--config",
            str(tmp_path / "memtrack.toml"),
            "-k",
            "image_classify",
            "--device",
            "cuda",
            "--no-db",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (m,) = json.loads(out.read_text())["measurements"]
    assert m["status"] == "ok" and m["device"] == "cuda", m["message"]


HISTOGRAM = """\
import torch
import memtrack


@memtrack.workload()
def histogram(ctx):
    points = ctx.randn(4096, 2)
    ctx.mark()
    return lambda: torch.histogramdd(points, bins=[8, 8]).hist
"""


def test_an_op_without_a_fake_kernel_is_named_and_never_run_for_real(tmp_path):
    # aten._histogramdd_bin_edges has no meta kernel in torch 2.13: FakeTensorMode's default
    # fallback ran the real kernel on real zero-filled tensors of the full size (on the GPU,
    # where there is one), and the estimate read "ok". Now it is an error naming the op.
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('modules = ["workloads.py"]\nwarmup = 1\nrepeats = 1\n')
    (repo / "workloads.py").write_text(HISTOGRAM)
    commit_all(repo, "a histogram")
    res = _invoke(repo, "estimate", "--json", str(tmp_path / "e.json"), "--no-db")
    assert res.exit_code == 0, res.output
    (m,) = run_from_dict(json.loads((tmp_path / "e.json").read_text())).measurements
    assert m.status == "error"
    assert m.message.startswith(
        "cannot be faked: aten._histogramdd_bin_edges.default has no fake (meta) kernel in "
    ), m.message
    code = "return lambda: torch.histogramdd(points, bins=[8, 8]).hist"
    line = HISTOGRAM.splitlines().index(f"    {code}") + 1
    assert m.message.endswith(f" at workloads.py:{line}: {code}"), m.message


# -- calibration: the kernel scratch no fake tensor holds, from a measured run --------------

TINY = """\
modules = ["memtrack.examples"]
database = "memtrack.db"
warmup = 1
repeats = 1

[workloads.image_classify]
params = {resolution = 64, batch = 2}
"""


def _estimate_one(repo: Path, workload: str):
    out = repo / "estimate.json"
    res = _invoke(repo, "estimate", "-k", workload, "--json", str(out))
    assert res.exit_code == 0, res.output
    run = run_from_dict(json.loads(out.read_text()))
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        assert store.get_run(run.run_id) == run  # recorded as it was written
    return _case(run, workload), res.output, run.run_id


def _foreign_measured_runs(db: Path, case) -> None:
    """Measured runs newer than any real one that must never calibrate an estimate of the
    CPU case `case`: the same case on a GPU, and the same workload at other params."""
    other_params = {**case.params, "resolution": case.params["resolution"] * 2}
    with Store.open(db) as store:
        for m, env in (
            (make_measurement(case.workload, case.params, peak=900 * MiB, device="cuda"), GPU_ENV),
            (make_measurement(case.workload, other_params, peak=900 * MiB), CPU_ENV),
        ):
            store.write_run(make_run([m], started_at="2099-01-01T00:00:00+00:00", env=env))


def test_an_estimate_adds_the_kernel_scratch_of_a_measured_run_of_its_case_and_names_it(
    tmp_path,
):
    """Without a measured run of the case on the CPU the estimate says it excludes kernel
    scratch (a GPU run of it, or a run at other params, never calibrates it); after
    `memtrack run` it adds what that run measured beyond the fake tensors, names the run,
    lands within 5 % of its peak, and keeps the fake tensors' own figure apart."""
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text(TINY)
    commit = commit_all(repo, "config")
    # no measured run of the case on the CPU: only runs of it on a GPU and at other params
    config = load_config(repo / "memtrack.toml")
    (case,) = [c for c in select_cases(discover(config)) if c.workload == "image_classify"]
    _foreign_measured_runs(repo / "memtrack.db", case)
    before, shown, _ = _estimate_one(repo, "image_classify")
    assert before.status == "ok" and before.scratch_bytes is None
    assert before.scratch_run_id is None
    assert any(
        n == "excludes kernel scratch: no measured run of this case on the CPU to calibrate it from"
        for n in before.notes
    ), before.notes
    assert "excluded" in shown and "excludes kernel scratch" in shown

    measured = _invoke(repo, "run", "-k", "image_classify")
    assert measured.exit_code == 0, measured.output
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        (run_id,) = store.run_ids(commit=commit, measured=True)
        m = _case(store.get_run(run_id), "image_classify")
    e, shown, estimate_run = _estimate_one(repo, "image_classify")
    assert e.scratch_run_id == run_id  # not the newer GPU run, nor the other params'
    assert abs(e.peak_allocated_bytes / m.peak_allocated_bytes - 1) <= 0.05
    # the fake tensors' own figure is kept: the estimate less its scratch
    assert e.peak_allocated_bytes - e.scratch_bytes == before.peak_allocated_bytes
    assert e.scratch_bytes == max(0, m.peak_allocated_bytes - before.peak_allocated_bytes)
    note = (
        f"+{format_size(e.scratch_bytes)} kernel scratch, from run {run_id[:12]} "
        f"({commit[:7]}): its measured peak {format_size(m.peak_allocated_bytes)} less these "
        f"fake tensors' {format_size(before.peak_allocated_bytes)}, of the same commit"
    )
    assert note in e.notes, e.notes
    assert f"kernel scratch from measured run {run_id[:12]}" in shown
    # `show` of the measured run: the estimate beside it, and the tensors' own drift
    res = _invoke(repo, "show", run_id)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    drift = (before.peak_allocated_bytes) / m.peak_allocated_bytes
    assert f"(tensors alone {drift:.3f}), calibrated from this run" in flat, flat
    # ... and `show` of the estimate run: the measured figure beside it
    res = _invoke(repo, "show", estimate_run)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    ratio = e.peak_allocated_bytes / m.peak_allocated_bytes
    assert f"{run_id[:12]} of {commit[:12]}); estimate / measured {ratio:.3f} (tensors" in flat

    # Other code (a new commit): the measured run's own scratch, beyond the tensors it
    # tracked, so that a change in the tensors since is not calibrated away.
    (repo / "notes.txt").write_text("a change\n")
    later = commit_all(repo, "later")
    e2, _, _ = _estimate_one(repo, "image_classify")
    assert e2.scratch_run_id == run_id and e2.scratch_bytes == (m.unattributed_bytes or 0)
    assert any(n.endswith("beyond the tensors it tracked, of other code") for n in e2.notes)
    assert later != commit
    # --no-db reads the database to calibrate, and writes nothing to it
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        stored = store.run_ids(limit=1000)
    out = tmp_path / "no-db.json"
    res = _invoke(repo, "estimate", "-k", "image_classify", "--no-db", "--json", str(out))
    assert res.exit_code == 0, res.output
    (e3,) = run_from_dict(json.loads(out.read_text())).measurements
    assert e3.scratch_run_id == run_id and e3.peak_allocated_bytes == e2.peak_allocated_bytes
    with Store.open(repo / "memtrack.db", readonly=True) as store:
        assert store.run_ids(limit=1000) == stored


def test_a_cuda_estimate_is_calibrated_only_by_a_run_on_a_gpu_of_the_same_name(tmp_path):
    """Workspaces differ by GPU: a CUDA estimate takes its scratch from the latest measured
    run of its case on a GPU named as this machine's, never from another GPU's or the
    CPU's, and on a machine without a GPU it says it excludes scratch. (The estimate record
    is made here: this machine has no GPU to estimate for.)"""
    from memtrack.measure.estimate import calibrate

    a100 = dataclasses.replace(
        GPU_ENV,
        fingerprint="a100",
        gpus=(dataclasses.replace(GPU_ENV.gpus[0], name="NVIDIA A100-SXM4-80GB"),),
    )
    db = tmp_path / "memtrack.db"
    h200 = make_run([make_measurement(peak=110 * MiB, device="cuda")], env=GPU_ENV)
    with Store.open(db) as store:
        store.write_run(h200)
        for env, at in ((a100, "2026-02-01"), (CPU_ENV, "2026-03-01")):
            m = make_measurement(peak=500 * MiB, device="cpu" if env is CPU_ENV else "cuda")
            store.write_run(make_run([m], env=env, started_at=f"{at}T00:00:00+00:00"))
    fake = dataclasses.replace(
        make_measurement(peak=100 * MiB, device="cuda"),
        kind="estimate",
        framework="fake-tensor-estimate",
        categories={"Parameter": 60 * MiB, "Activation": 40 * MiB},
    )
    with Store.open(db, readonly=True) as store:
        here = calibrate(make_run([fake], env=GPU_ENV, commit=h200.git.commit), store)
        cpu_only = calibrate(make_run([fake], env=CPU_ENV), store)
    (e,) = here.measurements
    assert e.scratch_run_id == h200.run_id and e.scratch_bytes == 10 * MiB
    assert e.peak_allocated_bytes == 110 * MiB and e.unattributed_bytes == 10 * MiB
    (e,) = cpu_only.measurements
    assert e.scratch_bytes is None and e.peak_allocated_bytes == 100 * MiB
    assert "excludes kernel scratch: no GPU on this machine to say whose workspaces to add" in (
        e.notes
    )


WHERE = """\
import os
import pathlib

import torch
import memtrack


@memtrack.workload(params={"i": [0, 1]})
def where(ctx):
    parent = pathlib.Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\\0")
    seen = pathlib.Path(__file__).with_name(f"seen-{ctx['i']}.txt")
    seen.write_text(f"{os.getppid()} " + " ".join(a.decode() for a in parent if a))
    w = torch.nn.Linear(8, 8)
    ctx.mark(w)
    return lambda: w(torch.ones(2, 8)).sum()
"""


def test_each_case_is_forked_by_the_fork_server_as_a_measured_case_is(tmp_path, monkeypatch):
    """An estimate's cases are processes of their own, forked by one fork server that
    imported torch and the suite once; where forking is off, each is a fresh interpreter
    and its record says why."""
    repo = init_repo(tmp_path / "repo")
    (repo / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 1\n')
    (repo / "wl.py").write_text(WHERE)
    commit_all(repo, "a suite")
    parents = []
    for spawn, cases in (("", (0, 1)), ("1", (0,))):
        monkeypatch.setenv(SPAWN_VARIABLE, spawn)
        out = tmp_path / f"estimate{spawn}.json"
        args = ("-k", "where[i=0]") if spawn else ()
        res = _invoke(repo, "estimate", *args, "--no-db", "--json", str(out))
        assert res.exit_code == 0, res.output
        run = run_from_dict(json.loads(out.read_text()))
        assert [m.status for m in run.measurements] == ["ok"] * len(cases)
        seen = [(repo / f"seen-{i}.txt").read_text().split(" ", 1) for i in cases]
        notes = [n for m in run.measurements for n in m.notes if "fresh interpreter" in n]
        parents.append((seen, notes))
    (forked, no_notes), (spawned, notes) = parents
    assert no_notes == []
    assert forked[0][0] == forked[1][0]  # one server for the run
    assert all("memtrack.worker.server" in cmdline for _, cmdline in forked)
    assert [int(pid) for pid, _ in spawned] == [os.getpid()]
    assert notes == [f"started as a fresh interpreter, not forked: {SPAWN_VARIABLE}=1"]
