"""`memtrack plan`: a real sweep in a real repository, recorded; bad input refused first."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from factories import commit_all, init_repo

from memtrack.cli import main
from memtrack.store.database import Store

WORKLOAD = textwrap.dedent(
    """
    import threading
    import torch
    import memtrack

    @memtrack.workload(params={"concurrency": 1, "kib": 512, "dtype": "float32"})
    def serve(ctx):
        model = torch.nn.Linear(128, 128)
        ctx.mark(model)
        x = ctx.randn(1, 128)
        # A session this short could end before the next one starts: every session keeps
        # its state until all hold theirs, as requests that overlap do.
        together = threading.Barrier(ctx.concurrency)

        def session():
            cache = torch.zeros(ctx["kib"] * 256)  # its own request state, kib KiB
            ctx.tag_cache(cache)
            together.wait()
            return model(x) + cache[:128]

        return session
    """
)
CONFIG = 'modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n'


def _plan(repo, *args):
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", "plan", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    repo = init_repo(tmp_path_factory.mktemp("repo"))
    (repo / "wl.py").write_text(WORKLOAD)
    (repo / "memtrack.toml").write_text(CONFIG)
    (repo / ".gitignore").write_text("data/\n__pycache__/\n")
    commit = commit_all(repo, "a serving workload")
    first = _plan(repo, "serve", "--sweep", "concurrency=1,2", "--json")
    second = _plan(
        repo, "serve", "--sweep", "concurrency=1,2", "--markdown", "--no-record", "--gpu", "T4"
    )
    return repo, commit, first, second


def test_a_sweep_is_measured_fitted_and_recorded(swept):
    repo, commit, first, _ = swept
    assert first.returncode == 0, first.stderr
    plan = json.loads(first.stdout)
    (p1, p2) = plan["points"]
    assert (p1["value"], p2["value"]) == (1, 2)
    # A second session adds its own 512 KiB cache (and activations), not a second model.
    assert p2["peak_bytes"] - p1["peak_bytes"] >= 512 * 1024
    assert p2["peak_bytes"] < 2 * p1["peak_bytes"]
    assert plan["metric"] == "allocated" and "measured on the CPU" in plan["metric_note"]
    assert plan["fit"]["model"] == "constant + linear"
    assert plan["fit"]["b_bytes"] == p2["peak_bytes"] - p1["peak_bytes"]  # two points: a line
    assert plan["headroom"]["source"] == "config" and plan["headroom"]["fraction"] == 0.10
    t4 = next(g for g in plan["gpus"] if g["name"] == "NVIDIA T4")
    # The line crosses 16 GB at thousands of sessions; two values fix a line whatever the
    # growth, so no answer is given past the largest of them.
    a, b = plan["fit"]["a_bytes"], plan["fit"]["b_bytes"]
    assert 1.1 * (a + b * 1000) < 16e9
    assert (t4["largest"], t4["first_over"], t4["carried_to"]) == (None, None, 2)
    assert plan["carried_to"] == 2 and t4["measured_top"] == 2
    assert any(
        "the fit cannot carry this: measured up to concurrency=2; measure at larger values "
        "with `memtrack plan`" in n
        for n in plan["notes"]
    )
    assert any("nominal" in n for n in plan["notes"])
    with Store.open(repo / "data" / "memtrack.db", readonly=True) as store:
        (run_id,) = store.run_ids()
        run = store.get_run(run_id)
    assert run.git.commit == commit
    assert sorted(m.params["concurrency"] for m in run.measurements) == [1, 2]
    assert [
        m.peak_allocated_bytes
        for m in sorted(run.measurements, key=lambda m: m.params["concurrency"])
    ] == [p1["peak_bytes"], p2["peak_bytes"]]
    assert f"run {run_id} (2 cases) recorded in" in first.stderr


def test_a_second_sweep_takes_the_gates_headroom_from_the_first_and_records_nothing(swept):
    repo, _, _, second = swept
    assert second.returncode == 0, second.stderr
    md = second.stdout
    assert md.startswith("### Will it fit? `serve` over `concurrency`")
    assert "the gate's headroom over the baseline of serve\\[concurrency=" in md
    assert "| NVIDIA T4 | 16 GB |" in md and "NVIDIA H200" not in md
    assert "not recorded (--no-record)" in second.stderr
    with Store.open(repo / "data" / "memtrack.db", readonly=True) as store:
        assert len(store.run_ids()) == 1


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "wl.py").write_text(WORKLOAD)
    (tmp_path / "memtrack.toml").write_text(CONFIG)
    return tmp_path


@pytest.mark.parametrize(
    "args, message",
    [
        (["serve", "--sweep", "batch=1,2"], "--sweep 'batch=1,2': serve has no param 'batch'"),
        (["serve", "--sweep", "concurrency=1,two"], "value 'two' of 'concurrency' is not a whole"),
        (["serve", "--sweep", "dtype=1,2"], "param 'dtype' is not numeric"),
        (["served", "--sweep", "concurrency=1,2"], "served: no such workload or case"),
        (["serve", "--sweep", "concurrency=1,2", "--gpu", "B200"], "--gpu 'B200': no such GPU"),
        (
            ["serve", "--sweep", "concurrency=1,2", "--catalog", "{root}/gpus.toml"],
            "{root}/gpus.toml: gpu[0].memory: '24 GX' is not a size",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(suite, args, message):
    (suite / "gpus.toml").write_text('[[gpu]]\nname = "X"\nmemory = "24 GX"\n')
    args = [a.replace("{root}", str(suite)) for a in args]
    db = suite / "m.db"
    res = CliRunner().invoke(
        main, ["plan", *args, "--config", str(suite / "memtrack.toml"), "--db", str(db)]
    )
    assert res.exit_code == 2, res.output
    assert message.replace("{root}", str(suite)) in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not db.exists()


def test_plan_has_help():
    res = CliRunner().invoke(main, ["plan", "--help"])
    assert res.exit_code == 0 and "Will it fit?" in res.output and "--sweep" in res.output


def test_an_estimated_sweep_needs_no_gpu_and_says_what_its_figure_leaves_out(swept):
    repo = swept[0]
    res = _plan(repo, "serve", "--sweep", "kib=256,512,1024", "--estimate", "--json", "--no-record")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    peaks = [p["peak_bytes"] for p in plan["points"]]
    # The request state is exactly `kib` KiB of float32: the estimate follows it byte for byte.
    assert peaks[1] - peaks[0] == 256 * 1024 and peaks[2] - peaks[1] == 512 * 1024
    assert plan["fit"]["model"] == "constant + linear" and plan["fit"]["b_bytes"] == 1024
    assert plan["metric_note"].startswith("the estimated tensor peak (fake tensors, for cpu)")
    bad = _plan(repo, "serve", "--sweep", "kib=256,512", "--device", "cuda")
    assert bad.returncode == 2 and "--device goes with --estimate" in bad.stderr
