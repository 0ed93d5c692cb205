"""The pytest plugin, through real pytest runs (pytester, each in its own interpreter) on the
CPU: budgets pass and fail with every view in the message; `--memtrack` records every test
into a real SQLite file, with pytest-xdist too, erroring tests as failed data; a grown test
is blocked by `memtrack check` and named in the PR comment; a test measured in pytest's
process reads what it reads in a process of its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from factories import commit_all, git, init_repo, memtrack_cli

from memtrack.records import metrics
from memtrack.store.database import Store

pytest_plugins = ["pytester"]

MiB = 2**20
PLUGIN = ("-p", "memtrack.plugin.hooks", "-p", "no:cacheprovider")
"""The plugin by name (the entry point loads it where memtrack is installed; not in every
checkout a test runs from, so entry points are not loaded: see `_no_autoload`)."""

CONFIG = 'database = "data/memtrack.db"\nmin_baseline_runs = 2\ntime_regression = "off"\n'

MODEL = """\
import torch


def work(blocks):
    kept = [torch.ones(256 * 1024) for _ in range(blocks)]  # 1 MiB each, all alive at once
    return sum(float(k[0]) for k in kept)
"""

TESTS = """\
import pytest
from model import work


def test_work():
    assert work({blocks}) == {blocks}


@pytest.mark.parametrize("n", [1, 2])
def test_small(n):
    assert work(n) == n
"""


@pytest.fixture(autouse=True)
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    """A git repository with a memtrack config, a tested function and its tests."""
    repo = init_repo(pytester.path)
    (repo / "memtrack.toml").write_text(CONFIG)
    # what pytester writes beside the tests is not the project's
    (repo / ".gitignore").write_text("data/\n__pycache__/\n*.md\nrunpytest-*\nstdout\nstderr\n")
    (repo / "model.py").write_text(MODEL)
    (repo / "test_model.py").write_text(TESTS.format(blocks=4))
    commit_all(repo, "a model and its tests")
    return repo


def _pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*PLUGIN, *args, timeout=600)


def _runs(db: Path) -> list:
    with Store.open(db, readonly=True, create=False) as store:
        return [store.get_run(r) for r in store.run_ids()]


def test_a_budget_passes_and_one_over_fails_with_every_view_in_its_message(pytester):
    pytester.makepyfile(
        test_budget="""
        import pytest, torch

        @pytest.mark.memory_budget("2 MiB")
        def test_within():
            keep = [torch.ones(256 * 1024)]  # 1 MiB
            assert keep

        @pytest.mark.memory_budget("4 MiB", metric="allocated", device="cpu")
        def test_over():
            keep = [torch.ones(256 * 1024) for _ in range(6)]  # 6 MiB alive at once
            assert keep
        """
    )
    result = _pytest(pytester, "-q")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "memory budget exceeded: allocated 6.00 MiB > 4.00 MiB (+2.00 MiB" in out
    for view in ("allocated", "reserved", "device", "host"):
        assert f"\n  {view} " in out, view
    assert "host peak RSS above the test's start" in out
    # where the peak's memory was allocated: the line of the test's own code, by module too
    assert re.search(r"6\.00 MiB  test_budget\.py:<listcomp>:10\n", out), out
    assert re.search(r"by module:\n +6\.00 MiB  \(no module\)\n", out), out
    assert "FAILED test_budget.py::test_over" in out
    assert "test_within" not in out.split("short test summary")[-1]


@pytest.mark.parametrize(
    "mark, named",
    [
        ('"2 jigabytes"', "'2 jigabytes'"),
        ('"1 GiB", metric="vram"', "'vram'"),
        ('"1 GiB", device="tpu"', "'tpu'"),
        ('"1 GiB", metric="reserved", device="cpu"', "'reserved'"),
    ],
)
def test_a_bad_budget_is_a_collection_error_naming_the_test_and_the_value(pytester, mark, named):
    pytester.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.memory_budget({mark})
        def test_it():
            pass
        """
    )
    result = _pytest(pytester, "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # pytest's: errors during collection
    out = result.stdout.str()
    assert "ERROR collecting test_bad.py" in out
    where = "test_bad.py::test_it: @pytest.mark.memory_budget"
    line = next(x for x in out.splitlines() if where in x)
    assert named in line


def test_without_a_budget_or_memtrack_nothing_is_measured_or_written(pytester, project):
    result = _pytest(pytester, "-q")
    result.assert_outcomes(passed=3)
    assert not (project / "data").exists()
    assert "memtrack" not in result.stdout.str()


def test_memtrack_records_one_row_per_test_into_the_database(pytester, project):
    result = _pytest(pytester, "-q", "--memtrack")
    result.assert_outcomes(passed=3)
    assert "3 tests recorded in" in result.stdout.str()
    (run,) = _runs(project / "data" / "memtrack.db")
    assert run.git.commit == git(project, "rev-parse", "HEAD")
    by_case = {m.case_id: m for m in run.measurements}
    assert sorted(by_case) == [
        "test_model.py::test_small[1]",
        "test_model.py::test_small[2]",
        "test_model.py::test_work",
    ]
    # what the tested function keeps alive, exactly: the CPU allocator's figure
    assert by_case["test_model.py::test_work"].peak_allocated_bytes == 4 * MiB
    assert by_case["test_model.py::test_small[2]"].peak_allocated_bytes == 2 * MiB
    assert all(m.status == "ok" and m.framework == "cpu-allocator" for m in run.measurements)


def test_the_tests_run_is_recorded_with_the_runners_environment_fingerprint(
    pytester, project, monkeypatch
):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    _pytest(pytester, "-q", "--memtrack").assert_outcomes(passed=3)
    (run,) = _runs(project / "data" / "memtrack.db")
    # the workers' allocator setting, applied to pytest's process, and recorded with it
    assert run.environment.env_vars["MALLOC_MMAP_THRESHOLD_"] == "131072"
    code = "from memtrack.measure.suite import probe_environment as p; print(p().fingerprint)"
    runner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.environment.fingerprint == runner.stdout.strip(), runner.stderr


def _memtrack(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memtrack_cli(repo, *args, env={"CI": "true"})


def test_a_test_whose_function_keeps_8_mib_more_is_blocked_and_named_in_the_comment(
    pytester, project
):
    for _ in range(2):
        _pytest(pytester, "-q", "--memtrack").assert_outcomes(passed=3)
    git(project, "checkout", "-q", "-b", "bigger-cache")
    (project / "test_model.py").write_text(TESTS.format(blocks=12))  # 8 MiB more
    commit_all(project, "keep 12 blocks")
    _pytest(pytester, "-q", "--memtrack").assert_outcomes(passed=3)
    out = _memtrack(project, "check", "--markdown", "comment.md")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BLOCK regression · test_model.py::test_work · allocated" in out.stdout
    # the sites of a test's peak: listed by pytest when it fails a budget (no workload to snapshot)
    hint = "To see which allocation, under a memory_budget mark below its peak: pytest"
    assert f"{hint} 'test_model.py::test_work'" in " ".join(out.stdout.split())
    assert "memtrack snapshot" not in out.stdout
    comment = (project / "comment.md").read_text()
    assert "blocked by `test_model.py::test_work` allocated +8.00 MiB" in comment, comment
    assert "uncommitted changes" not in comment


def test_a_test_over_its_budget_is_a_blocking_verdict_of_check_and_the_comment(pytester, project):
    (project / "test_budget.py").write_text(
        "import pytest\nfrom model import work\n\n\n"
        '@pytest.mark.memory_budget("2 MiB")\n'
        "def test_fits():\n    assert work(1) == 1\n\n\n"
        '@pytest.mark.memory_budget("16 MiB")\n'
        "def test_big():\n    assert work(8) == 8\n"
    )
    commit_all(project, "budgeted tests")
    for _ in range(2):
        _pytest(pytester, "-q", "--memtrack", "test_budget.py").assert_outcomes(passed=2)
    git(project, "checkout", "-q", "-b", "bigger")
    text = (project / "test_budget.py").read_text().replace("work(8) == 8", "work(20) == 20")
    (project / "test_budget.py").write_text(text)
    commit_all(project, "20 blocks")
    # pytest fails the test over its budget; check blocks the pull request on it too
    _pytest(pytester, "-q", "--memtrack", "test_budget.py").assert_outcomes(passed=1, failed=1)
    (latest, *_) = _runs(project / "data" / "memtrack.db")
    (big,) = [m for m in latest.measurements if m.case_id.endswith("test_big")]
    assert (big.status, big.budget_bytes, big.budget_metric) == ("ok", 16 * MiB, "allocated")
    out = _memtrack(project, "check", "--json", "check.json")
    assert out.returncode == 1, out.stdout + out.stderr
    (v,) = [
        v
        for v in json.loads((project / "check.json").read_text())["verdicts"]
        if v["case_id"] == "test_budget.py::test_big" and v["metric"] == "allocated"
    ]
    assert (v["kind"], v["blocking"], v["budget_bytes"]) == ("over_budget", True, 16 * MiB)
    assert "the test's memory_budget mark" in v["message"]
    out = _memtrack(project, "check", "--markdown", "comment.md")
    assert out.returncode == 1
    assert "test_budget.py::test_big" in (project / "comment.md").read_text()


def test_xdist_workers_measure_and_one_run_holds_every_test(pytester, project):
    (project / "test_more.py").write_text(
        "import torch\n\n"
        + "".join(
            f"def test_{i}():\n    assert torch.ones({i + 1} * 1024).numel()\n\n" for i in range(5)
        )
    )
    result = _pytest(pytester, "--memtrack", "-p", "xdist.plugin", "-n", "2")
    result.assert_outcomes(passed=8)
    assert "created: 2/2 workers" in result.stdout.str()
    (run,) = _runs(project / "data" / "memtrack.db")
    assert len(run.measurements) == 8
    figures = {m.case_id: m.peak_allocated_bytes for m in run.measurements}
    assert figures["test_more.py::test_4"] == 5 * 1024 * 4
    assert figures["test_model.py::test_work"] == 4 * MiB


def test_a_test_that_errors_is_recorded_as_failed_data(pytester, project):
    (project / "test_broken.py").write_text(
        "import pytest, torch\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('no such checkpoint')\n\n"
        "def test_setup_fails(broken):\n    pass\n\n"
        "def test_body_fails():\n    keep = torch.ones(1024)\n"
        "    raise ValueError('shape mismatch')\n"
    )
    result = _pytest(pytester, "-q", "--memtrack")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    assert "5 tests recorded" in result.stdout.str()
    (run,) = _runs(project / "data" / "memtrack.db")
    by_case = {m.case_id: m for m in run.measurements}
    setup = by_case["test_broken.py::test_setup_fails"]
    assert (setup.status, setup.message) == ("error", "setup: RuntimeError: no such checkpoint")
    body = by_case["test_broken.py::test_body_fails"]
    assert (body.status, body.message) == ("error", "call: ValueError: shape mismatch")
    assert "raise ValueError" in (body.traceback or "")
    assert body.peak_allocated_bytes == 4096  # what it held when it failed


def test_a_test_that_kills_its_forked_process_is_recorded_as_crashed(pytester, project):
    (project / "test_crash.py").write_text("import os\n\ndef test_dies():\n    os.abort()\n")
    result = _pytest(pytester, "-q", "--memtrack", "--memtrack-forked", "test_crash.py")
    result.assert_outcomes(failed=1)
    (run,) = _runs(project / "data" / "memtrack.db")
    (m,) = run.measurements
    assert (m.status, m.message) == ("crashed", "call: the test's process was ended by SIGABRT")


FIGURES = """\
import torch


def test_0_first():
    torch.ones(16)


def test_blocks():
    kept = [torch.ones(256 * 1024) for _ in range(16)]  # 16 MiB
    assert len(kept) == 16


def test_temporaries():
    a = torch.ones(3 * 2**20)
    b = a * 2
    del a
    c = b + 1
    assert float(c[0]) == 3
"""


def test_a_test_reads_the_same_in_pytests_process_as_in_its_own(pytester, project):
    (project / "test_figures.py").write_text(FIGURES)
    runs = {}
    for mode in ((), ("--memtrack-forked",)):
        db = pytester.path / f"{'forked' if mode else 'shared'}.db"
        _pytest(pytester, "-q", "--memtrack", "--memtrack-db", str(db), *mode, "test_figures.py")
        (run,) = _runs(db)
        runs[bool(mode)] = {m.case_id: m for m in run.measurements}
    shared, forked = runs[False], runs[True]
    assert set(shared) == set(forked)
    for case in ("test_figures.py::test_blocks", "test_figures.py::test_temporaries"):
        assert shared[case].peak_allocated_bytes == forked[case].peak_allocated_bytes
    # host: the pages the test touched. Where it frees and allocates again, whether the C heap
    # reuses the freed memory follows what earlier tests left in it (process-wide, as the
    # docs say); what a test keeps reads the same either way.
    # what it cannot isolate (process-wide figures that follow the tests before it) is not
    # gated beside others, only said; alone, in its own process, it is
    case = "test_figures.py::test_blocks"
    assert metrics.value(shared[case], "host_step") is None
    assert any(n.startswith("process-wide (not gated): ") for n in shared[case].notes)
    assert metrics.value(forked[case], "host_step") is not None
    assert shared["test_figures.py::test_blocks"].peak_allocated_bytes == 16 * MiB
    assert "forked" in forked["test_figures.py::test_blocks"].notes[0]


def test_no_repository_is_an_error_before_any_test_runs(pytester):
    (pytester.path / "memtrack.toml").write_text(CONFIG)
    pytester.makepyfile(test_x="def test_x():\n    raise SystemExit('ran')\n")
    result = _pytest(pytester, "-q", "--memtrack")
    assert result.ret == 2
    assert "memtrack:" in result.stderr.str() + result.stdout.str()
    assert "not inside a git repository with a commit" in result.stderr.str() + result.stdout.str()
    assert "ran" not in result.stdout.str()


def test_the_plugin_is_pytests_entry_point_and_imports_no_torch():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    root = Path(__file__).resolve().parents[1]
    points = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]
    assert points["pytest11"] == {"memtrack": "memtrack.plugin.hooks"}
    code = (
        "import sys, memtrack.plugin.hooks as h; "
        "print(h.pytest_addoption.__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pytest_addoption", "False"]


def test_made_up_figures_for_want_of_a_gpu_show_a_budget_on_cuda_n_reads_that_device():
    from memtrack.plugin.budget import read_mark
    from memtrack.probes.span import DeviceRise, SpanFigures

    figures = SpanFigures(
        "cuda",
        allocated_bytes=64 * MiB,
        reserved_bytes=80 * MiB,
        devices=(DeviceRise(0, 64 * MiB, 80 * MiB, 900 * MiB), DeviceRise(1, MiB, 2 * MiB)),
    )
    assert read_mark(("1 GiB",), {"device": "cuda"}).figure(figures) == 64 * MiB
    assert read_mark(("1 GiB",), {"device": "cuda:1"}).figure(figures) == MiB
    assert read_mark(("1 GiB",), {"device": "cuda:1", "metric": "reserved"}).figure(figures) == (
        2 * MiB
    )
    assert read_mark(("1 GiB",), {"device": "cuda:1", "metric": "device"}).figure(figures) is None
    assert read_mark(("1 GiB",), {"device": "cuda:0", "metric": "device"}).figure(figures) == (
        900 * MiB
    )


@pytest.mark.gpu
def test_on_cuda_a_budget_reads_each_allocator_view_and_the_device_view(pytester):
    pytester.makepyfile(
        test_cuda="""
        import pytest, torch

        @pytest.mark.memory_budget("32 MiB", device="cuda")
        def test_over():
            keep = torch.ones(16 * 2**20, device="cuda")  # 64 MiB
            torch.cuda.synchronize()
        """
    )
    result = _pytest(pytester, "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "memory budget exceeded: allocated 64.00 MiB > 32.00 MiB" in out
    reserved = re.search(r"\n  reserved +([0-9.]+) MiB", out)
    assert reserved is not None and float(reserved.group(1)) >= 64, out
    assert re.search(r"\n  device +[0-9.]+ [MG]iB", out), out  # NVML's figure, where it reads


def test_a_test_over_its_budget_names_the_module_path_that_made_the_peak(pytester):
    pytester.makepyfile(
        test_model="""
        import pytest, torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.ReLU())

            def forward(self, x):
                return self.layers(x)

        NET = Net()

        @pytest.mark.memory_budget("1 MiB")
        def test_forward():
            with torch.no_grad():
                out = NET(torch.ones(512, 256))  # 8 MiB from the Linear
            assert out.shape == (512, 4096)
        """
    )
    result = _pytest(pytester, "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # the first module the test ran is the root: its children by their paths in it
    assert re.search(r"by module:\n +8\.00 MiB  layers\.0\n +8\.00 MiB  layers\.1\n", out), out
    assert re.search(r"16\.00 MiB  test_model\.py:forward:9\n", out), out


def test_a_training_tests_peak_is_put_on_the_forward_that_made_its_saved_activations(
    pytester, project
):
    # A model from an installed package (torch's own layers), so the test's lines are the
    # innermost own frames: its forward line makes the activations backward needs, its
    # backward line the gradients. At the step's peak the activations hold most of it.
    (project / "test_train.py").write_text(
        "import pytest\nimport torch\n\n\n"
        '@pytest.mark.memory_budget("1 MiB")\n'
        "def test_train():\n"
        "    torch.manual_seed(0)\n"
        "    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])\n"
        "    x = torch.randn(16384, 64)\n"
        "    out = model(x)\n"  # line 10
        "    out.square().mean().backward()\n"  # line 11
    )
    commit_all(project, "a training test")
    result = _pytest(pytester, "-q", "--memtrack", "test_train.py")
    result.assert_outcomes(failed=1)
    # the failure's sites: the peak on the forward's line, not on backward()'s
    # (the failure, and pytest's summary of it where its width shows the whole message)
    lines = [x for x in result.outlines if "test_train.py:test_train:" in x]
    assert lines, result.outlines
    for line in lines:
        assert line.split()[-1] == "test_train.py:test_train:10", line
        held = float(line.split()[0])
        assert line.split()[1] == "MiB" and held >= 40  # of a 52 MiB peak
