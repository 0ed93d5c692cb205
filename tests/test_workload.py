from __future__ import annotations

import pytest

from memtrack.config import load_config
from memtrack.errors import WorkloadError
from memtrack.workload import Workload, case_id, discover, select_cases


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
    assert {w.name for w in found} == {"decoder_generate", "train_step", "image_classify"}


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
