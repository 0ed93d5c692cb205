"""The worker contract: the spec and the result are typed records both sides import. A field
the worker writes that the record does not have fails where it is written; a result file a
workload overwrote or damaged is that case crashed, recorded, and the rest of the run kept."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from memtrack.config import load_config
from memtrack.measure.suite import run_suite
from memtrack.records import Measurement
from memtrack.worker.protocol import (
    FIGURES,
    MESSAGES,
    Discovered,
    Failed,
    Fork,
    ProtocolError,
    QualitySpec,
    Result,
    ResultFile,
    ServerStatus,
    Spec,
    decode_message,
    encode_message,
    read_result,
)
from memtrack.workload.registry import discover, select_cases


def _spec(**fields) -> Spec:
    base = dict(
        module="wl.py",
        root="/r",
        workload="w",
        params={"n": 1},
        seed=0,
        device="cpu",
        warmup=1,
        repeats=2,
        data_dir="/r/data",
        result_path="/tmp/result.json",
    )
    return Spec(**{**base, **fields})


def test_a_spec_survives_its_round_trip_through_json(tmp_path):
    spec = _spec(
        quality=QualitySpec(mode="compare", reference="w[n=1]", path="/r/ref.pt", sha256="0" * 64),
        ranks=2,
        scratch_dir="/tmp/s",
    )
    spec.write(tmp_path / "spec.json")
    assert Spec.read(tmp_path / "spec.json") == spec


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("seed"), "spec: missing key seed"),
        (lambda d: d.update(repats=2), "spec: unknown key\\(s\\) 'repats'"),
        (lambda d: d.update(warmup="1"), "spec.warmup: expected an integer"),
        (
            lambda d: d.update(quality={"mode": "compare", "sha": "x"}),
            "spec.quality: unknown key\\(s\\) 'sha'",
        ),
    ],
)
def test_a_spec_with_a_missing_misspelt_or_mistyped_field_is_refused(tmp_path, change, message):
    data = dataclasses.asdict(_spec())
    change(data)
    (tmp_path / "spec.json").write_text(json.dumps(data))
    with pytest.raises(ProtocolError, match=message):
        Spec.read(tmp_path / "spec.json")


def test_the_worker_cannot_write_a_field_the_result_does_not_have(tmp_path):
    out = ResultFile(tmp_path / "result.json")
    out.update(phase="setup", persistent_bytes=1024)
    with pytest.raises(ProtocolError, match="result: no field peak_alocated_bytes"):
        out.update(peak_alocated_bytes=1)
    assert read_result(tmp_path / "result.json").persistent_bytes == 1024


def test_every_figure_of_the_result_is_a_field_of_the_measurement():
    measured = {f.name for f in dataclasses.fields(Measurement)}
    assert set(FIGURES) <= measured
    assert "peak_allocated_bytes" in FIGURES and "status" not in FIGURES


@pytest.mark.parametrize(
    "content, why",
    [
        (b"[1, 2]", "expected an object, got list"),
        (
            b'{"status": "ok", "peak_allocated_bytes": "12"}',
            "peak_allocated_bytes: expected an integer",
        ),
        (b'{"status": "ok", "notes": "one"}', "notes: expected a list"),
        (b'{"status": "ok", "flags": 1}', "unknown key(s) 'flags'"),
        (b'{"status": "banana"}', "result.status: 'banana'"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_a_damaged_result_file_is_a_crashed_case_that_says_why(tmp_path, content, why):
    (tmp_path / "result.json").write_bytes(content)
    r = read_result(tmp_path / "result.json")
    assert r.status == "crashed" and why in (r.message or "")


def test_a_missing_or_half_written_result_says_the_worker_had_not_started(tmp_path):
    assert read_result(tmp_path / "none.json") == Result()
    (tmp_path / "half.json").write_text('{"status": "ok", "pha')
    assert read_result(tmp_path / "half.json") == Result()


def test_a_lone_surrogate_in_a_message_is_kept_as_text_that_can_be_stored(tmp_path):
    (tmp_path / "result.json").write_text(
        json.dumps({"status": "error", "message": "RuntimeError: \udcff"})
    )
    message = read_result(tmp_path / "result.json").message
    assert message == "RuntimeError: ?"
    message.encode("utf-8")  # would raise UnicodeEncodeError with the surrogate


def test_each_fork_server_message_travels_as_its_op_and_fields_and_comes_back_equal():
    sent = [
        Fork(("spec.json", "12")),
        Failed("WorkloadError", "wl.py: cannot import"),
        Discovered(({"name": "w", "params": {"n": [1, 2]}},)),
        ServerStatus(None, False, 4321),
    ]
    assert encode_message(sent[0]) == {
        "op": "Fork",
        "argv": ("spec.json", "12"),
        "worker": "memtrack.worker",
    }
    for message in sent:
        assert decode_message(encode_message(message)) == message
    assert {"Discover", "Fork", "Reap", "AskEnvironment", "AskStatus"} <= set(MESSAGES)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"op": "fork", "argv": []}, "no op 'fork'"),
        ({"argv": []}, "no op None"),
        ([1, 2], "no op None"),
        ({"op": "Fork"}, "Fork: missing key argv"),
        ({"op": "Reap", "pid": 1, "signal": 9}, "Reap: unknown key(s) 'signal'"),
    ],
)
def test_a_malformed_fork_server_message_is_refused(data, message):
    with pytest.raises(ProtocolError) as err:
        decode_message(data)
    assert str(err.value) == message


VANDALS = textwrap.dedent(
    """
    import json, os, sys
    import memtrack

    def _result_path():
        spec = json.load(open(sys.argv[1]))
        return spec["result_path"]

    @memtrack.workload(params={"how": ["list", "types", "bytes"]})
    def vandal(ctx):
        path = _result_path()
        def step():
            content = {"list": b"[1]", "types": b'{"status": "ok", "notes": 3}',
                       "bytes": b"\\xff\\xfe"}[ctx.params["how"]]
            with open(path, "wb") as f:
                f.write(content)
            os._exit(0)
        return step

    @memtrack.workload
    def fine(ctx):
        return lambda: None
    """
)


def test_a_workload_that_overwrites_its_result_file_is_recorded_as_crashed_and_the_run_kept(
    tmp_path,
):
    (tmp_path / "wl.py").write_text(VANDALS)
    (tmp_path / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 0\nrepeats = 1\n')
    config = load_config(tmp_path / "memtrack.toml")
    run = run_suite(config, select_cases(discover(config)))
    by_case = {m.case_id: m for m in run.measurements}
    assert by_case["fine"].status == "ok"
    for how in ("list", "types", "bytes"):
        m = by_case[f"vandal[how={how}]"]
        assert m.status == "crashed", (how, m.message)
        assert m.message.startswith("the worker's result was lost"), m.message
