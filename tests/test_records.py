"""Run records are untrusted input: every value is checked when a record is loaded, and the
shipped JSON Schema says the same as the loader."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from factories import GPU_ENV, MiB, make_measurement, make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memtrack
from memtrack.errors import RecordError
from memtrack.records import json_schema, read_json, run_from_dict, to_dict

SHIPPED = Path(memtrack.__file__).parent / "records" / "schema" / "run-record.schema.json"


def _good() -> dict:
    run = make_run(
        [
            make_measurement("decoder", {"batch": b}, device="cuda", device_peak=b * MiB)
            for b in (1, 8)
        ],
        env=GPU_ENV,
    )
    return to_dict(run)


def test_a_written_record_loads_back_equal():
    data = _good()
    assert to_dict(run_from_dict(copy.deepcopy(data))) == data


def test_the_shipped_schema_is_the_generated_one():
    shipped = json.loads(SHIPPED.read_text())
    assert shipped == json_schema(), (
        "memtrack/records/schema/run-record.schema.json is stale; regenerate it with "
        "`python -m memtrack.records > memtrack/records/schema/run-record.schema.json`"
    )


def test_the_schema_describes_every_field_of_the_dataclasses():
    schema = json_schema()
    measurement = schema["$defs"]["Measurement"]["properties"]
    assert measurement["peak_allocated_bytes"]["type"] == ["integer", "null"]
    assert measurement["peak_allocated_bytes"]["minimum"] == 0
    assert measurement["status"]["enum"] == ["ok", "oom", "error", "timeout", "crashed"]
    assert schema["$defs"]["GitInfo"]["properties"]["merge_base"]["pattern"]
    assert set(schema["required"]) >= {"run_id", "started_at", "measurements"}


def test_a_good_record_is_valid_under_the_schema():
    jsonschema.Draft202012Validator(json_schema()).validate(_good())


def _measurement(data: dict, **changes) -> dict:
    data["measurements"][0].update(changes)
    return data


BAD = {
    "negative bytes": lambda d: _measurement(d, peak_allocated_bytes=-1),
    "bytes as a string": lambda d: _measurement(d, peak_allocated_bytes="lots"),
    "bytes of 10^30": lambda d: _measurement(d, host_peak_rss_bytes=10**30),
    "a bool for bytes": lambda d: _measurement(d, peak_allocated_bytes=True),
    "params as a list": lambda d: _measurement(d, params=[1, 2]),
    "a nested param": lambda d: _measurement(d, params={"x": {"y": 1}}),
    "an unknown status": lambda d: _measurement(d, status="fine"),
    "negative seconds": lambda d: _measurement(d, time_median_s=-0.5),
    "a time as a number": lambda d: {**d, "started_at": 1767225600},
    "a time that is no time": lambda d: {**d, "started_at": "yesterday"},
    "an empty run id": lambda d: {**d, "run_id": ""},
    "a run id with %": lambda d: {**d, "run_id": "%"},
    "a run id with a slash": lambda d: {**d, "run_id": "../x"},
    "an option as merge base": lambda d: {**d, "git": {**d["git"], "merge_base": "--output=x"}},
    "a commit that is not hex": lambda d: {**d, "git": {**d["git"], "commit": "HEAD~1"}},
    "a commit of 8 characters": lambda d: {**d, "git": {**d["git"], "commit": "0123abcd"}},
    "a run id that is not hex": lambda d: {**d, "run_id": "nightly-2026-01-01"},
    "a message past the bound": lambda d: _measurement(d, message="m" * 10_001),
    "a note past the bound": lambda d: _measurement(d, notes=["n" * 10_001]),
    "a param's text past the bound": lambda d: _measurement(d, params={"p": "v" * 10_001}),
    "an unknown key": lambda d: {**d, "extra": 1},
    "a missing key": lambda d: {k: v for k, v in d.items() if k != "started_at"},
    "a device's negative bytes": lambda d: _measurement(
        d, devices=[{**d["measurements"][0]["devices"][0], "peak_process_bytes": -5}]
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_by_loader_and_schema_alike(name):
    data = BAD[name](_good())
    with pytest.raises(RecordError) as err:
        run_from_dict(copy.deepcopy(data), where="r.json")
    assert str(err.value).startswith("r.json") and "\n" not in str(err.value)
    validator = jsonschema.Draft202012Validator(
        json_schema(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    if name != "a time that is no time":  # 'format' is advisory in JSON Schema
        assert not validator.is_valid(data), name


def test_the_error_names_the_field_and_value():
    data = _measurement(_good(), peak_allocated_bytes=-1)
    with pytest.raises(RecordError) as err:
        run_from_dict(data, where="r.json")
    assert str(err.value) == "r.json: measurements[0].peak_allocated_bytes: -1 is below 0"


def test_two_measurements_of_one_case_in_one_run_are_refused():
    data = _good()
    data["measurements"][1] = copy.deepcopy(data["measurements"][0])
    with pytest.raises(RecordError, match="measured twice"):
        run_from_dict(data)


def test_commit_ids_are_normalised_to_lower_case():
    data = _good()
    data["git"]["commit"] = data["git"]["commit"].upper()
    assert run_from_dict(data).git.commit == data["git"]["commit"].lower()


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_json_nan_and_infinity_are_refused(tmp_path, text):
    raw = json.dumps(_good()).replace('"time_median_s": 0.01', f'"time_median_s": {text}', 1)
    assert text in raw
    path = tmp_path / "r.json"
    path.write_text(raw)
    with pytest.raises(RecordError, match="not valid JSON"):
        read_json(path)


def test_a_deeply_nested_file_is_one_line_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecordError, match="nested too deeply") as err:
        read_json(path)
    assert "\n" not in str(err.value)


def test_a_binary_file_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RecordError, match="not valid JSON"):
        read_json(path)


# -- property tests: any input gives a record or a one-line RecordError --------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


def _one_line_or_record(data) -> None:
    try:
        run_from_dict(data, where="r.json")
    except RecordError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_any_json_value_gives_a_record_or_a_one_line_error(value):
    _one_line_or_record(value)


_TEMPLATE = _good()


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


_ALL_PATHS = [p for p in _paths(_TEMPLATE) if p]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_ALL_PATHS), _json_values)
def test_a_good_record_with_one_value_replaced_gives_a_record_or_a_one_line_error(path, value):
    data = copy.deepcopy(_TEMPLATE)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    _one_line_or_record(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_file_content_gives_a_record_or_a_one_line_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("r") / "r.json"
    path.write_bytes(content)
    try:
        read_json(path)
    except RecordError as exc:
        assert "\n" not in str(exc)


def _outcome(data):
    try:
        return run_from_dict(copy.deepcopy(data), where="r.json")
    except RecordError as exc:
        return str(exc)


def _replaced(path, value):
    data = copy.deepcopy(_TEMPLATE)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


_EDGES = [
    None,
    -1,
    0,
    1,
    2**62,
    2**63,
    -(2**63) - 1,
    10**30,
    1.5,
    1.0,
    -0.0,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "ok",
    "fine",
    "ABC",
    "deadbeef",
    "2026-01-01T00:00:00+00:00",
    True,
    False,
    [],
    [1],
    {},
    {"a": 1},
]


def test_a_plain_value_tested_inline_is_judged_as_its_check_judges_it():
    """The loader tests plain values (numbers in range, strings, flags) inline, for speed:
    a record with any one value replaced by an edge case loads to the same record, or the
    same error, as when each value is checked by its own call (the inline tests off)."""
    import dataclasses

    from memtrack.records import validate as records

    cases = [_replaced(path, value) for path in _ALL_PATHS for value in _EDGES]
    inline = records.RECORD
    records.RECORD = dataclasses.replace(inline, inline=False)  # every value by its call
    try:
        by_checks = [_outcome(d) for d in cases]
    finally:
        records.RECORD = inline
    differ = [
        (path, value)
        for (path, value), d, want in zip(
            ((p, v) for p in _ALL_PATHS for v in _EDGES), cases, by_checks, strict=True
        )
        if _outcome(d) != want
    ]
    assert not differ
    assert {type(x) for x in by_checks} == {str, records.RunRecord}  # both outcomes occur


def test_the_iteration_figures_are_checked_and_a_record_from_before_them_loads():
    data = _good()
    before = copy.deepcopy(data)
    fine = _measurement(
        copy.deepcopy(data),
        retained_samples=[-6400, 0, 6400],  # an iteration may free what an earlier one made
        iteration_cpu_times_s=[0.01, 0.02],
        timing_cpu_pressure=1.0,
        timing_runnable=0.5,
        timing_steal=0.0,
        timing_cores=16,
        session_peak_bytes=MiB,
        sessions_sum_bytes=4 * MiB,
    )
    m = run_from_dict(fine).measurements[0]
    assert m.retained_samples == (-6400, 0, 6400) and m.timing_cores == 16
    validator = jsonschema.Draft202012Validator(json_schema())
    assert validator.is_valid(fine)
    for bad in (
        {"timing_cpu_pressure": 1.5},
        {"timing_steal": -0.1},
        {"timing_runnable": -1.0},
        {"timing_cores": -1},
        {"iteration_cpu_times_s": [0.01, -0.01]},
        {"iteration_device_times_s": [-1.0]},
        {"session_peak_bytes": -1},
        {"sessions_sum_bytes": "many"},
        {"retained_samples": [2**62]},
        {"retained_samples": [1.5]},
    ):
        changed = _measurement(copy.deepcopy(data), **bad)
        with pytest.raises(RecordError, match=next(iter(bad))):
            run_from_dict(copy.deepcopy(changed))
        assert not validator.is_valid(changed), bad
    for m in data["measurements"]:  # a record written before the fields: without them
        for name in ITERATION_FIGURES:
            del m[name]
    assert run_from_dict(data) == run_from_dict(before)  # read with their defaults
    assert validator.is_valid(data)


ITERATION_FIGURES = (
    "retained_samples",
    "iteration_cpu_times_s",
    "iteration_device_times_s",
    "timing_cpu_pressure",
    "timing_runnable",
    "timing_steal",
    "timing_cores",
    "session_peak_bytes",
    "sessions_sum_bytes",
)


def test_only_an_estimate_carries_kernel_scratch_and_it_is_part_of_its_peak():
    data = _good()
    peak = data["measurements"][0]["peak_allocated_bytes"]
    run_id = "a" * 32
    fine = _measurement(
        copy.deepcopy(data), kind="estimate", scratch_bytes=peak // 4, scratch_run_id=run_id
    )
    m = run_from_dict(fine).measurements[0]
    assert m.scratch_bytes == peak // 4 and m.scratch_run_id == run_id
    for bad, match in (
        ({"scratch_bytes": MiB, "scratch_run_id": run_id}, "only estimates have one"),
        ({"kind": "estimate", "scratch_bytes": MiB}, "go together"),
        ({"kind": "estimate", "scratch_bytes": peak + 1, "scratch_run_id": run_id}, "exceeds"),
        ({"kind": "estimate", "scratch_bytes": -1, "scratch_run_id": run_id}, "scratch_bytes"),
        ({"kind": "estimate", "scratch_bytes": 1, "scratch_run_id": "run 12"}, "scratch_run_id"),
    ):
        with pytest.raises(RecordError, match=match):
            run_from_dict(_measurement(copy.deepcopy(data), **bad))


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (
            {"pair_ref": "a" * 40, "pair_figure": "CPU time", "pair_times_s": [0.1] * 5},
            "pair_ref: a paired timing holds pair_ref, pair_figure, pair_times_s and",
        ),
        (
            {
                "pair_ref": "a" * 40,
                "pair_figure": "CPU time",
                "pair_times_s": [0.1] * 5,
                "pair_ref_times_s": [0.1] * 4,
            },
            "pair_times_s: 5 rounds against 4 of pair_ref_times_s",
        ),
        (
            {
                "pair_ref": "a" * 40,
                "pair_figure": "CPU time",
                "pair_times_s": [1e300] * 5,
                "pair_ref_times_s": [1e-4] * 5,
            },
            "pair_times_s: 1e+300 is not a pass's time",
        ),
    ],
)
def test_a_paired_timing_from_elsewhere_is_checked_value_by_value(fields, said):
    from memtrack.errors import RecordError
    from memtrack.records import run_from_dict, to_dict

    data = to_dict(make_run([make_measurement()]))
    data["measurements"][0].update(fields)
    with pytest.raises(RecordError) as caught:
        run_from_dict(data, where="r.json")
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_workload_s_nul_is_kept_as_a_replacement_character_and_a_param_s_refused():
    """A workload's own text (an error, its notes) is data: a NUL in it is stored as U+FFFD,
    which every history can hold. A param value is an identity: one holding a NUL is refused
    where the workload is declared."""
    from memtrack.errors import WorkloadError
    from memtrack.records.redact import redact

    assert redact("bad byte \x00 here") == "bad byte \ufffd here"
    m = make_measurement(status="error", message=redact("boom\x00"))
    assert run_from_dict(json.loads(json.dumps(to_dict(make_run([m]))))).measurements[0] == m
    with pytest.raises(WorkloadError, match="holds a NUL character"):
        memtrack.workload(lambda ctx: None, name="nul", params={"tag": ["a", "b\x00"]})
