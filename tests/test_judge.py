"""The verdict arithmetic (memtrack.judge), on records stored in a real SQLite file."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from factories import (
    CPU_ENV,
    GPU_ENV,
    RERUNS,
    MiB,
    make_measurement,
    make_run,
    read_reruns,
)

from memtrack.config import Budget, Config
from memtrack.errors import ConfigError, StoreError
from memtrack.judge import noise
from memtrack.judge.budgets import budgets_for
from memtrack.judge.check import check
from memtrack.judge.memory import suggest
from memtrack.records import Measurement
from memtrack.records.metrics import FLOORS
from memtrack.report.check import record
from memtrack.report.words import details, message
from memtrack.store.database import VERDICT_COLUMNS, Store

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


def test_sigma_is_read_from_successive_differences_and_no_step_moves_it():
    # a deterministic figure has no noise, whatever its steps
    assert noise.sigma(noise.differences([float(BASE)] * 8 + [float(BASE + MiB)] * 4)) == 0
    # normal noise: sigma is its standard deviation (the trimmed mean's constant is exact)
    import random

    rng = random.Random(3)
    values = [rng.gauss(0, 1000) for _ in range(4000)]
    assert noise.sigma(noise.differences(values)) == pytest.approx(1000, rel=0.05)
    # a step moves one difference of many: sigma barely moves with it
    stepped = values[:2000] + [v + 10**6 for v in values[2000:]]
    assert noise.sigma(noise.differences(stepped)) == pytest.approx(1000, rel=0.06)
    # a figure that takes a few values moves though most differences are 0
    a, b = 10957824.0, 10576896.0
    assert noise.sigma(noise.differences([a, a, a, b, a, a, b, a, a, a])) > 0


def test_the_small_sample_factor_is_computed_and_never_jumps():
    # t(0.99, n - 1) / z(0.99): Student's t itself, not a table that ends
    assert noise.t_quantile(0.99, 4) == pytest.approx(3.7469, abs=1e-4)
    assert noise.t_quantile(0.99, 19) == pytest.approx(2.5395, abs=1e-4)
    assert noise.small_sample(5) == pytest.approx(1.6107, abs=1e-4)
    factors = [noise.small_sample(n) for n in range(3, 200)]
    pairs = list(zip(factors[:-1], factors[1:], strict=True))
    assert all(a > b for a, b in pairs)  # narrower with every run
    assert max(a / b for a, b in pairs) < 1.6  # no cut-off
    assert factors[-1] == pytest.approx(1.0, abs=0.02)


def test_deterministic_two_percent_regression_blocks_with_its_arithmetic(store, tmp_path):
    _baseline(store, [BASE] * 5)
    run_id = _candidate(store, [make_measurement(peak=int(BASE * 1.02))], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking, v.provisional) == ("regression", True, False)
    assert v.baseline_value == BASE and v.why.spread == 0 and v.why.floor == 512
    assert v.threshold == BASE + 512
    assert v.delta == int(BASE * 1.02) - BASE and round(v.delta_pct, 2) == 2.0
    for part in (
        "baseline 100.00 MiB",
        "median of 5 runs",
        "x factor 3",
        "floor 512 B",
        "threshold",
        "candidate 102.00 MiB",
        "+2.00%",
        "regression",
    ):
        assert part in message(v)
    assert result.exit_code == 1


@pytest.mark.parametrize("delta, kind", [(512, "ok"), (513, "regression"), (-513, "improvement")])
def test_the_allocator_floor_is_the_smallest_change_that_counts(store, tmp_path, delta, kind):
    _baseline(store, [BASE] * 4)
    run_id = _candidate(store, [make_measurement(peak=BASE + delta)], 10)
    assert _verdict(check(store, _config(tmp_path), run_id=run_id)).kind == kind


def test_observed_noise_widens_the_headroom(store, tmp_path):
    host = 400 * MiB
    noisy = [host, host + MiB, host - MiB, host + 3 * MiB, host]
    for i, v in enumerate(noisy):
        _record(store, [make_measurement(host=v)], i)
    ok = _candidate(store, [make_measurement(host=host + 3 * MiB)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=ok), "host")
    assert v.kind == "ok" and v.why.floor == FLOORS["host"]
    # sigma from the differences 1, -2, 4, -3 MiB (the smallest four fifths: 1, 2, 3 MiB),
    # widened as a prediction from 5 runs is: t(0.99, 4) / z(0.99)
    assert v.why.noise == pytest.approx(2 * MiB / noise.TRIMMED_MEAN, rel=1e-3)
    assert v.why.spread == pytest.approx(2 * MiB / noise.TRIMMED_MEAN * 1.6107, rel=1e-3)
    assert v.room == pytest.approx(3 * v.why.spread)
    assert "x 1.61 for 5 runs" in message(v)
    bad = _candidate(store, [make_measurement(host=host + 20 * MiB)], 11)
    assert _verdict(check(store, _config(tmp_path), run_id=bad), "host").kind == "regression"


def test_a_merged_regression_is_the_new_level_not_noise(store, tmp_path):
    _baseline(store, [BASE] * 5)
    merged = _record(store, [make_measurement(peak=BASE + MiB)], 6, subject="grow the cache")
    (level_commit,) = store.conn.execute(
        "select git_commit from runs where run_id = ?", [merged]
    ).fetchone()
    again = _candidate(store, [make_measurement(peak=BASE + 2 * MiB)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=again))
    assert (v.kind, v.blocking) == ("regression", True)
    assert v.baseline_value == BASE + MiB and v.delta == MiB  # against the new level
    assert v.threshold == BASE + MiB + 512  # the spread never spans the step
    assert (v.baseline_runs, v.why.level_since) == (1, level_commit)
    assert f"median of 1 run at the level since {level_commit[:12]}, 6 in the window" in message(v)
    same = _candidate(store, [make_measurement(peak=BASE + MiB)], 11)
    assert _verdict(check(store, _config(tmp_path), run_id=same)).kind == "ok"


def test_one_noisy_run_is_not_a_level_of_its_own():
    host = 400 * MiB
    noisy = [host, host + 2 * MiB, host - MiB, host + MiB, host, host + 3 * MiB]
    level = noise.levels(noisy, 3.0, FLOORS["host"])
    assert (level.start, level.starts) == (0, ())
    stepped = noise.levels(noisy + [host + 40 * MiB] * 2, 3.0, FLOORS["host"])
    assert (stepped.start, stepped.current) == (6, (host + 40 * MiB,) * 2)


# decoder_serve[concurrency=4]'s allocated peak and each iteration's, in real reruns of one
# commit: how the four sessions interleave sets the peak, in steps of 124 KiB.
SERVE_RERUNS = [
    (10957824, (10957824, 10195968, 9815040)),
    (11086784, (11086784, 9053184, 10449920)),
    (10576896, (9942016, 10449920, 10576896)),
    (10957824, (10957824, 10449920, 10957824)),
    (10957824, (10957824, 9688064, 10576896)),
    (10576896, (10449920, 10576896, 10576896)),
    (10449920, (9815040, 10449920, 8926208)),
    (10957824, (10957824, 10322944, 10957824)),
]


def test_a_figure_that_takes_a_few_values_never_blocks_on_a_value_it_already_produced(
    store, tmp_path
):
    # Three reruns at one value, then two at another: the peaks alone read as two flat
    # levels, and the newest one's zero spread would block the first value again; the
    # runs' own iterations say the figure moves.
    for minute, i in enumerate((0, 3, 4, 2, 5)):
        peak, samples = SERVE_RERUNS[i]
        _record(store, [make_measurement(peak=peak, samples=samples)], minute)
    peak, samples = SERVE_RERUNS[7]
    run_id = _candidate(store, [make_measurement(peak=peak, samples=samples)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=run_id))
    assert not v.blocking and v.kind == "noisy", message(v)
    assert v.baseline_runs == 5  # one level
    assert v.threshold > max(p for p, _ in SERVE_RERUNS)


def test_a_discrete_figure_has_noise_and_is_not_split_where_it_repeats_itself():
    a, b, c = 10957824, 10576896, 11086784
    values = [float(x) for x in (a, a, a, b, b, a, a, c, a, b, a, a)]
    assert noise.sigma(noise.differences(values)) > 0  # most differences are 0, yet it moves
    # its runs' own iterations say it moves: no step between runs
    within = noise.within_runs([samples for _, samples in SERVE_RERUNS])
    assert within > 0
    assert noise.levels(values, 3.0, FLOORS["allocated"], within=within).starts == ()
    # levels that repeat values of their neighbour are one level
    repeating = [float(x) for x in (a, a, b, a, b, b, b, a, b)]
    sigma = noise.sigma(noise.differences(repeating))
    assert noise.split(repeating, 3 * sigma * noise.small_sample(9), sigma) == []
    # without noise, one run away and back is a change and its revert: two steps
    assert noise.split([a, a, a, c, a], 512, 0) == [3, 4]
    assert noise.split([a] * 4 + [c] * 4, 512, 0) == [4]
    # and the level after the revert is the level before it: one level, five runs
    back = noise.levels([a, a, a, c, a], 3.0, 512)
    assert (back.starts, back.current) == ((3, 4), (a, a, a, a))


def test_no_shipped_case_blocks_against_baselines_drawn_from_its_own_real_reruns(tmp_path):
    """Real reruns of every shipped case on one commit (tests/data/reruns.json.gz), each
    judged against 60 baselines of 1 to 20 of the others in random order: unchanged code
    never blocks, however few runs its baseline has and however its figure moves."""
    import random

    from memtrack.config import load_config
    from memtrack.judge.evidence import Point
    from memtrack.judge.memory import Candidate, verdict
    from memtrack.records import metrics
    from memtrack.workload.registry import discover

    cases: dict[str, list] = {}
    for r in read_reruns(RERUNS):
        for m in r.measurements:
            cases.setdefault(m.case_id, []).append(m)
    shipped = {c.case_id for w in discover(load_config(None, cwd=tmp_path)) for c in w.cases()}
    assert set(cases) == shipped  # every shipped case, none other
    assert min(len(ms) for ms in cases.values()) >= 20
    config, rng, blocked = _config(tmp_path), random.Random(7), []
    for case_id, ms in cases.items():
        for h in range(60):
            n = min(1 + h % 20, len(ms) - 1)
            *base, m = rng.sample(ms, n + 1)
            points = [
                Point(
                    f"r{i}",
                    f"c{i}",
                    f"t{i:02d}",
                    None,
                    b.status,
                    {k: x for k in metrics.NAMES if (x := metrics.value(b, k)) is not None},
                    b.iteration_times_s,
                    {},
                    b.allocated_samples,
                )
                for i, b in enumerate(base)
            ][::-1]
            c = Candidate(m, points)
            for metric in metrics.NAMES:
                v = verdict(c, metric, config)
                if v is not None and v.blocking:
                    blocked.append(f"{case_id} {metric} ({n} runs): {message(v)}")
    assert blocked == []


def test_one_run_apart_in_a_noisy_series_is_not_a_level_yet_two_are():
    host = 400 * MiB
    noisy = [host + d * MiB for d in (0, 1, -1, 2, 0, 1, -1, 0)]
    alone = noise.levels(noisy + [host - 9 * MiB], 3.0, FLOORS["host"])
    assert alone.starts == ()  # one run away: an outlier until a second one says otherwise
    assert 9 * MiB < 2 * alone.room
    two = noise.levels(noisy + [host - 9 * MiB, host - 9 * MiB], 3.0, FLOORS["host"])
    assert (two.start, two.current) == (len(noisy), (host - 9 * MiB,) * 2)


def test_a_noisy_figure_is_provisional_below_the_minimum_then_judged_by_its_noise(store, tmp_path):
    for i, v in enumerate((12.0, 12.5)):  # two runs of a noisy figure
        _record(store, [make_measurement(host_step=int(v * MiB))], i)
    run_id = _candidate(store, [make_measurement(host_step=17 * MiB)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=run_id), "host_step")
    assert (v.kind, v.provisional, v.blocking) == ("regression", True, False)  # +38 %, 4.75 MiB
    assert "past a 10% jump and past 6.00 MiB" in message(v)
    big = _candidate(store, [make_measurement(host_step=19 * MiB)], 11)
    v = _verdict(check(store, _config(tmp_path), run_id=big), "host_step")
    assert (v.kind, v.blocking) == ("regression", True)
    # from min_baseline_runs on, the noise the runs show, widened for how few they are
    for i, v in enumerate((11.8, 12.2)):
        _record(store, [make_measurement(host_step=int(v * MiB))], i + 2)
    again = _candidate(store, [make_measurement(host_step=17 * MiB)], 12)
    v = _verdict(check(store, _config(tmp_path), run_id=again), "host_step")
    assert (v.kind, v.provisional, v.blocking) == ("regression", False, True), message(v)
    assert v.room == pytest.approx(3 * v.why.noise * noise.small_sample(4))
    within = _candidate(store, [make_measurement(host_step=int(14.5 * MiB))], 13)
    v = _verdict(check(store, _config(tmp_path), run_id=within), "host_step")
    assert (v.kind, v.blocking) == ("noisy", False), message(v)  # 3.34 MiB: 28 % of 12 MiB


def test_a_headroom_too_wide_to_judge_says_noisy_and_how_to_sharpen_it(store, tmp_path):
    wild = [BASE, BASE + 4 * MiB, BASE - 3 * MiB, BASE + 2 * MiB, BASE - 2 * MiB]
    for i, v in enumerate(wild):
        _record(store, [make_measurement(peak=v)], i)
    run_id = _candidate(store, [make_measurement(peak=BASE + MiB)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=run_id))
    assert (v.kind, v.blocking) == ("noisy", False)
    assert "wider than 5%" in message(v) and "more baseline runs (now 5 of 20)" in message(v)
    assert "requested" not in message(v)  # the CPU never records it: not suggested
    over = _candidate(store, [make_measurement(peak=BASE + MiB)], 11)
    budget = Budget("decoder", BASE, "must fit", metric="allocated")
    v = _verdict(check(store, _config(tmp_path, budgets=(budget,)), run_id=over))
    assert (v.kind, v.blocking) == ("over_budget", True)  # noise never hides a budget
    loose = _config(tmp_path, noisy_above=0.5)
    assert _verdict(check(store, loose, run_id=run_id)).kind == "ok"


def test_a_regression_names_the_component_that_grew(store, tmp_path):
    for i in range(4):
        _record(store, [make_measurement(peak=BASE, caches_bytes=10 * MiB)], i)
    grown = make_measurement(peak=BASE + 8 * MiB, caches_bytes=18 * MiB)
    v = _verdict(check(store, _config(tmp_path), run_id=_candidate(store, [grown], 10)))
    assert (v.kind, v.why.component, v.why.component_delta) == ("regression", "caches", 8 * MiB)
    assert "caches grew +8.00 MiB" in message(v)


def test_a_base_branch_run_is_judged_against_its_previous_level_never_blocking(store, tmp_path):
    _baseline(store, [BASE] * 4)
    pushed = _record(store, [make_measurement(peak=BASE + MiB)], 10)  # on main, a push
    result = check(store, _config(tmp_path), run_id=pushed)
    v = _verdict(result)
    assert (result.context, v.context, v.kind, v.blocking) == ("base", "base", "regression", False)
    assert result.exit_code == 0
    record(store, result)
    row = store.conn.execute(
        "select context, kind from verdicts where run_id = ? and metric = 'allocated'", [pushed]
    ).fetchone()
    assert tuple(row) == ("base", "regression")


def test_on_main_a_missing_quality_reference_is_a_warning_not_a_regression(store, tmp_path):
    from memtrack.report import check as report

    kw = dict(
        quality_status="none",
        quality_reference="decoder[batch=1]",
        quality_message="no reference output recorded yet: record one",
    )
    _baseline(store, [BASE] * 3)
    pushed = _record(store, [make_measurement(peak=BASE, **kw)], 10)  # on main, a push
    result = check(store, _config(tmp_path), run_id=pushed)
    v = _verdict(result, "quality")
    assert (result.context, v.kind, v.blocking) == ("base", "quality", False)
    assert report.label(v) == "warn quality"
    assert report.summary_line(result).startswith("base branch: no new regression (")


def test_a_fifty_case_comment_shows_its_one_block_and_counts_the_rest(store, tmp_path):
    from memtrack.report import check as report

    names = [(f"w{c // 5:02d}", {"batch": 2 ** (c % 5)}) for c in range(50)]
    for i in range(20):
        _record(
            store, [make_measurement(w, p, peak=(c + 1) * MiB) for c, (w, p) in enumerate(names)], i
        )
    grown = [
        make_measurement(w, p, peak=(c + 1) * MiB + (2 * MiB if c == 17 else 0))
        for c, (w, p) in enumerate(names)
    ]
    result = check(
        store,
        _config(tmp_path, dashboard_url="https://m.example"),
        run_id=_candidate(store, grown, 40),
    )
    md = report.markdown(result, dashboard_url="https://m.example")
    above = md.split("<details>", 1)[0]
    header, row = [line for line in above.splitlines() if line.startswith("| ")]
    assert header.startswith("| | case | metric | baseline | candidate | delta | threshold |")
    assert row.startswith("| 🔺 | [w03\\[batch=4\\]](https://m.example/?page=History&case=")
    assert f"Not listed: ✅ {len(result.verdicts) - 1} ok." in above
    assert len(md.encode()) < 3000 and "w00" not in md


def test_the_quality_title_says_what_its_rows_say():
    from memtrack.judge.decide import CheckResult
    from memtrack.judge.verdict import Quality, Verdict
    from memtrack.report import check as report

    def q(kind: str, status: str, blocking: bool) -> Verdict:
        why = Quality(status, "c[dtype=f32]", "dtype bf16 (reference f32)", None, "max_rel 0.2")
        return Verdict(
            case_id=f"c[dtype={status}]",
            workload="c",
            metric="quality",
            kind=kind,
            blocking=blocking,
            why=why,
        )

    def title(*vs: Verdict) -> str:
        return report.quality_title(
            CheckResult(
                run_id="r",
                commit=None,
                branch="pr",
                started_at="",
                fingerprint="f",
                base_branch="main",
                merge_base=None,
                baseline_mode="ancestry",
                verdicts=vs,
            )
        )

    broken = q("quality", "beyond", True)
    assert title(broken, broken) == "Quality after a precision change: 2 beyond tolerance"
    kept = q("ok", "ok", False)
    assert title(kept) == "Quality after a precision change: memory saved and quality kept"
    missing = q("quality", "none", False)
    assert title(broken, missing, kept) == (
        "Quality after a precision change: 1 beyond tolerance, 1 without a reference yet, 1 kept"
    )


def test_an_estimate_of_another_commit_names_that_commit():
    from memtrack.judge.evidence import Estimate
    from memtrack.report.words import estimate

    mine = Estimate("c", 5 * MiB, "e1", "a" * 40, measured_bytes=5 * MiB, candidate_commit="a" * 40)
    assert estimate(mine).startswith(
        "estimate 5.00 MiB (tensors only: excludes kernel scratch) (measured 5.00 MiB"
    )
    calibrated = replace(mine, estimate_bytes=6 * MiB, scratch_bytes=MiB, scratch_run_id="f" * 32)
    assert estimate(calibrated).startswith(
        f"estimate 6.00 MiB (5.00 MiB of tensors + 1.00 MiB kernel scratch from run {'f' * 12})"
    )
    # calibrated from the very run checked: it matches that run by construction, said so
    here = replace(calibrated, candidate_run_id="f" * 32)
    assert f"kernel scratch from run {'f' * 12}, this run) (measured" in estimate(here)
    older = Estimate(
        "c", 5 * MiB, "e1", "b" * 40, measured_bytes=5 * MiB, candidate_commit="a" * 40
    )
    assert estimate(older).startswith(f"estimate of commit {'b' * 12} (not the one checked)")


def test_a_budget_that_names_no_workload_is_refused_with_the_nearest_names(store, tmp_path):
    run_id = _candidate(store, [make_measurement(workload="decoder_generate")], 1)
    typo = Budget("decoder_genrate", 64 * MiB, "fits", metric="allocated")
    with pytest.raises(
        ConfigError,
        match=r"budgets\[0\]\.workload: 'decoder_genrate' names no "
        r"known workload or case; nearest: decoder_generate",
    ):
        check(store, _config(tmp_path, budgets=(typo,)), run_id=run_id)


def test_baseline_is_the_last_n_runs(store, tmp_path):
    _baseline(store, [2 * BASE] * 3 + [BASE] * 3)  # older runs at another level
    run_id = _candidate(store, [make_measurement(peak=BASE)], 10)
    v = _verdict(check(store, _config(tmp_path, baseline_runs=3), run_id=run_id))
    assert (v.kind, v.baseline_runs, v.baseline_value) == ("ok", 3, BASE)


def test_below_the_minimum_of_baseline_runs_only_a_jump_past_the_provisional_rule_blocks(
    store, tmp_path
):
    _baseline(store, [BASE] * 2)
    for minute, grown in ((10, 1.02), (11, 1.09)):
        run_id = _candidate(store, [make_measurement(peak=int(BASE * grown))], minute)
        v = _verdict(check(store, _config(tmp_path), run_id=run_id))
        assert (v.kind, v.provisional, v.blocking) == ("regression", True, False)
        assert "provisional: blocks only past a 10% jump and past 1.50 KiB" in message(v)
    big = _candidate(store, [make_measurement(peak=int(BASE * 1.3))], 12)
    v = _verdict(check(store, _config(tmp_path), run_id=big))
    assert (v.kind, v.provisional, v.blocking) == ("regression", True, True)
    budget = Budget("decoder", BASE, "must fit", metric="allocated")
    v = _verdict(check(store, _config(tmp_path, budgets=(budget,)), run_id=run_id))
    assert (v.kind, v.blocking) == ("over_budget", True)  # a budget always blocks


def test_improvement_suggests_a_tighter_budget(store, tmp_path):
    _baseline(store, [BASE] * 4)
    run_id = _candidate(store, [make_measurement(peak=60 * MiB)], 10)
    budget = Budget("decoder", 128 * MiB, "fits", metric="allocated")
    v = _verdict(check(store, _config(tmp_path, budgets=(budget,)), run_id=run_id))
    assert v.kind == "improvement" and not v.blocking
    assert 60 * MiB < v.why.suggested_budget < 128 * MiB
    assert v.why.suggested_budget == suggest(60 * MiB, 512, None) == 66 * MiB
    assert "a budget of 66.00 MiB would hold it" in message(v)


def test_budget_breach_blocks_without_a_baseline(store, tmp_path):
    run_id = _candidate(store, [make_measurement(peak=70 * MiB)], 1)
    budget = Budget("decoder", 64 * MiB, "two sessions on a 24 GiB card", metric="allocated")
    result = check(store, _config(tmp_path, budgets=(budget,)), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking, v.budget_bytes) == ("over_budget", True, 64 * MiB)
    assert "two sessions on a 24 GiB card" in message(v) and "OVER by 6.00 MiB" in message(v)
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
    assert "torch: 2.13.0+cpu -> 2.14.0+cpu" in details(v)
    assert "not compared" in message(v)
    assert result.exit_code == 0


@pytest.mark.parametrize("baseline_status, blocking", [("ok", True), ("oom", False)])
def test_a_failed_candidate_blocks_unless_the_baseline_failed_too(
    store, tmp_path, baseline_status, blocking
):
    for i in range(3):
        _record(store, [make_measurement(status=baseline_status)], i)
    oom = make_measurement(status="oom", message="CUDA out of memory")
    run_id = _candidate(store, [oom], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    (v,) = result.verdicts
    assert (v.metric, v.kind, v.blocking) == ("status", "failed", blocking)
    assert "oom (CUDA out of memory)" in message(v)


def test_a_case_fixed_after_runs_that_all_failed_is_new_and_held_to_its_budget(store, tmp_path):
    for i in range(2):
        _record(store, [make_measurement(status="error", message="RuntimeError: boom")], i)
    run_id = _candidate(store, [make_measurement(peak=2 * BASE)], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking) == ("new", False)
    assert "no ok run on main: its 2 runs there failed (error)" in message(v)
    assert {x.metric for x in result.verdicts} >= {"allocated", "host"}
    budget = Budget("decoder", BASE, "one card", metric="allocated")
    result = check(store, _config(tmp_path, budgets=(budget,)), run_id=run_id)
    assert (_verdict(result).kind, result.exit_code) == ("over_budget", 1)


def test_time_is_judged_by_runs_not_pooled_iterations(store, tmp_path):
    for i in range(5):
        times = tuple(0.010 + 0.0002 * ((i + k) % 4) for k in range(3))
        _record(store, [make_measurement(times=times)], i)
    same = _candidate(store, [make_measurement(times=(0.0101, 0.0102, 0.0100))], 9)
    t = _verdict(check(store, _config(tmp_path), run_id=same), "time")
    assert (t.kind, t.baseline_runs) == ("ok", 5)
    # slower than every baseline run, but within the 5 % effect floor: not a finding
    near = _candidate(store, [make_measurement(times=(0.0105,) * 50)], 10)
    assert _verdict(check(store, _config(tmp_path), run_id=near), "time").kind == "ok"
    slow = _candidate(store, [make_measurement(times=(0.020, 0.021, 0.022))], 11)
    t = _verdict(check(store, _config(tmp_path), run_id=slow), "time")
    # beyond all 5 runs is rank p = 1/6: no evidence at the threshold of 0.05
    assert (t.kind, t.p_value) == ("ok", pytest.approx(1 / 6))
    assert "slower than all 5 baseline runs, but rank p = 0.17 is above 0.05" in message(t)
    for i in range(5, 19):
        times = tuple(0.010 + 0.0002 * ((i + k) % 4) for k in range(3))
        _record(store, [make_measurement(times=times)], i + 20)
    slow = _candidate(store, [make_measurement(times=(0.020, 0.021, 0.022))], 50)
    t = _verdict(check(store, _config(tmp_path), run_id=slow), "time")
    assert (t.kind, t.blocking) == ("time_regression", False)
    assert t.p_value == pytest.approx(1 / 20)  # beyond all 19: rank p = 0.05
    assert "slower than all 19 baseline runs" in message(t)
    t = _verdict(check(store, _config(tmp_path, time_regression="block"), run_id=slow), "time")
    assert t.blocking
    result = check(store, _config(tmp_path, time_regression="off"), run_id=slow)
    assert "time" not in {v.metric for v in result.verdicts}


def test_peak_plus_headroom_must_fit_each_device(store, tmp_path):
    vram = GPU_ENV.gpus[0].total_bytes
    for i in range(3):
        _record(
            store,
            [make_measurement(device="cuda", reserved=BASE, device_peak=vram - MiB)],
            i,
            env=GPU_ENV,
        )
    run_id = _candidate(
        store,
        [make_measurement(device="cuda", reserved=BASE, device_peak=vram - MiB)],
        10,
        env=GPU_ENV,
    )
    v = _verdict(check(store, _config(tmp_path), run_id=run_id), "device")
    assert (v.kind, v.blocking) == ("over_budget", True)  # 1 MiB left < the 2 MiB floor
    assert v.budget.reason == "VRAM of device 0 (NVIDIA H200)" and v.budget.vram
    assert any("does NOT fit" in d for d in details(v))


def test_verdicts_are_recorded_once_per_run(store, tmp_path):
    _baseline(store, [BASE] * 3)
    run_id = _candidate(store, [make_measurement(peak=BASE + MiB)], 10)
    result = check(store, _config(tmp_path), run_id=run_id)
    assert record(store, result) == len(result.verdicts)
    record(store, result)  # again: replaces, never duplicates
    rows = [
        dict(r)
        for r in store.conn.execute("select * from verdicts where run_id = ? order by id", [run_id])
    ]
    assert len(rows) == len(result.verdicts)
    row = next(r for r in rows if r["metric"] == "allocated")
    assert (row["kind"], row["blocking"], row["baseline_runs"]) == ("regression", 1, 3)
    assert row["threshold"] == BASE + 512 and row["delta"] == MiB
    assert row["message"].startswith("allocated: baseline")
    cols = [r[1] for r in store.conn.execute("pragma table_info(verdicts)")]
    assert cols == ["id", *VERDICT_COLUMNS]
    # every column the verdict's flat record's of its name, but the check's own
    from memtrack.report.check import flat

    own = [c for c in VERDICT_COLUMNS if c not in flat(result.verdicts[0])]
    assert own == ["run_id", "checked_at"]


def test_judge_and_report_import_no_heavy_modules():
    import subprocess

    code = (
        "import sys, memtrack.judge.check, memtrack.judge.history, memtrack.report.check, "
        "memtrack.commands.check;"
        "print(sorted(m for m in ('torch', 'scipy', 'sqlite_utils', 'pandas', 'numpy')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the histories real teams make, on records (tests/test_gate_histories.py runs them for real)


def test_a_revert_is_two_steps_and_a_re_land_blocks_at_the_floor(store, tmp_path):
    _baseline(store, [BASE] * 4 + [BASE + 8 * MiB, BASE])  # merged, then reverted
    run_id = _candidate(store, [make_measurement(peak=BASE + 8 * MiB)], 10)
    v = _verdict(check(store, _config(tmp_path), run_id=run_id))
    assert (v.kind, v.blocking, v.threshold) == ("regression", True, BASE + 512), message(v)
    # the revert returns to the level before the merge: its runs are one level again
    assert v.baseline_runs == 5 and "at the level since" in message(v)


def test_the_noise_of_a_case_is_known_across_an_environment_change(store, tmp_path):
    for i in range(4):
        _record(store, [make_measurement(peak=BASE)], i)
    upgraded = replace(CPU_ENV, fingerprint="cpu-env-2", torch="2.14.0+cpu")
    _record(store, [make_measurement(peak=BASE + MiB)], 5, env=upgraded)  # the upgrade's step
    run_id = _candidate(store, [make_measurement(peak=int((BASE + MiB) * 1.01))], 10, env=upgraded)
    v = _verdict(check(store, _config(tmp_path), run_id=run_id))
    assert (v.kind, v.blocking, v.provisional) == ("regression", True, False), message(v)
    assert v.baseline_value == BASE + MiB  # the level is the new environment's own
    assert "4 of them on other environments" in message(v)


def test_a_leak_blocks_unless_the_baseline_leaked_as_much(store, tmp_path):
    clean = dict(retained_samples=(0, 0, 0))
    leaking = dict(samples=(BASE, BASE + 6400, BASE + 12800), retained_samples=(6400,) * 3)
    _baseline(store, [BASE] * 3, **clean)
    result = check(
        store,
        _config(tmp_path),
        run_id=_candidate(store, [make_measurement(peak=BASE + 12800, **leaking)], 10),
    )
    v = _verdict(result, "retained")
    assert (v.kind, v.blocking, v.candidate_value) == ("leak", True, 6400)
    assert "+6,400 B per iteration" in message(v) and "6.10 MiB after 1,000 calls" in message(v)
    assert _verdict(result, "allocated").why.noise == 0  # the leak is not noise
    _record(store, [make_measurement(peak=BASE + 12800, **leaking)], 11)  # main leaks too
    again = check(
        store,
        _config(tmp_path),
        run_id=_candidate(store, [make_measurement(peak=BASE + 12800, **leaking)], 12),
    )
    v = _verdict(again, "retained")
    assert (v.kind, v.blocking) == ("leak", False) and "a known leak" in message(v)


def test_a_concurrent_peak_is_judged_against_the_sum_of_its_sessions(store, tmp_path):
    sessions = {"concurrency": 4}
    level, one = 2 * MiB, 3 * MiB  # the shared level, and what one session adds to it

    def serve(peak: int, per: int = one) -> Measurement:
        return make_measurement(
            "serve",
            sessions,
            peak=peak,
            samples=(peak, peak - 256 * 1024, peak - 512 * 1024),
            session_peak_bytes=level + per,
            sessions_sum_bytes=level + 4 * per,
        )

    for i, peak in enumerate((9 * MiB, 10 * MiB, 8 * MiB, 11 * MiB)):  # interleaving moves it
        _record(store, [serve(peak)], i)
    run_id = _candidate(store, [serve(14 * MiB)], 10)  # below the sum of sessions: 14 MiB
    result = check(store, _config(tmp_path), run_id=run_id)
    v = _verdict(result)
    assert (v.kind, v.blocking, v.threshold) == ("ok", False, 14 * MiB + 512), message(v)
    assert "bounded by the sum of 4 sessions 14.00 MiB" in message(v)
    assert _verdict(result, "sessions").kind == "ok"
    grown = _candidate(store, [serve(11 * MiB, per=one + one // 10)], 11)
    v = _verdict(check(store, _config(tmp_path), run_id=grown), "sessions")
    assert (v.kind, v.blocking, v.threshold) == ("regression", True, 14 * MiB + 512), message(v)


def _timed(cpu: float, *, runnable: float = 0.0, wall: float | None = None) -> Measurement:
    return make_measurement(
        times=(wall or cpu,) * 3,
        iteration_cpu_times_s=(cpu,) * 3,
        timing_runnable=runnable,
        timing_cores=2,
        timing_cpu_pressure=min(1.0, runnable / 4),  # tasks wait where others run
    )


def test_time_is_judged_on_cpu_time_and_not_on_an_oversubscribed_machine(store, tmp_path):
    for i in range(19):  # wall time all over the place, CPU time steady
        _record(store, [_timed(0.010 + 0.0001 * (i % 5), wall=0.010 * (1 + i % 5))], i)
    _record(store, [_timed(0.030, runnable=6.0)], 25)  # timed beside six busy loops
    cosmetic = _candidate(store, [_timed(0.0101, wall=0.080)], 30)
    t = _verdict(check(store, _config(tmp_path), run_id=cosmetic), "time")
    assert (t.kind, t.baseline_runs) == ("ok", 19), message(t)  # the busy run left out
    assert message(t).startswith("time (CPU time):") and "1 run timed on a contended" in message(t)
    slower = _candidate(store, [_timed(0.020)], 31)
    t = _verdict(check(store, _config(tmp_path), run_id=slower), "time")
    assert (t.kind, t.blocking) == ("time_regression", False), message(t)
    busy = _candidate(store, [_timed(0.020, runnable=4.0)], 32)
    t = _verdict(check(store, _config(tmp_path), run_id=busy), "time")
    assert (t.kind, t.blocking) == ("abstained", False)
    assert "not judged: the machine was contended" in message(t)
    assert "4.0 runnable tasks of other processes" in message(t)


def test_work_added_to_the_data_loader_workers_is_judged_on_the_tree_cpu_time(store, tmp_path):
    """The case's own CPU time did not move; its workers' did: the process tree's CPU time
    is the figure judged, where the baseline runs hold it too."""

    def fed(own: float, workers: float) -> Measurement:
        # the case waits for its workers: the tree keeps about one core busy
        timed = _timed(own, wall=own + workers)
        return replace(timed, iteration_tree_cpu_times_s=(own + workers,) * 3)

    for i in range(19):
        _record(store, [fed(0.010 + 0.0001 * (i % 5), 0.020)], i)
    slower = _candidate(store, [fed(0.010, 0.060)], 30)
    t = _verdict(check(store, _config(tmp_path), run_id=slower), "time")
    assert (t.kind, t.blocking) == ("time_regression", False), message(t)
    assert message(t).startswith("time (tree CPU time):"), message(t)
    same = _candidate(store, [fed(0.010, 0.020)], 31)
    t = _verdict(check(store, _config(tmp_path), run_id=same), "time")
    assert t.kind == "ok" and message(t).startswith("time (tree CPU time):"), message(t)


def test_sixteen_real_reruns_of_a_concurrent_case_raise_nothing(store, tmp_path):
    """decoder_serve (4 sessions), recorded 16 times alone on one commit, each run checked as
    a pull request against the ones before it: its peak moves with how the sessions
    interleave, and nothing blocks, warns or is waved through as noisy."""
    runs = [r for r in read_reruns() if {m.workload for m in r.measurements} == {"decoder_serve"}]
    assert len(runs) == 16
    peaks = {r.measurements[0].peak_allocated_bytes for r in runs}
    assert len(peaks) > 1  # the interleaving moves it
    for i, r in enumerate(runs):
        if i >= 3:
            cand = _candidate(store, r.measurements, 30 + i)
            result = check(store, _config(tmp_path), run_id=cand)
            assert not result.blocking, [message(v) for v in result.blocking]
            for metric in ("allocated", "sessions"):
                assert _verdict(result, metric).kind == "ok", message(_verdict(result, metric))
        _record(store, r.measurements, i)


def test_a_growth_names_what_changed_around_the_code_since_the_baseline(store, tmp_path):
    # numpy is not in the fingerprint: the baseline stands, and the verdict says what moved
    old = replace(CPU_ENV, packages={**CPU_ENV.packages, "numpy": "1.26.4"}, python="3.11.7")
    new = replace(CPU_ENV, packages={**CPU_ENV.packages, "numpy": "2.1.0"}, python="3.11.9")
    assert old.fingerprint == new.fingerprint
    for i in range(5):
        _record(store, [make_measurement(peak=BASE)], i, env=old)
    grown = _candidate(store, [make_measurement(peak=BASE + 8 * MiB)], 10, env=new)
    v = _verdict(check(store, _config(tmp_path), run_id=grown))
    assert v.kind == "regression" and v.blocking
    said = "Python: 3.11.7 -> 3.11.9; numpy: 1.26.4 -> 2.1.0 between baseline and candidate"
    assert said in message(v) and said in details(v)
    # unchanged figures say nothing of it on their lines; the run's note names the bump
    same = _candidate(store, [make_measurement(peak=BASE)], 11, env=new)
    result = check(store, _config(tmp_path), run_id=same)
    assert "between baseline and candidate" not in message(_verdict(result))
    assert any(n.startswith(said) for n in result.notes), result.notes


def test_a_package_installed_or_removed_is_named_where_both_sides_list_every_package():
    from memtrack.records import environment_diff

    every = {"click": "8.1.7", "torch": "2.13.0+cpu", "flash_attn": "2.8.3"}
    old = replace(CPU_ENV, packages=every)
    new = replace(CPU_ENV, packages={**every, "peft": "0.21.2", "flash-attn": "2.8.3"})
    assert environment_diff(old, new) == ["peft: - -> 0.21.2"]  # flash_attn is flash-attn
    # an older record lists the memory-relevant packages alone: no install is read into it
    older = replace(CPU_ENV, packages={"torch": "2.13.0+cpu", "flash-attn": "2.8.2"})
    assert environment_diff(older, new) == ["flash-attn: 2.8.2 -> 2.8.3"]


PAIR_REF = "a" * 40


def _paired(here: list[float], there: list[float], **kw) -> Measurement:
    return make_measurement(
        pair_ref=PAIR_REF,
        pair_figure="CPU time",
        pair_times_s=tuple(here),
        pair_ref_times_s=tuple(there),
        **kw,
    )


def test_a_paired_timing_is_judged_round_by_round_without_any_history(store, tmp_path):
    config = _config(tmp_path)
    there = [0.010, 0.012, 0.009, 0.011, 0.010]
    slow = _candidate(store, [_paired([2 * t for t in there], there)], 1)
    t = _verdict(check(store, config, run_id=slow), "time")
    assert (t.kind, t.blocking, t.baseline_runs) == ("time_regression", False, 5), message(t)
    assert t.p_value == pytest.approx(1 / 32)  # 5 of 5 rounds slower
    assert f"paired with {PAIR_REF[:12]} over 5 rounds" in message(t)
    assert "ratio median 2.000" in message(t) and "slower in 5 of 5 rounds" in message(t)
    t = _verdict(check(store, _config(tmp_path, time_regression="block"), run_id=slow), "time")
    assert t.blocking
    # four rounds, every one slower, cannot reach p <= 0.05 (1/16): not a finding
    four = _candidate(store, [_paired([2 * t for t in there[:4]], there[:4])], 2)
    t = _verdict(check(store, config, run_id=four), "time")
    assert t.kind == "ok" and "sign test p = 0.062 above 0.05: not a finding" in message(t)
    # a machine whose load swings by 2x between rounds: the spread of the ratios is the bar
    swings = [1.0, 1.9, 0.6, 1.4, 1.1]
    noisy = _candidate(
        store, [_paired([t * s for t, s in zip(there, swings, strict=True)], there)], 3
    )
    t = _verdict(check(store, config, run_id=noisy), "time")
    assert t.kind == "ok" and "within the threshold" in message(t), message(t)
    # the pair's load does not matter: both sides had it
    busy = _candidate(store, [_paired(there, there, timing_runnable=9.0, timing_cores=2)], 4)
    assert _verdict(check(store, config, run_id=busy), "time").kind == "ok"


@pytest.mark.parametrize("factor", [1.0, 3.0])
@pytest.mark.parametrize("rounds", [5, 6, 10, 20])
def test_a_pair_stopped_once_it_cannot_warn_is_judged_as_all_its_rounds_would_be(
    tmp_path, rounds, factor
):
    """A paired timing stops after `futile_after` rounds not slower (worker.turns): the
    verdict on the rounds it ran is ok wherever it stopped, and so it is on all its rounds
    were every other one slower; one round fewer not slower would have left it able to
    warn. With a headroom factor of 2 or more, one round not slower is enough: its ratio
    spreads the rounds as far as the median is from 1."""
    from memtrack.judge.memory import Candidate
    from memtrack.judge.timing import futile_after, paired

    config = _config(tmp_path, pair_rounds=rounds, headroom_factor=factor)
    stop = futile_after(rounds, factor)

    def kind(slower: int, not_slower: int) -> str:
        here = [0.02] * slower + [0.01] * not_slower  # 2x slower, or as fast
        v = paired(Candidate(_paired(here, [0.01] * len(here)), []), config)
        assert v is not None
        return v.kind

    assert all(kind(ran - stop, stop) == "ok" for ran in range(stop, rounds + 1))
    assert kind(rounds - stop + 1, stop - 1) == "time_regression"
    assert stop == (1 if factor >= 2 else {5: 1, 6: 1, 10: 2, 20: 6}[rounds])


def test_a_pair_of_unequal_sides_from_elsewhere_is_refused_and_nothing_written(store):
    with pytest.raises(StoreError, match="pair_times_s: 5 rounds against 4 of pair_ref"):
        _candidate(store, [_paired([0.02] * 5, [0.01] * 4)], 10)
    assert store.run_ids(limit=10) == []


def test_no_time_warning_from_fewer_runs_than_the_gates_minimum(store, tmp_path):
    for i in range(2):
        _record(store, [make_measurement(times=(0.010,) * 3)], i)
    slow = _candidate(store, [make_measurement(times=(0.030,) * 3)], 10)
    t = _verdict(check(store, _config(tmp_path), run_id=slow), "time")
    assert (t.kind, t.provisional) == ("ok", True)
    assert "2 baseline runs of the 3 the gate needs: not judged" in message(t)
