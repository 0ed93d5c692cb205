"""Quality after a precision change: references, the worker's comparison, the verdict and
the report, with real workloads in subprocesses on the CPU."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from factories import commit_all, git, init_repo, make_measurement, make_run

from memtrack.config import load_config
from memtrack.errors import ConfigError, RecordError, WorkloadError
from memtrack.judge.quality import precision_change
from memtrack.measure.case import run_case
from memtrack.measure.references import load_manifest, manifest_path
from memtrack.records import run_from_dict, to_dict
from memtrack.store.database import Store
from memtrack.units import format_size
from memtrack.worker.protocol import QualitySpec
from memtrack.workload.registry import Case, discover, select_cases, workload

WORKLOADS = textwrap.dedent(
    """
    import torch
    import memtrack
    from memtrack.examples.vision import _convnet


    @memtrack.workload(
        params={"dtype": ["float32", "bfloat16"], "batch": 4, "resolution": 64},
        tolerance={"max_rel": 0.05, "cosine": 0.999, "metric": 0.05},
        quality=lambda out, ref: float((out - ref).norm() / ref.norm()),
    )
    def convnet(ctx):
        # the shipped image model, returning its logits
        model = _convnet(8, 100).to(ctx.device, ctx.dtype).eval()
        ctx.mark(model)
        # drawn in float32 and cast: both precisions see the same images
        images = ctx.randn(ctx["batch"], 3, ctx["resolution"], ctx["resolution"],
                           dtype=torch.float32).to(ctx.dtype)

        @torch.inference_mode()
        def step():
            return model(images)

        return step


    @memtrack.workload(params={"quant": ["none", "int8"]}, precision_params=("quant",),
                       tolerance={"max_abs": 1e-3})
    def quantized(ctx):
        layer = torch.nn.Linear(256, 256).to(ctx.device)
        weight = layer.weight.detach()
        if ctx["quant"] == "int8":  # cast with no scale: weights below 0.5 round to zero
            weight = weight.round().to(torch.int8)
        layer.weight = None
        ctx.mark(layer)
        x = ctx.randn(32, 256)

        @torch.no_grad()
        def step():
            return torch.nn.functional.linear(x, weight.float(), layer.bias)

        return step


    @memtrack.workload(params={"quant": ["none", "int8"]}, precision_params=("quant",),
                       tolerance={"cosine": 0.999})
    def dynamic(ctx):
        # torch.ao's dynamic int8 quantization: packed weights, against the float model
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64)
        ).eval()
        if ctx["quant"] == "int8":
            model = torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear}, torch.qint8
            )
        ctx.mark(model)
        x = ctx.randn(32, 256)

        @torch.no_grad()
        def step():
            return model(x)

        return step


    @memtrack.workload(tolerance={"cosine": 0.99})
    def no_output(ctx):
        layer = torch.nn.Linear(16, 16)
        ctx.mark(layer)
        x = ctx.randn(2, 16)

        def step():
            layer(x)

        return step
    """
)

F32 = "convnet[batch=4,dtype=float32,resolution=64]"
BF16 = "convnet[batch=4,dtype=bfloat16,resolution=64]"
NONE, INT8 = "quantized[quant=none]", "quantized[quant=int8]"
DYNAMIC_NONE, DYNAMIC_INT8 = "dynamic[quant=none]", "dynamic[quant=int8]"


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memtrack.cli", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return re.search(r"^run ([0-9a-f]{32}) of", result.stdout, re.M).group(1)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    repo = init_repo(tmp_path_factory.mktemp("quality"))
    (repo / "wl.py").write_text(WORKLOADS)
    (repo / "memtrack.toml").write_text(
        'modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\ndevice = "cpu"\n'
    )
    (repo / ".gitignore").write_text("data/memtrack.db*\n")
    commit_all(repo, "workloads")
    recorded = cli(repo, "reference", "-k", "convnet", "-k", "quantized", "-k", "dynamic")
    assert recorded.returncode == 0, recorded.stderr
    commit_all(repo, "references")
    git(repo, "checkout", "-q", "-b", "feature")  # a pull request: verdicts gate
    # each variant on a commit of its own: a check judges every run of its commit
    bf16_run = run_id(cli(repo, "run", "-k", "convnet"))
    git(repo, "commit", "-q", "--allow-empty", "-m", "int8")
    int8_run = run_id(cli(repo, "run", "-k", "quantized"))
    git(repo, "commit", "-q", "--allow-empty", "-m", "dynamic")
    dynamic_run = run_id(cli(repo, "run", "-k", "dynamic"))
    dynamic_check = cli(repo, "check", "--run", dynamic_run, "--json", "dynamic.json")
    bf16_check = cli(
        repo, "check", "--run", bf16_run, "--json", "bf16.json", "--markdown", "bf16.md"
    )
    int8_check = cli(repo, "check", "--run", int8_run, "--json", "int8.json")
    return {
        "repo": repo,
        "recorded": recorded,
        "bf16_run": bf16_run,
        "int8_run": int8_run,
        "bf16_check": bf16_check,
        "int8_check": int8_check,
        "dynamic_run": dynamic_run,
        "dynamic_check": dynamic_check,
    }


def _run(repo: Path, rid: str):
    with Store.open(repo / "data" / "memtrack.db", readonly=True) as store:
        run = store.get_run(rid)
    return {m.case_id: m for m in run.measurements}


def test_reference_pins_the_full_precision_output_by_its_checksum(project):
    import hashlib

    repo = project["repo"]
    manifest = load_manifest(load_config(repo / "memtrack.toml"))
    # the int8 and bf16 cases have no file of their own
    assert set(manifest) == {F32, NONE, DYNAMIC_NONE}
    for entry in manifest.values():
        data = (repo / "perf" / "references" / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert entry["torch"] and entry["outputs"]["output"]["dtype"] == "float32"
    assert manifest[F32]["outputs"]["output"]["shape"] == [4, 100]
    assert f"the reference of {BF16}" in project["recorded"].stdout
    assert not list((repo / "perf" / "references").glob(".*"))  # no temporary files left


def test_bf16_within_tolerance_passes_and_the_report_shows_its_saving(project):
    repo, check = project["repo"], project["bf16_check"]
    assert check.returncode == 0, check.stdout + check.stderr
    ms = _run(repo, project["bf16_run"])
    f32, bf16 = ms[F32], ms[BF16]
    assert bf16.quality_status == "ok" and f32.quality_status == "ok", bf16.quality_message
    assert bf16.quality_reference == F32 == f32.quality_reference
    manifest = load_manifest(load_config(repo / "memtrack.toml"))
    assert bf16.quality_reference_sha256 == manifest[F32]["sha256"]
    assert 0 < bf16.quality_max_abs and 0 < bf16.quality_max_rel <= 0.05
    assert 0.999 <= bf16.quality_cosine < 1 and 0 < bf16.quality_value <= 0.05
    assert bf16.quality_tolerance == {"max_rel": 0.05, "cosine": 0.999, "metric": 0.05}
    assert f32.quality_max_abs == 0 and f32.quality_cosine == 1  # itself, same process state
    # the saving: measured on both sides, shown against the float32 sibling of the same run
    saved = f32.peak_allocated_bytes - bf16.peak_allocated_bytes
    assert saved > 0
    pct = 100 * saved / f32.peak_allocated_bytes
    shown = f"{format_size(saved)} ({pct:.1f}%)"
    verdicts = json.loads((repo / "bf16.json").read_text())["verdicts"]
    (v,) = [v for v in verdicts if v["case_id"] == BF16 and v["metric"] == "quality"]
    assert v["kind"] == "ok" and not v["blocking"] and v["reference"] == F32
    assert v["baseline_value"] == f32.peak_allocated_bytes
    assert v["candidate_value"] == bf16.peak_allocated_bytes
    assert f"saves {shown}" in v["message"] and "cosine" in v["message"]
    text = check.stdout
    assert "quality after a precision change" in text and shown in text
    md = (repo / "bf16.md").read_text()
    assert (
        "<summary>Quality after a precision change: memory saved and quality kept</summary>"
    ) in md
    (row,) = [line for line in md.splitlines() if line.startswith("| ✅ ok | `convnet[dtype=bf")]
    assert shown in row and "within tolerance" in row and "`convnet[dtype=float32]`" in row


def test_an_uncalibrated_int8_cast_blocks_with_its_figure_and_tolerance(project):
    repo, check = project["repo"], project["int8_check"]
    assert check.returncode == 1, check.stdout + check.stderr
    m = _run(repo, project["int8_run"])[INT8]
    assert m.status == "ok" and m.quality_status == "fail" and m.quality_max_abs > 1e-3
    verdicts = json.loads((repo / "int8.json").read_text())["verdicts"]
    blocking = [v for v in verdicts if v["blocking"]]
    assert [(v["case_id"], v["kind"]) for v in blocking] == [(INT8, "quality")]
    message = blocking[0]["message"]
    assert f"max_abs {m.quality_max_abs:.4g} > 0.001" in message
    assert "quant int8 (reference none)" in message and NONE in message
    assert f"BLOCK quality · {INT8}" in check.stdout
    # the full-precision case itself matches its reference
    assert _run(repo, project["int8_run"])[NONE].quality_status == "ok"


def test_torch_ao_int8_is_judged_against_its_float_model_and_saves_its_weights(project):
    repo, check = project["repo"], project["dynamic_check"]
    assert check.returncode == 0, check.stdout + check.stderr
    ms = _run(repo, project["dynamic_run"])
    f32, int8 = ms[DYNAMIC_NONE], ms[DYNAMIC_INT8]
    assert int8.quality_status == "ok", int8.quality_message
    assert int8.quality_reference == DYNAMIC_NONE and 0.999 <= int8.quality_cosine < 1
    # the packed int8 weights: well under the float32 ones, never 0 B
    assert f32.weights_bytes / 4 < int8.weights_bytes < f32.weights_bytes / 2
    verdicts = json.loads((repo / "dynamic.json").read_text())["verdicts"]
    (v,) = [v for v in verdicts if v["case_id"] == DYNAMIC_INT8 and v["metric"] == "quality"]
    assert v["kind"] == "ok" and "saves" in v["message"]


def test_a_reference_changed_after_recording_is_refused_by_its_checksum(project, tmp_path):
    import torch

    repo = tmp_path / "copy"
    shutil.copytree(project["repo"], repo)
    config = load_config(repo / "memtrack.toml")
    path = repo / "perf" / "references" / load_manifest(config)[NONE]["file"]
    tensors = torch.load(path, weights_only=True)
    tensors["output"] = tensors["output"] * 0.999  # a plausible, quiet edit
    torch.save(tensors, path)
    run = cli(repo, "run", "-k", "quant=none", "-k", "dtype=float32")
    rid = run_id(run)  # the run goes on: exit 0, every case recorded
    ms = _run(repo, rid)
    assert ms[F32].quality_status == "ok"
    m = ms[NONE]
    assert m.status == "ok" and m.quality_status == "error"
    assert m.quality_message.startswith(f"{path}: sha256 ")
    assert "differs from the manifest" in m.quality_message and "\n" not in m.quality_message
    assert m.quality_max_abs is None  # nothing compared against a refused file
    check = cli(repo, "check", "--run", rid)
    assert check.returncode == 1
    assert f"BLOCK quality · {NONE} · quality error" in check.stdout and str(path) in check.stdout


def test_a_reference_recorded_on_another_device_is_compared_with_a_warning(project, tmp_path):
    # The manifest says where each reference was recorded. Here one recorded on a GPU is
    # compared on the CPU (a GPU's float32 convolutions run in TF32 by default): the figures
    # are kept, and the quality message says the devices differ.
    repo = tmp_path / "copy"
    shutil.copytree(project["repo"], repo)
    config = load_config(repo / "memtrack.toml")
    manifest = load_manifest(config)
    assert manifest[F32]["device"] == "cpu"  # recorded here, on the CPU
    path = manifest_path(config)
    data = json.loads(path.read_text())
    data["references"][F32]["device"] = "cuda:0"
    path.write_text(json.dumps(data))
    ms = _run(repo, run_id(cli(repo, "run", "-k", "convnet")))
    for case in (F32, BF16):
        m = ms[case]
        assert m.quality_status == "ok" and m.quality_max_abs is not None
        assert m.quality_message.startswith(
            "reference recorded on cuda:0, compared on cpu: kernels differ between them"
        )
        assert "within tolerance" in m.quality_message
    # recorded on the same kind of device: no warning
    assert project_message(project, BF16).startswith("within tolerance")


def project_message(project, case: str) -> str:
    return _run(project["repo"], project["bf16_run"])[case].quality_message


def test_reference_refuses_a_step_without_tensor_output(project):
    repo = project["repo"]
    manifest = (repo / "perf" / "references" / "manifest.json").read_bytes()
    result = cli(repo, "reference", "no_output")
    assert result.returncode == 2
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("memtrack: error")]
    assert line == (
        "memtrack: error: no_output: no reference recorded: the step returned "
        "None, not a tensor, or a tuple, list or dict of tensors"
    )
    assert (repo / "perf" / "references" / "manifest.json").read_bytes() == manifest
    assert not list((repo / "perf" / "references").glob(".*"))


def test_comparing_the_output_leaves_the_measured_peak_unchanged(project):
    # The same case once more, not compared (no reference given to the worker): the
    # framework figures equal those of the run that compared its output.
    repo = project["repo"]
    config = load_config(repo / "memtrack.toml")
    (case,) = select_cases(discover(config), [F32])
    plain = run_case(config, case, "cpu", quality=QualitySpec(mode="compare", reference=F32))
    compared = _run(repo, project["bf16_run"])[F32]
    assert plain.quality_status == "none" and compared.quality_status == "ok"
    assert plain.peak_allocated_bytes == compared.peak_allocated_bytes
    assert plain.allocated_samples == compared.allocated_samples
    assert plain.persistent_bytes == compared.persistent_bytes
    assert plain.categories == compared.categories


# -- declaring, recording and judging, without a worker ----------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tolerance": {"max_ab": 0.1}}, "tolerance key 'max_ab' is not one of"),
        ({"tolerance": {"cosine": 1.5}}, "tolerance 'cosine' must be between -1 and 1"),
        ({"tolerance": {"max_abs": -1}}, "tolerance 'max_abs' must be at least 0"),
        ({"tolerance": {"max_rel": float("nan")}}, "tolerance 'max_rel' must be a finite number"),
        ({"tolerance": {"max_abs": True}}, "must be a finite number, got True"),
        ({"tolerance": {}}, "tolerance must be a non-empty dict"),
        ({"tolerance": {"metric": 0.1}}, "pass quality=fn(output, reference)"),
        ({"tolerance": {"cosine": 0.9}, "quality": len}, "quality needs a bound"),
        ({"tolerance": {"metric": 0.1}, "quality": 3}, "quality must be a function"),
        ({"quality": len}, "need a tolerance"),
        (
            {"tolerance": {"cosine": 0.9}, "precision_params": ("quant",)},
            "precision_params names 'quant', which is not a param",
        ),
        (
            {"tolerance": {"cosine": 0.9}, "precision_params": "dtype"},
            "precision_params must be a tuple of param names",
        ),
    ],
)
def test_a_tolerance_is_checked_when_declared(kwargs, words):
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        workload(lambda ctx: None, name="bad_tolerance", params={"dtype": ["float32"]}, **kwargs)
    assert "workload 'bad_tolerance'" in str(info.value) and "\n" not in str(info.value)


def test_the_reference_case_is_the_full_precision_sibling():
    case = Case(
        "w",
        {"dtype": "bfloat16", "quant": "int8", "batch": 8},
        tolerance={"cosine": 0.99},
        precision={"dtype": "float32", "quant": "none"},
    )
    assert case.reference_case().case_id == "w[batch=8,dtype=float32,quant=none]"
    assert precision_change(case.case_id, case.reference_case().case_id) == (
        "dtype bfloat16 (reference float32), quant int8 (reference none)"
    )
    same = Case(
        "w", {"dtype": "float32"}, tolerance={"cosine": 0.99}, precision={"dtype": "float32"}
    )
    assert (
        same.reference_case() == same
        and precision_change("w[dtype=float32]", "w[dtype=float32]") is None
    )


def test_a_malformed_manifest_is_refused_naming_the_file_and_key(tmp_path):
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nreferences = "refs"\n')
    config = load_config(tmp_path / "memtrack.toml")
    assert config.references == tmp_path / "refs"
    (tmp_path / "refs").mkdir()
    manifest = tmp_path / "refs" / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "version": 1,
                "references": {
                    "w[dtype=float32]": {"file": "../../etc/passwd", "sha256": "0" * 64}
                },
            }
        )
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"{manifest}: references['w[dtype=float32]'].file: '../../etc/passwd' is not a "
            "file name"
        ),
    ):
        load_manifest(config)


def test_quality_figures_are_checked_stored_and_read_back(tmp_path):
    m = make_measurement(
        "w",
        {"dtype": "bfloat16"},
        quality_status="fail",
        quality_message="breaks tolerance: max_abs 0.2 > 0.01",
        quality_reference="w[dtype=float32]",
        quality_reference_sha256="ab" * 32,
        quality_max_abs=0.2,
        quality_max_rel=0.1,
        quality_cosine=0.98,
        quality_tolerance={"max_abs": 0.01},
    )
    run = make_run([m])
    data = to_dict(run)
    assert run_from_dict(data) == run
    for key, value, words in (
        ("quality_status", "bad", "is not one of ok, fail"),
        ("quality_cosine", 1.5, "is above 1"),
        ("quality_max_abs", -0.1, "is below 0"),
        ("quality_reference_sha256", "xyz", "does not match"),
    ):
        bad = json.loads(json.dumps(data))
        bad["measurements"][0][key] = value
        with pytest.raises(RecordError, match=re.escape(f"measurements[0].{key}: ")) as info:
            run_from_dict(bad)
        assert words in str(info.value)
    with Store.open(tmp_path / "m.db") as store:
        store.write_run(run)
        assert store.get_run(run.run_id) == run


def test_figures_over_several_outputs_keep_the_worst_and_name_what_cannot_be_compared():
    import math

    import torch

    from memtrack.probes.quality import OutputError, flatten, judge, rebuild
    from memtrack.probes.quality import _figures as figures

    kind, flat = flatten({"logits": torch.ones(3), "loss": torch.tensor(2.0)})
    assert kind == "dict" and rebuild(kind, flat) == flat
    kind, flat = flatten((torch.zeros(2), torch.ones(2)))
    assert kind == "tuple" and isinstance(rebuild(kind, flat), tuple)
    for bad, words in (
        (None, "returned None"),
        ((), "an empty tuple"),
        ((torch.ones(1), 3), "item '1' is a int"),
    ):
        with pytest.raises(OutputError, match=re.escape(words)):
            flatten(bad)
    ref = {
        "a": torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64),
        "b": torch.tensor([1.0, -1.0], dtype=torch.float64),
    }
    out = {
        "a": torch.tensor([1.0, 2.0, 4.5], dtype=torch.float64),
        "b": torch.tensor([-1.0, 1.0], dtype=torch.float64),
    }
    f, bad = figures(out, ref)
    assert bad is None and f["max_abs"] == 2.0 and f["max_rel"] == 2.0
    assert f["cosine"] == pytest.approx(-1.0)  # b is reversed: the worst of the two
    assert judge(f, {"max_abs": 0.5, "cosine": -1.0}, None) == (
        "fail",
        "breaks tolerance: max_abs 2 > 0.5; within: cosine -1 >= -1",
    )
    zero = {"a": torch.zeros(2, dtype=torch.float64)}
    f, _ = figures({"a": torch.ones(2, dtype=torch.float64)}, zero)
    assert f["max_rel"] == math.inf and judge(f, {"max_rel": 1.0}, None)[0] == "fail"
    f, bad = figures({"a": torch.tensor([math.nan, 1.0], dtype=torch.float64)}, zero)
    assert judge(f, {"cosine": 0.9}, bad) == (
        "fail",
        "1 non-finite value(s) (NaN or inf) in the output, 0 in the reference",
    )


def test_on_the_base_branch_a_quality_failure_is_reported_not_blocking():
    from memtrack.judge.quality import verdicts
    from memtrack.report.words import message

    ref = make_measurement(
        "w",
        {"dtype": "float32"},
        peak=400,
        quality_status="ok",
        quality_reference="w[dtype=float32]",
        quality_message="within",
    )
    fail = make_measurement(
        "w",
        {"dtype": "bfloat16"},
        peak=200,
        quality_status="fail",
        quality_reference="w[dtype=float32]",
        quality_message="breaks tolerance: cosine 0.9 < 0.999",
    )
    none = make_measurement(
        "v",
        {"dtype": "float32"},
        quality_status="none",
        quality_reference="v[dtype=float32]",
        quality_message="no ref",
    )
    plain = make_measurement("u", {"dtype": "float32"})
    pr = {v.case_id: v for v in verdicts([ref, fail, none, plain])}
    assert set(pr) == {"w[dtype=float32]", "w[dtype=bfloat16]", "v[dtype=float32]"}
    v = pr["w[dtype=bfloat16]"]
    assert (
        v.kind == "quality"
        and v.blocking
        and message(v).startswith(
            "the precision change breaks its tolerance (dtype bfloat16 (reference float32)"
        )
    )
    assert (v.baseline_value, v.candidate_value, v.delta, v.delta_pct) == (400, 200, -200, -50)
    assert pr["v[dtype=float32]"].kind == "quality" and not pr["v[dtype=float32]"].blocking
    assert pr["w[dtype=float32]"].kind == "ok"
    base = {v.case_id: v for v in verdicts([ref, fail], "base")}
    assert not base["w[dtype=bfloat16]"].blocking


@pytest.mark.gpu
def test_bf16_on_the_gpu_keeps_quality_and_saves_device_memory(tmp_path):
    repo = init_repo(tmp_path / "gpu")
    (repo / "wl.py").write_text(WORKLOADS)
    (repo / "memtrack.toml").write_text(
        'modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\ndevice = "cuda"\n'
    )
    commit_all(repo, "workloads")
    assert cli(repo, "reference", "-k", "convnet").returncode == 0
    ms = _run(repo, run_id(cli(repo, "run", "-k", "convnet")))
    assert ms[BF16].quality_status == "ok", ms[BF16].quality_message
    assert ms[BF16].peak_allocated_bytes < ms[F32].peak_allocated_bytes
