"""The verdict arithmetic, on records stored in a real SQLite file."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from factories import CPU_ENV, GPU_ENV, MiB, make_measurement, make_run

from memtrack.compare import (
    FLOORS,
    baseline_spread,
    budgets_for,
    check,
    repeat_spread,
    save_verdicts,
    suggest_budget,
)
from memtrack.config import Budget, Config
from memtrack.store import Store

BASE = 100 * MiB


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "m.db")
    yield s
    s.close()


def _config(tmp_path: Path, **kw) -> Config:
    return Config(path=None, root=tmp_path, **kw)


def _record(store: Store, measurements, minute: int, **kw) -> str:
    run = make_run(measurements, started_at=f"2026-01-01T00:{minute:02d}:00+00:00", **kw)
    store.write_run(run)
    return run.run_id


def _candidate(store: Store, measurements, minute: int = 30, **kw) -> str:
    """A PR's run: on another branch, so it never joins a later candidate's baseline."""
    return _record(store, measurements, minute, branch="pr", **kw)


def _baseline(store: Store, values, **kw) -> None:
    for i, v in enumerate(values):
        _record(store, [make_measurement(peak=v, **kw)], i)


def _verdict(result, metric="allocated"):
    (v,) = [v for v in result.verdicts if v.metric == metric]
    return v


def test_spread_never_lets_an_observed_value_exceed_its_threshold():
    assert baseline_spread([BASE] * 5) == 0
    assert baseline_spread([BASE] * 20 + [BASE + 2 * MiB]) == MiB  # 20+ runs: no scaling
    values = [BASE, BASE, BASE, BASE, BASE + 4 * MiB]
    spread = baseline_spread(values)
    assert spread >= 2 * MiB  # half the range, though the MAD is 0
    assert 3 * spread > 4 * MiB
    assert baseline_spread([BASE]) == 0


def test_repeat_spread_is_the_gap_between_the_two_highest_iterations():
    steady = make_measurement(samples=(36_576_780, 39_750_268, 39_750_268))
    assert repeat_spread(steady, "allocated") == 0  # a lower first iteration is structure
    assert repeat_spread(make_measurement(samples=(10, 12, 11)), "allocated") == 1
    assert repeat_spread(steady, "host") == 0


def test_deterministic_two_percent_regression_blocks_with_its_arithmetic(store, tmp_path):
    _baseline(store, [BASE] * 5)
    run_id = _candidate(store, [make_measurement(peak=int(BASE * 1.02))], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking, v.provisional) == ("regression", True, False)
    assert v.baseline_value == BASE and v.spread == 0 and v.floor == 512
    assert v.threshold == BASE + 512
    assert v.delta == int(BASE * 1.02) - BASE and round(v.delta_pct, 2) == 2.0
    for part in ("baseline 100.00 MiB", "median of 5 runs", "x factor 3", "floor 512 B",
                 "threshold", "candidate 102.00 MiB", "+2.00%", "regression"):
        assert part in v.message
    assert result.exit_code == 1


@pytest.mark.parametrize("delta, kind", [(512, "ok"), (513, "regression"), (-513, "improvement")])
def test_the_allocator_floor_is_the_smallest_change_that_counts(store, tmp_path, delta, kind):
    _baseline(store, [BASE] * 4)
    run_id = _candidate(store, [make_measurement(peak=BASE + delta)], 10)
    assert _verdict(check(store, _config(tmp_path), run_id=run_id)).kind == kind


def test_observed_noise_widens_the_headroom(store, tmp_path):
    noisy = [BASE, BASE + MiB, BASE - MiB, BASE + 3 * MiB, BASE]
    for i, v in enumerate(noisy):
        _record(store, [make_measurement(host=v)], i)
    ok = _candidate(store, [make_measurement(host=BASE + 3 * MiB)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=ok), "host")
    assert v.kind == "ok" and v.floor == FLOORS["host"]
    # half the 4 MiB range, scaled from 5 runs to the range 20 runs would show
    assert v.spread == pytest.approx(2 * MiB * 3.735 / 2.326)
    bad = _candidate(store, [make_measurement(host=BASE + 10 * MiB)], 11)
    assert _verdict(check(store, _config(tmp_path), run_id=bad), "host").kind == "regression"


def test_baseline_is_the_last_n_runs(store, tmp_path):
    _baseline(store, [2 * BASE] * 3 + [BASE] * 3)  # older runs at another level
    run_id = _candidate(store, [make_measurement(peak=BASE)], 10)
    v = _verdict(check(store, _config(tmp_path, baseline_runs=3), run_id=run_id))
    assert (v.kind, v.baseline_runs, v.baseline_value) == ("ok", 3, BASE)


def test_few_baseline_runs_are_provisional_and_block_only_big_jumps(store, tmp_path):
    _baseline(store, [BASE] * 2)
    small = _candidate(store, [make_measurement(peak=int(BASE * 1.02))], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=small))
    assert (v.kind, v.provisional, v.blocking) == ("regression", True, False)
    big = _candidate(store, [make_measurement(peak=int(BASE * 1.2))], 11)
    v = _verdict(check(store, _config(tmp_path), run_id=big))
    assert (v.kind, v.provisional, v.blocking) == ("regression", True, True)


def test_improvement_suggests_a_tighter_budget(store, tmp_path):
    _baseline(store, [BASE] * 4)
    run_id = _candidate(store, [make_measurement(peak=60 * MiB)], 10)
    budget = Budget("decoder", 128 * MiB, "fits", metric="allocated")
    v = _verdict(check(store, _config(tmp_path, budgets=(budget,)), run_id=run_id))
    assert v.kind == "improvement" and not v.blocking
    assert 60 * MiB < v.suggested_budget < 128 * MiB
    assert v.suggested_budget == suggest_budget(60 * MiB, 512) == 66 * MiB
    assert "a budget of 66.00 MiB would hold it" in v.message


def test_budget_breach_blocks_without_a_baseline(store, tmp_path):
    run_id = _candidate(store, [make_measurement(peak=70 * MiB)], 1)
    budget = Budget("decoder", 64 * MiB, "two sessions on a 24 GiB card", metric="allocated")
    result = check(store, _config(tmp_path, budgets=(budget,)), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking, v.budget_bytes) == ("over_budget", True, 64 * MiB)
    assert "two sessions on a 24 GiB card" in v.message and "OVER by 6.00 MiB" in v.message
    assert _verdict(result, "host").kind == "new"


def test_the_most_specific_budget_applies():
    gpu_m = make_measurement(device="cuda", reserved=BASE, device_peak=BASE)
    budgets = (
        Budget("decoder", 10 * MiB, "anywhere"),
        Budget("decoder", 20 * MiB, "on H200", gpu="NVIDIA H200"),
        Budget(gpu_m.case_id, 30 * MiB, "this case on H200", gpu="nvidia h200"),
        Budget("decoder", 40 * MiB, "on the CPU", gpu="cpu", metric="allocated"),
    )
    chosen = budgets_for(budgets, gpu_m, GPU_ENV)
    assert set(chosen) == {"device"}  # no metric named: the device view where measured
    assert chosen["device"].reason == "this case on H200"
    cpu_m = make_measurement()
    assert budgets_for(budgets, cpu_m, CPU_ENV)["allocated"].reason == "on the CPU"
    assert budgets_for(budgets[1:3], cpu_m, CPU_ENV) == {}  # GPU budgets skip CPU cases
    tie = (Budget("decoder", 50 * MiB, "loose"), Budget("decoder", 45 * MiB, "tight"))
    assert budgets_for(tie, cpu_m, CPU_ENV)["allocated"].reason == "tight"


def test_environment_change_is_reported_not_compared(store, tmp_path):
    _baseline(store, [BASE] * 4)
    new_env = replace(CPU_ENV, fingerprint="cpu-env-2", torch="2.14.0+cpu")
    run_id = _candidate(store, [make_measurement(peak=2 * BASE)], 10, env=new_env)
    result = check(store, _config(tmp_path), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking, v.baseline_value) == ("environment_changed", False, None)
    assert "torch: 2.13.0+cpu -> 2.14.0+cpu" in v.details
    assert "not compared" in v.message
    assert result.exit_code == 0


@pytest.mark.parametrize("baseline_status, blocking", [("ok", True), ("oom", False)])
def test_a_failed_candidate_blocks_unless_the_baseline_failed_too(store, tmp_path,
                                                                  baseline_status, blocking):
    for i in range(3):
        _record(store, [make_measurement(status=baseline_status)], i)
    oom = make_measurement(status="oom", message="CUDA out of memory")
    run_id = _candidate(store, [oom], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    (v,) = result.verdicts
    assert (v.metric, v.kind, v.blocking) == ("status", "failed", blocking)
    assert "oom (CUDA out of memory)" in v.message


def test_time_regression_warns_by_default_and_blocks_when_configured(store, tmp_path):
    for i in range(5):
        times = tuple(0.010 + 0.0001 * ((i + k) % 4) for k in range(3))
        _record(store, [make_measurement(times=times)], i)
    same = _candidate(store, [make_measurement(times=(0.0101, 0.0102, 0.0100))], 9)
    t = _verdict(check(store, _config(tmp_path), run_id=same), "time")
    assert (t.kind, t.p_value) == ("ok", None)  # no effect: not even tested
    slow = _candidate(store, [make_measurement(times=(0.020, 0.021, 0.022))], 10)
    t = _verdict(check(store, _config(tmp_path), run_id=slow), "time")
    assert (t.kind, t.blocking) == ("time_regression", False) and t.p_value < 0.01
    assert "Mann-Whitney U" in t.message
    t = _verdict(check(store, _config(tmp_path, time_regression="block"), run_id=slow), "time")
    assert t.blocking
    result = check(store, _config(tmp_path, time_regression="off"), run_id=slow)
    assert "time" not in {v.metric for v in result.verdicts}


def test_peak_plus_headroom_must_fit_each_device(store, tmp_path):
    vram = GPU_ENV.gpus[0].total_bytes
    for i in range(3):
        _record(store, [make_measurement(device="cuda", reserved=BASE,
                                         device_peak=vram - MiB)], i, env=GPU_ENV)
    run_id = _candidate(store, [make_measurement(device="cuda", reserved=BASE,
                                              device_peak=vram - MiB)], 10, env=GPU_ENV)
    v = _verdict(check(store, _config(tmp_path), run_id=run_id), "device")
    assert (v.kind, v.blocking) == ("over_budget", True)  # 1 MiB left < the 2 MiB floor
    assert v.budget_reason == "VRAM of device 0 (NVIDIA H200)"
    assert any("does NOT fit" in d for d in v.details)


def test_verdicts_are_recorded_once_per_run(store, tmp_path):
    _baseline(store, [BASE] * 3)
    run_id = _candidate(store, [make_measurement(peak=BASE + MiB)], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    assert save_verdicts(store, result) == len(result.verdicts)
    save_verdicts(store, result)  # again: replaces, never duplicates
    rows = [dict(r) for r in store.conn.execute(
        "select * from verdicts where run_id = ? order by id", [run_id])]
    assert len(rows) == len(result.verdicts)
    row = next(r for r in rows if r["metric"] == "allocated")
    assert (row["kind"], row["blocking"], row["baseline_runs"]) == ("regression", 1, 3)
    assert row["threshold"] == BASE + 512 and row["delta"] == MiB
    assert row["message"].startswith("allocated: baseline")
    cols = [r[1] for r in store.conn.execute("pragma table_info(verdicts)")]
    assert cols == ["id", "run_id", "case_id", "workload", "metric", "kind", "blocking",
                    "provisional", "baseline_value", "spread", "factor", "floor", "threshold",
                    "candidate_value", "delta", "delta_pct", "budget_bytes", "budget_reason",
                    "baseline_runs", "message", "checked_at", "context", "accepted_reason",
                    "component", "component_delta", "level_commit"]


def test_compare_and_report_import_no_heavy_modules():
    import subprocess

    code = ("import sys, memtrack.compare, memtrack.report, memtrack.commands.check;"
            "print(sorted(m for m in ('torch', 'scipy', 'sqlite_utils', 'pandas', 'ruptures')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
