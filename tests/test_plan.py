"""The plan's arithmetic on hand-computed cases: the fit, what fits each GPU, the levers."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import GPU_ENV, GiB, MiB, make_measurement, make_run

from memtrack.config import load_config
from memtrack.errors import ConfigError
from memtrack.plan.fit import (
    Gpu,
    Headroom,
    fit,
    fits_on,
    load_catalog,
    need,
    parse_sweep,
    plan,
    select_gpus,
)
from memtrack.plan.sweep import PACKAGED_CATALOG, make_plan
from memtrack.store.database import Store

GB = 10**9
T4, L4 = Gpu("NVIDIA T4", 16 * GB, "16 GB"), Gpu("NVIDIA L4", 24 * GB, "24 GB")
A100_40, H100 = Gpu("NVIDIA A100 40GB", 40 * GB, "40 GB"), Gpu("NVIDIA H100", 80 * GB, "80 GB")
H200 = Gpu("NVIDIA H200", 141 * GB, "141 GB")
CATALOG = (T4, L4, A100_40, H100, H200)
TEN = Headroom(0.10, "config", "plan_headroom = 10%")
NONE = Headroom(0.0, "config", "plan_headroom = 0%")


def _plan(points, headroom=TEN, params=None, param="concurrency", integer=True, gpus=None):
    return plan(
        points,
        CATALOG,
        headroom,
        case="serve",
        param=param,
        metric="allocated",
        metric_note="",
        integer=integer,
        params=params or {},
        gpus=gpus,
    )


def test_a_linear_sweep_gives_the_largest_count_each_gpu_holds():
    # peak = 6 GB + 4 GB x: exactly linear, so the quadratic term is 0 and not kept.
    points = [(1, 10 * GB), (2, 14 * GB), (4, 22 * GB), (8, 38 * GB)]
    p = _plan(points)
    assert p.fit.model == "constant + linear" and "not positive" in p.fit.rule
    assert (p.fit.a, p.fit.b, p.fit.c) == (6e9, 4e9, 0.0)
    rows = {r.gpu.name: r for r in p.gpus}
    # 1.1 x (6 + 4x) <= 16 -> x <= 2.14: 2 (15.4 GB) fits, 3 (19.8 GB) does not
    assert (rows["NVIDIA T4"].largest, rows["NVIDIA T4"].first_over) == (2, 3)
    # <= 24 -> x <= 3.95: 3 (19.8 GB) fits, 4 (24.2 GB) does not; of the measured, 2
    assert (rows["NVIDIA L4"].largest, rows["NVIDIA L4"].first_over) == (3, 4)
    assert rows["NVIDIA L4"].measured_largest == 2 and not rows["NVIDIA L4"].extrapolated
    # <= 80 -> x <= 16.68: 16 (77 GB) fits, 17 (81.4 GB) does not, beyond the 8 measured
    assert (rows["NVIDIA H100"].largest, rows["NVIDIA H100"].first_over) == (16, 17)
    assert rows["NVIDIA H100"].extrapolated and rows["NVIDIA H100"].measured_largest == 8
    assert all(not r.levers for r in p.gpus)


def test_quadratic_growth_is_fitted_and_changes_the_answer():
    # peak = 2 GB + 1 GB x + 0.5 GB x^2 (attention without a fused kernel), no headroom
    points = [(1, 3_500_000_000), (2, 6 * GB), (4, 14 * GB), (8, 42 * GB)]
    p = _plan(points, headroom=NONE, param="max_len")
    assert p.fit.model == "constant + linear + quadratic"
    assert (p.fit.a, p.fit.b, p.fit.c) == (2e9, 1e9, 0.5e9)
    assert p.fit.residual_quadratic == 0 and p.fit.residual_linear > 0
    rows = {r.gpu.name: r for r in p.gpus}
    # 2 + x + x^2/2 <= 80: 11 -> 73.5 GB fits, 12 -> 86 GB does not (a line says 14)
    assert (rows["NVIDIA H100"].largest, rows["NVIDIA H100"].first_over) == (11, 12)
    # <= 141: 15 -> 129.5 GB fits, 16 -> 146 GB does not
    assert (rows["NVIDIA H200"].largest, rows["NVIDIA H200"].first_over) == (15, 16)


def test_the_quadratic_needs_four_values_and_a_real_gain():
    exact_curve = [(1, 3_500_000_000), (2, 6 * GB), (4, 14 * GB)]
    f = fit(exact_curve)
    assert f.model == "constant + linear" and "3 distinct values" in f.rule
    # Nearly linear with noise: a quadratic leaves more than a quarter of the residuals.
    noisy = [(1, 100), (2, 201), (3, 299), (4, 401), (5, 500)]
    f = fit(noisy)
    assert f.model == "constant + linear" and f.residual_quadratic is not None
    with pytest.raises(ConfigError, match="2 or more values"):
        fit([(4, 100), (4, 120)])


def test_where_nothing_fits_the_levers_are_named():
    # peak = 10 GB + 20 GB x; with 10 % headroom, one session needs 33 GB.
    points = [(1, 30 * GB), (2, 50 * GB), (4, 90 * GB)]
    params = {"concurrency": 1, "max_len": 8192, "dtype": "float32"}
    p = _plan(points, params=params, gpus=(L4, H100))
    l4, h100 = p.gpus
    assert (l4.largest, l4.first_over, l4.unbounded) == (None, 1, False)
    levers = " | ".join(l4.levers)
    assert "less concurrency" not in levers  # concurrency is what was swept, already at 1
    assert "a shorter maximum input (max_len=8192 now)" in levers
    assert "lower precision (dtype=float32 now" in levers
    # 1.1 x (10 + 20) = 33 <= 40: the A100 40GB is the smallest that holds one session
    assert (
        "another GPU: NVIDIA A100 40GB (40 GB) is the smallest in the catalog that fits "
        "it (up to concurrency=1)"
    ) in levers
    # 33 GB over 24 GB devices: 2 at least, and only for what shards
    assert "2 or more x NVIDIA L4 with a parallel strategy" in levers
    assert "devices do not pool" in levers
    # 1.1 x (10 + 20x) <= 80 -> x <= 3.14
    assert (h100.largest, h100.first_over, h100.levers) == (3, 4, ())


def test_a_fit_answers_only_as_far_as_its_measurements_carry():
    """Two measured values fix a line whatever the growth: no answer past the largest of
    them. Three or more carry the fit to 4x the largest, no further. Within that, an answer
    past the measurements says how far past; beyond, the GPU's row says what was measured
    and how to learn more, never a figure (what `memtrack plan` prints and the dashboard's
    Plan shows: both read this)."""
    from memtrack.plan.fit import CARRY_RULE, answer, describe
    from memtrack.report.plan import markdown

    # peak = 6 GB + 4 GB x; with 10 % headroom a device holds x <= (memory / 1.1 - 6) / 4
    two = _plan([(1, 10 * GB), (4, 22 * GB)])
    assert two.carried_to == 4
    rows = {r.gpu.name: r for r in two.gpus}
    assert (rows["NVIDIA T4"].largest, answer(rows["NVIDIA T4"])) == (2, "2")  # x <= 2.14
    assert (rows["NVIDIA L4"].largest, answer(rows["NVIDIA L4"])) == (3, "3")  # x <= 3.95
    for name in ("NVIDIA A100 40GB", "NVIDIA H100", "NVIDIA H200"):  # 7, 16 and 30 by the line
        row = rows[name]
        assert row.refused and (row.largest, row.first_over, row.carried_to) == (None, None, 4)
        assert answer(row) == "> 4: not carried"
        assert describe(row, "sessions") == (
            "sessions up to 4 at least, and no answer past it: the fit cannot carry this: "
            "measured up to sessions=4; measure at larger values with `memtrack plan`"
        )
    three = _plan([(1, 10 * GB), (2, 14 * GB), (4, 22 * GB)])
    assert three.carried_to == 16
    rows = {r.gpu.name: r for r in three.gpus}
    assert answer(rows["NVIDIA L4"]) == "3"
    a100 = rows["NVIDIA A100 40GB"]  # x <= 7.59
    assert (a100.largest, a100.first_over, a100.past) == (7, 8, 1.75)
    assert answer(a100) == "7 (1.8x past the largest measured value)"
    assert describe(a100, "concurrency") == (
        "concurrency up to 7; 8 does not fit (1.8x past the largest measured value)"
    )
    assert answer(rows["NVIDIA H100"]) == "16 (4x past the largest measured value)"  # x <= 16.68
    h200 = rows["NVIDIA H200"]  # 30 by the line, past 4 x 4
    assert (h200.largest, h200.carried_to, answer(h200)) == (None, 16, "> 16: not carried")
    note = next(n for n in three.notes if "not given" in n)
    assert note == (
        "1 answer(s) not given, past concurrency=16: the fit cannot carry this: measured up "
        f"to concurrency=4; measure at larger values with `memtrack plan` ({CARRY_RULE})"
    )
    shown = markdown(three)
    assert "| NVIDIA H200 | 141 GB | &gt; 16: not carried |" in shown
    assert "answers: up to concurrency=16" in shown
    # A case that needs more than a GPU has at the lowest value is still told what would fit.
    big = _plan([(1, 30 * GB), (4, 90 * GB)], gpus=(L4,))
    assert big.gpus[0].levers and big.gpus[0].largest is None and not big.gpus[0].refused


def test_a_flat_peak_fits_as_far_as_measured_and_a_float_param_gets_its_boundary():
    p = _plan([(1, 5 * GB), (2, 5 * GB)], gpus=(T4,))
    row = p.gpus[0]  # "any value" would be an answer past every measurement
    assert row.unbounded and row.refused and row.largest is None and row.carried_to == 2
    f = fit([(0.5, 1 * GB), (1.0, 2 * GB)])  # 2 GB per unit, nothing constant
    row = fits_on(f, T4, NONE, lowest=0.5, integer=False)
    assert row.largest == pytest.approx(8.0) and row.first_over is None


def test_sweep_syntax_and_types():
    declared = {"concurrency": (4,), "max_len": (256,), "scale": (0.5,), "dtype": ("float32",)}
    assert parse_sweep("concurrency=8,1,2", declared, "serve") == ("concurrency", (1, 2, 8))
    assert parse_sweep("scale = 0.5, 1.5", declared, "serve") == ("scale", (0.5, 1.5))
    for text, message in [
        ("concurrency", "expected PARAM=V1,V2"),
        ("batch=1,2", "serve has no param 'batch' (has: concurrency, max_len, scale, dtype)"),
        ("dtype=1,2", "param 'dtype' is not numeric"),
        ("max_len=128,1.5", "value '1.5' of 'max_len' is not a whole number"),
        ("max_len=128,x", "value 'x' of 'max_len' is not a whole number"),
        ("max_len=128,128", "value '128' is listed twice"),
        ("max_len=128", "a fit needs 2 or more values"),
        ("scale=-1,2", "must be a finite number, 0 or more"),
    ]:
        with pytest.raises(ConfigError, match=f"--sweep .*{_re(message)}"):
            parse_sweep(text, declared, "serve")


def _re(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    "body, message",
    [
        ("gpu = [", "not valid TOML"),
        ("gpus = []", "unknown key 'gpus'"),
        ('[[gpu]]\nname = "X"\n', "gpu[0].memory: is required"),
        ('[[gpu]]\nname = "X"\nmemory = "80 GX"\n', "gpu[0].memory: '80 GX' is not a size"),
        ('[[gpu]]\nname = "X"\nmemory = "8 GB"\nsize = 1\n', "gpu[0]: unknown key 'size'"),
        (
            '[[gpu]]\nname = "X"\nmemory = "8 GB"\n[[gpu]]\nname = "x"\nmemory = "9 GB"\n',
            "gpu[1].name: 'x' is listed twice",
        ),
        ('[[gpu]]\nname = ""\nmemory = "8 GB"\n', "gpu[0].name: expected the GPU's name"),
        ('[[gpu]]\nname = "X"\nmemory = 0\n', "gpu[0].memory: must be more than 0"),
    ],
)
def test_a_bad_catalog_is_one_line_naming_file_key_and_value(tmp_path, body, message):
    path = tmp_path / "gpus.toml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=_re(f"{path}: ") + ".*" + _re(message)):
        load_catalog(path)
    with pytest.raises(ConfigError, match="no such GPU catalog"):
        load_catalog(tmp_path / "missing.toml")


def test_the_shipped_catalog_is_in_the_package_and_the_repository_alike():
    repo_copy = Path(__file__).parent.parent / "data" / "gpus.toml"
    assert PACKAGED_CATALOG.read_bytes() == repo_copy.read_bytes()
    gpus, note = load_catalog(PACKAGED_CATALOG)
    stated = {g.name: g.stated for g in gpus}
    assert stated == {
        "NVIDIA T4": "16 GB",
        "NVIDIA L4": "24 GB",
        "NVIDIA A10": "24 GB",
        "NVIDIA GeForce RTX 4090": "24 GB",
        "NVIDIA A100 40GB": "40 GB",
        "NVIDIA L40S": "48 GB",
        "NVIDIA A100 80GB": "80 GB",
        "NVIDIA H100 80GB": "80 GB",
        "NVIDIA H200": "141 GB",
    }
    assert {g.name: g.memory_bytes for g in gpus}["NVIDIA H200"] == 141 * GB
    assert note and "nominal" in note.lower() and "memtrack doctor" in note
    assert [g.name for g in select_gpus(gpus, ["a100"], PACKAGED_CATALOG)] == [
        "NVIDIA A100 40GB",
        "NVIDIA A100 80GB",
    ]
    with pytest.raises(ConfigError, match="--gpu 'B200': no such GPU in"):
        select_gpus(gpus, ["B200"], PACKAGED_CATALOG)


def test_the_judges_headroom_is_used_where_the_case_has_a_baseline(tmp_path):
    """Baseline runs of the swept cases on main: the headroom is the gate's arithmetic."""
    config = load_config(cwd=tmp_path)
    db = tmp_path / "m.db"
    levels = {1: (100, 101, 100), 2: (150, 150, 150)}  # MiB, oldest first
    with Store.open(db) as store:
        for i in range(3):
            store.write_run(
                make_run(
                    [
                        make_measurement("serve", {"concurrency": c}, peak=levels[c][i] * MiB)
                        for c in (1, 2)
                    ],
                    started_at=f"2026-01-0{i + 1}T00:00:00+00:00",
                )
            )
        candidate = make_run(
            [
                make_measurement("serve", {"concurrency": c}, peak=p * MiB)
                for c, p in ((1, 100), (2, 150))
            ],
            started_at="2026-01-05T00:00:00+00:00",
        )
        p = make_plan(
            candidate,
            config,
            store,
            case="serve",
            param="concurrency",
            params={"concurrency": 1},
            integer=True,
            catalog=CATALOG,
            gpus=(T4,),
        )
    # concurrency=1: a deterministic figure (two of three runs repeat one value) that went to
    # 101 MiB and back: a change and its revert, the level 100 MiB with no noise, so the
    # 512 B floor; concurrency=2: the floor too, of 150 MiB: a smaller share.
    expected = 512 / (100 * MiB)
    assert p.headroom.source == "judge"
    assert p.headroom.fraction == pytest.approx(expected)
    assert "serve[concurrency=1]" in p.headroom.detail and "2 run(s) on main" in p.headroom.detail
    assert p.metric == "allocated" and "measured on the CPU" in p.metric_note
    # Without a database (or a baseline): the configured share.
    p = make_plan(
        candidate,
        config,
        None,
        case="serve",
        param="concurrency",
        params={"concurrency": 1},
        integer=True,
        catalog=CATALOG,
        gpus=(T4,),
    )
    assert p.headroom.source == "config" and p.headroom.fraction == 0.10
    assert "plan_headroom (the default) = 10% (no database" in p.headroom.detail


def test_the_plans_headroom_names_the_config_file_only_where_it_sets_it(tmp_path: Path):
    run = make_run(
        [
            make_measurement("serve", {"concurrency": c}, peak=p * MiB)
            for c, p in ((1, 100), (2, 150))
        ]
    )
    cfg = tmp_path / "memtrack.toml"
    cfg.write_text('base_branch = "main"\n')
    p = make_plan(
        run,
        load_config(cfg),
        None,
        case="serve",
        param="concurrency",
        params={"concurrency": 1},
        integer=True,
        catalog=CATALOG,
        gpus=(T4,),
    )
    assert "plan_headroom (the default, not set in memtrack.toml) = 10%" in p.headroom.detail
    cfg.write_text('plan_headroom = "20%"\n')
    p = make_plan(
        run,
        load_config(cfg),
        None,
        case="serve",
        param="concurrency",
        params={"concurrency": 1},
        integer=True,
        catalog=CATALOG,
        gpus=(T4,),
    )
    assert f"{cfg.resolve()}: plan_headroom = 20%" in p.headroom.detail


def test_a_sweep_on_a_gpu_fits_the_device_view_and_adds_the_runners_own_memory():
    """Measured on the runner's H200 (torch's total: 141 GiB): the device view must fit."""
    run = make_run(
        [
            make_measurement(
                "serve",
                {"concurrency": c},
                device="cuda",
                peak=p * GiB,
                reserved=p * GiB,
                device_peak=p * GiB,
            )
            for c, p in ((1, 10), (2, 14), (8, 38))
        ],
        env=GPU_ENV,
    )
    p = make_plan(
        run,
        load_config(cwd=Path("/")),
        None,
        case="serve",
        param="concurrency",
        params={"concurrency": 1},
        integer=True,
        catalog=CATALOG,
        gpus=(H100,),
    )
    assert p.metric == "device" and "NVML" in p.metric_note
    runner, h100 = p.gpus
    assert runner.gpu.name == "NVIDIA H200 (this runner)" and runner.gpu.memory_bytes == 141 * GiB
    # peak = 6 GiB + 4 GiB x in the device view (the per-process peak)
    # 1.1 x (6 + 4x) GiB <= 141 GiB -> x <= 30.55: 30
    assert (runner.largest, runner.first_over) == (30, 31)
    # 1.1 x (6 + 4x) GiB <= 80e9 B (74.51 GiB) -> x <= 15.43: 15
    assert (h100.largest, h100.first_over) == (15, 16)


def test_a_plan_starts_from_a_workload_whose_other_params_are_pinned_in_brackets():
    from memtrack.plan.sweep import find_case
    from memtrack.workload.registry import Workload

    unet = Workload(
        "unet_denoise",
        lambda ctx: None,
        {"batch": (1, 2), "dtype": ("float32", "bfloat16"), "steps": (4,)},
    )
    wl, params = find_case([unet], "unet_denoise[dtype=float32]", "batch")
    assert wl is unet and params == {"batch": 1, "dtype": "float32", "steps": 4}
    with pytest.raises(ConfigError, match=r"unet_denoise: has several cases \(dtype vary\)"):
        find_case([unet], "unet_denoise", "batch")  # which dtype? the pins say
    # a grid that varies another param than the swept one, pinned: the sweep goes ahead
    wl, params = find_case([unet], "unet_denoise[dtype=bfloat16,steps=4]", "batch")
    assert params["dtype"] == "bfloat16"
    with pytest.raises(
        ConfigError,
        match=r"dtype=fp8 is not one of the declared values "
        r"\(float32, bfloat16\)",
    ):
        find_case([unet], "unet_denoise[dtype=fp8]", "batch")
    with pytest.raises(ConfigError, match=r"unet_denoise has no param 'size'"):
        find_case([unet], "unet_denoise[size=3]", "batch")


def test_an_extrapolations_need_includes_the_fits_own_error():
    import math
    import statistics

    from memtrack.plan.fit import FIT_ERROR_FACTOR

    # Four batches on the CPU, near-linear with a few KiB of scatter (the allocator's
    # choices): the headroom alone would be the 0.01 % of a deterministic baseline.
    points = [(1, 10_000_000), (2, 10_990_000), (4, 13_030_000), (8, 16_980_000)]
    f = fit(points)
    xs = [x for x, _ in points]
    res = [y - float(f.peak(x)) for x, y in points]
    s = math.sqrt(sum(r * r for r in res) / (len(points) - 2))
    assert f.residual_se == pytest.approx(s)
    mean = statistics.fmean(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    for x in (8, 600 * 8):  # at the points, and 600 times past them
        expected = FIT_ERROR_FACTOR * s * math.sqrt(1 + 1 / len(xs) + (x - mean) ** 2 / sxx)
        assert float(f.error(x)) == pytest.approx(expected, rel=1e-9)
    tiny = Headroom(0.0001, "judge", "the 512 B floor")
    p = plan(
        points,
        [Gpu("G", 80 * GB, "80 GB")],
        tiny,
        case="c",
        param="batch",
        metric="allocated",
        metric_note="",
        integer=True,
        params={},
    )
    assert p.gpus[0].refused  # thousands of batches: far past what 4 values up to 8 carry
    row = fits_on(f, Gpu("G", 80 * GB, "80 GB"), tiny, lowest=1, integer=True)
    # the largest batch whose peak, headroom and error fit: fewer than without the error
    assert need(f, row.largest, tiny) <= 80 * GB < need(f, row.first_over, tiny)
    without = math.floor((80 * GB / 1.0001 - f.a) / f.b)
    assert row.largest < without
    assert any(
        n.startswith(f"each need includes the fit's own error: {FIT_ERROR_FACTOR} x")
        for n in p.notes
    )
    # two values: a line through both, whose error cannot be estimated, and says so
    two = plan(
        points[:2],
        [Gpu("G", 80 * GB, "80 GB")],
        tiny,
        case="c",
        param="batch",
        metric="allocated",
        metric_note="",
        integer=True,
        params={},
    )
    assert two.fit.residual_se is None
    assert any("its own error cannot be estimated" in n for n in two.notes)
