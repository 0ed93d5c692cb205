from __future__ import annotations

import pytest
from click.testing import CliRunner

from memtrack.cli import main
from memtrack.config import load_config
from memtrack.errors import WorkloadError
from memtrack.workload.registry import Workload, case_id, discover, select_cases


def _noop(ctx):
    return lambda: None


def test_grid_expands_to_one_case_per_combination():
    wl = Workload("w", _noop, {"batch": (1, 8), "dtype": ("float32", "bfloat16"), "seq": (2048,)})
    cases = wl.cases()
    assert len(cases) == 4
    assert {c.case_id for c in cases} == {
        "w[batch=1,dtype=float32,seq=2048]",
        "w[batch=1,dtype=bfloat16,seq=2048]",
        "w[batch=8,dtype=float32,seq=2048]",
        "w[batch=8,dtype=bfloat16,seq=2048]",
    }


def test_case_id_is_independent_of_param_order():
    assert case_id("w", {"b": 1, "a": 2}) == case_id("w", {"a": 2, "b": 1}) == "w[a=2,b=1]"
    assert case_id("w", {}) == "w"


def test_selection_by_pattern_and_shards_cover_the_suite_once():
    wl = Workload("w", _noop, {"batch": (1, 2, 3, 4, 5)})
    assert [c.params["batch"] for c in select_cases([wl], ["batch=3"])] == [3]
    shards = [select_cases([wl], shard=(i, 3)) for i in (1, 2, 3)]
    ids = [c.case_id for s in shards for c in s]
    assert sorted(ids) == sorted(c.case_id for c in wl.cases())
    assert all(shards)


def test_discover_finds_workloads_in_a_file_named_by_the_config(tmp_path):
    (tmp_path / "wl.py").write_text(
        "import memtrack\n"
        "@memtrack.workload(params={'n': [1, 2]})\n"
        "def tiny_discovered(ctx):\n    return lambda: None\n"
    )
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    found = discover(load_config(tmp_path / "memtrack.toml"))
    assert [w.name for w in found] == ["tiny_discovered"]
    assert len(found[0].cases()) == 2


def test_a_module_that_cannot_be_imported_names_the_file_and_key(tmp_path):
    (tmp_path / "memtrack.toml").write_text('modules = ["no_such_module_xyz"]\n')
    with pytest.raises(
        WorkloadError, match=r"memtrack.toml: modules: cannot import 'no_such_module_xyz'"
    ):
        discover(load_config(tmp_path / "memtrack.toml"))


def test_the_shipped_examples_are_the_default_suite(tmp_path):
    found = discover(load_config(cwd=tmp_path))
    assert {w.name for w in found} == {
        "decoder_generate",
        "decoder_serve",
        "train_step",
        "image_classify",
        "load_checkpoint",
        "gpt_generate",
    }


def test_config_params_scale_a_workload_without_editing_it(tmp_path):
    (tmp_path / "memtrack.toml").write_text(
        "[workloads.decoder_generate.params]\nsessions = [8, 32]\nd_model = 4096\n"
    )
    found = {w.name: w for w in discover(load_config(tmp_path / "memtrack.toml"))}
    cases = found["decoder_generate"].cases()
    assert [c.params["sessions"] for c in cases] == [8, 32]
    assert {c.params["d_model"] for c in cases} == {4096}


def test_an_unknown_param_override_names_the_key(tmp_path):
    (tmp_path / "memtrack.toml").write_text("[workloads.train_step.params]\nbatchsize = 64\n")
    with pytest.raises(
        WorkloadError, match=r"workloads.train_step.params.batchsize: train_step has no param"
    ):
        discover(load_config(tmp_path / "memtrack.toml"))


def _suite(tmp_path, files, config='modules = ["wl.py"]\n'):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "memtrack.toml").write_text(config)
    return load_config(tmp_path / "memtrack.toml")


def _cli_run(tmp_path):
    """`memtrack run` on the suite: (exit status, output); the database must stay unwritten."""
    db = tmp_path / "m.db"
    args = ["run", "--config", str(tmp_path / "memtrack.toml"), "--db", str(db)]
    result = CliRunner().invoke(main, args)
    assert not db.exists()
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "import memtrack\nraise RuntimeError('set GPU_ARCH first')\n",
            r"modules: cannot import 'wl.py': RuntimeError: set GPU_ARCH first$",
        ),
        ("def broken(:\n    pass\n", r"modules: cannot import 'wl.py': SyntaxError: .*line 1"),
        ("import sys\nsys.exit(3)\n", r"modules: cannot import 'wl.py': SystemExit: 3$"),
    ],
)
def test_a_module_that_fails_at_import_is_one_line_exit_2(tmp_path, source, message):
    config = _suite(tmp_path, {"wl.py": source})
    with pytest.raises(WorkloadError, match=message):
        discover(config)
    code, output = _cli_run(tmp_path)
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert "Traceback" not in output and "'wl.py'" in output


def test_one_workload_name_in_two_modules_is_refused_naming_both(tmp_path):
    body = "import memtrack\n@memtrack.workload\ndef train(ctx):\n    return lambda: None\n"
    config = _suite(tmp_path, {"a.py": body, "b.py": body}, 'modules = ["a.py", "b.py"]\n')
    with pytest.raises(
        WorkloadError, match=r"workload 'train' is declared in two modules: .*a\.py and .*b\.py"
    ):
        discover(config)
    assert _cli_run(tmp_path)[0] == 2


def test_param_values_that_read_alike_are_refused(tmp_path):
    source = (
        "import memtrack\n@memtrack.workload(params={'x': [1, '1']})\n"
        "def alike(ctx):\n    return lambda: None\n"
    )
    config = _suite(tmp_path, {"wl.py": source})
    with pytest.raises(
        WorkloadError, match=r"workload 'alike': param 'x': values 1 and '1' both read '1'"
    ):
        discover(config)
    assert _cli_run(tmp_path)[0] == 2


def test_param_overrides_that_read_alike_are_refused(tmp_path):
    config = _suite(tmp_path, {}, '[workloads.train_step.params]\nbatch = [8, "8"]\n')
    with pytest.raises(
        WorkloadError, match=r"workloads.train_step.params.batch: values 8 and '8' both read"
    ):
        discover(config)


def test_cases_whose_ids_collide_across_params_are_refused():
    wl = Workload("w", _noop, {"a": ("1,b=2", "1"), "b": ("3", "2,b=3")})
    with pytest.raises(WorkloadError, match=r"two cases share the id 'w\[a=1,b=2,b=3\]'"):
        select_cases([wl])


def test_a_grid_over_max_cases_is_refused_before_anything_runs(tmp_path):
    source = (
        "import memtrack\n"
        "@memtrack.workload(params={'a': list(range(100)), 'b': list(range(100)),"
        " 'c': list(range(100))})\n"
        "def huge(ctx):\n    return lambda: None\n"
        "@memtrack.workload(params={'n': [1, 2]})\n"
        "def small(ctx):\n    return lambda: None\n"
    )
    config = _suite(tmp_path, {"wl.py": source})
    with pytest.raises(
        WorkloadError,
        match=r"max_cases: the suite has 1,000,002 cases, more than 1,000 "
        r"\(largest grids: huge \(1,000,000\), small \(2\)\)",
    ):
        discover(config)
    code, output = _cli_run(tmp_path)
    assert code == 2 and "running" not in output


def test_max_cases_is_the_configured_size(tmp_path):
    source = (
        "import memtrack\n@memtrack.workload(params={'n': [1, 2, 3]})\n"
        "def three(ctx):\n    return lambda: None\n"
    )
    config = _suite(tmp_path, {"wl.py": source}, 'modules = ["wl.py"]\nmax_cases = 2\n')
    with pytest.raises(WorkloadError, match=r"the suite has 3 cases, more than 2"):
        discover(config)
    config = _suite(tmp_path, {"wl.py": source}, 'modules = ["wl.py"]\nmax_cases = 3\n')
    assert len(select_cases(discover(config))) == 3


def test_a_module_that_exits_without_a_message_is_named_with_its_exit(tmp_path):
    config = _suite(tmp_path, {"wl.py": "raise SystemExit\n"})
    with pytest.raises(WorkloadError, match=r"cannot import 'wl.py': SystemExit$"):
        discover(config)


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "import os\nos._exit(0)\n",
            r"cannot import 'wl.py': it ended the process \(exit status 0\)$",
        ),
        ("raise KeyboardInterrupt\n", r"cannot import 'wl.py': KeyboardInterrupt$"),
    ],
)
def test_a_module_that_ends_or_interrupts_its_own_import_is_exit_2_naming_it(
    tmp_path, source, message
):
    """Not exit 0 with nothing recorded, nor the 130 of a real ^C: the modules are imported in
    the fork server, not in `memtrack run` itself."""
    import re
    import subprocess
    import sys

    _suite(tmp_path, {"wl.py": source})
    db = tmp_path / "m.db"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "memtrack.cli",
            "run",
            "--config",
            str(tmp_path / "memtrack.toml"),
            "--db",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), res.stderr
    assert lines[0].startswith("memtrack: error: ") and "Traceback" not in res.stderr
    assert not db.exists()
