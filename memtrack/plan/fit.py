"""Will it fit? How a case's peak grows with one param, and the largest value each GPU holds.

Pure arithmetic on (swept value, peak bytes) points: no torch, no database. Where the points
come from (a measured sweep, or an estimate) is the caller's business.

    model     constant + linear:            peak(x) = a + b x
              constant + linear + quadratic: peak(x) = a + b x + c x^2
              least squares, in exact rational arithmetic; the quadratic only with at least
              4 distinct values, c > 0 (growth faster than linear, as attention without a
              fused kernel) and a residual sum of squares at most a quarter of the linear
              fit's (QUADRATIC_GAIN)
    error(x)  = FIT_ERROR_FACTOR x s x sqrt(1 + v(x)' (X'X)^-1 v(x)): the fit's own error at
              x, from its residual standard error s = sqrt(SSR / (n - terms)) and the
              leverage of x (v(x) = (1, x[, x^2])), which grows with the distance from the
              values measured: an extrapolation is as uncertain as the fit says
    need(x)   = peak(x) x (1 + headroom fraction) + error(x)
    fits      need(x) <= the GPU's memory (nominal, per device: devices do not pool)
    largest   the largest x >= the lowest value (1 for a count) that fits; x + 1 does not
    carried   a fit answers only as far as the measurements carry it (carried_to): with 3
              or more distinct values measured, up to CARRY_FACTOR (4) x the largest of
              them; with 2, no further than the largest (two points fix a line whatever the
              growth, and nothing checks it). An answer past that is refused, never given:
              the GPU holds at least that value, and a sweep at larger values says more.
              An answer past the largest measured value says how far past it (2x)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from memtrack.config import read_toml
from memtrack.errors import ConfigError
from memtrack.units import format_size, parse_size

QUADRATIC_MIN_POINTS = 4
"""Distinct swept values before a quadratic term is considered: with 3, it fits any curve."""
QUADRATIC_GAIN = Fraction(1, 4)
"""The quadratic is kept only where its residuals are at most this share of the linear's."""
FIT_ERROR_FACTOR = 3
"""Standard errors of the fit kept free, as the gate keeps 3 x the observed spread."""
CARRY_FACTOR = 4
"""A fit of CARRY_MIN_VALUES or more distinct values answers up to this multiple of the
largest value measured, and no further."""
CARRY_MIN_VALUES = 3
"""Distinct values measured before a fit answers past the largest of them."""
CARRY_RULE = (
    f"a fit answers up to {CARRY_FACTOR}x the largest value measured where "
    f"{CARRY_MIN_VALUES} or more values were measured and, from 2 values, no further than "
    "the largest"
)
"""The rule, in words (the module's docstring has its arithmetic)."""
NOMINAL_NOTE = (
    "GPU memory is the vendor's nominal figure per device (a round figure); what a process "
    "can use is less than the device's total (the CUDA context, the driver's reservations, "
    "ECC): `memtrack doctor` shows each GPU's real memory on the runner"
)
NOT_POOLED = (
    "devices do not pool: N GPUs give N x memory only to what is sharded across "
    "them; weights that are not sharded are whole on every device"
)

Number = int | float


# -- fitting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """How the peak grows in the swept value x: peak(x) = a + b x + c x^2."""

    model: str
    """'constant + linear' or 'constant + linear + quadratic'."""
    a: float
    """Constant (bytes): what does not grow with x (the weights, the runtime)."""
    b: float
    """Linear term (bytes per unit of x)."""
    c: float
    """Quadratic term (bytes per unit of x squared); 0 for the linear model."""
    rule: str
    """Why this model: the rule that chose it, with the residuals it compared."""
    residual_linear: float
    """Sum of squared residuals of the linear fit (bytes squared)."""
    residual_quadratic: float | None
    """Of the quadratic fit, where one was tried."""
    exact: tuple[Fraction, Fraction, Fraction] = field(
        repr=False, compare=False, default=(Fraction(0),) * 3
    )
    """(a, b, c) as exact fractions, for the arithmetic of what fits."""
    residual_se: float | None = None
    """The residual standard error s (bytes); None where the fit has no point to spare
    (as many distinct values as terms), so that its error cannot be estimated."""
    inverse: tuple[tuple[Fraction, ...], ...] = field(repr=False, compare=False, default=())
    """(X'X)^-1 of the chosen model, for the leverage of a value."""

    def peak(self, x: Number) -> Fraction:
        a, b, c = self.exact
        fx = Fraction(x)
        return a + b * fx + c * fx * fx

    def error(self, x: Number) -> Fraction:
        """The fit's own error at x (see the module's arithmetic); 0 where not estimable."""
        if not self.residual_se or not self.inverse:
            return Fraction(0)
        v = [Fraction(x) ** p for p in range(len(self.inverse))]
        leverage = sum(
            (v[i] * self.inverse[i][j] * v[j] for i in range(len(v)) for j in range(len(v))),
            Fraction(0),
        )
        return Fraction(FIT_ERROR_FACTOR * self.residual_se * math.sqrt(1 + float(leverage)))

    def formula(self) -> str:
        terms = [format_size(round(self.a)), f"{format_size(round(self.b))} x"]
        if self.c:
            terms.append(f"{format_size(round(self.c))} x^2")
        return " + ".join(terms).replace("+ -", "- ")


def _solve(matrix: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """Gauss-Jordan elimination on exact fractions; None where the system is singular."""
    n = len(rhs)
    m = [row[:] + [r] for row, r in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if m[r][col] != 0), None)
        if pivot is None:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * p for v, p in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _least_squares(
    xs: list[Fraction], ys: list[Fraction], degree: int
) -> tuple[list[Fraction], Fraction] | None:
    """Coefficients (constant first) of the least-squares polynomial, and its residual sum
    of squares; None where the values cannot determine it."""
    k = degree + 1
    powers = [[x**p for p in range(k)] for x in xs]
    normal = [
        [sum((row[i] * row[j] for row in powers), Fraction(0)) for j in range(k)] for i in range(k)
    ]
    rhs = [
        sum((row[i] * y for row, y in zip(powers, ys, strict=True)), Fraction(0)) for i in range(k)
    ]
    coef = _solve(normal, rhs)
    if coef is None:
        return None
    ssr = sum(
        (
            (y - sum((c * p for c, p in zip(coef, row, strict=True)), Fraction(0))) ** 2
            for row, y in zip(powers, ys, strict=True)
        ),
        Fraction(0),
    )
    return coef, ssr


def _inverse(xs: list[Fraction], terms: int) -> tuple[tuple[Fraction, ...], ...]:
    """(X'X)^-1 for the polynomial of `terms` terms over `xs`, exactly."""
    normal = [
        [sum((x ** (i + j) for x in xs), Fraction(0)) for j in range(terms)] for i in range(terms)
    ]
    cols = []
    for k in range(terms):
        col = _solve(normal, [Fraction(int(i == k)) for i in range(terms)])
        assert col is not None  # the fit was determined by the same matrix
        cols.append(col)
    return tuple(tuple(cols[j][i] for j in range(terms)) for i in range(terms))


def _with_error(f: Fit, xs: list[Fraction], ssr: Fraction, terms: int) -> Fit:
    spare = len(xs) - terms
    se = math.sqrt(float(ssr) / spare) if spare > 0 else None
    return dataclasses.replace(f, residual_se=se, inverse=_inverse(xs, terms))


def fit(points: Sequence[tuple[Number, int]]) -> Fit:
    """The model of how the peak grows, from (swept value, peak bytes) points (at least two
    distinct values; a value may repeat)."""
    xs = [Fraction(x) for x, _ in points]
    ys = [Fraction(int(y)) for _, y in points]
    distinct = len(set(xs))
    if distinct < 2:
        raise ConfigError(
            f"a fit needs measurements at 2 or more values of the swept param, got {distinct}"
        )
    linear = _least_squares(xs, ys, 1)
    assert linear is not None  # two distinct values determine a line
    (a, b), ssr_lin = linear
    quad = _least_squares(xs, ys, 2) if distinct >= QUADRATIC_MIN_POINTS else None
    if quad is None:
        why = (
            f"constant + linear: {distinct} distinct values (a quadratic term needs "
            f"{QUADRATIC_MIN_POINTS} or more)"
        )
        return _linear(a, b, why, xs, ssr_lin, None)
    (qa, qb, qc), ssr_quad = quad
    share = f"{float(ssr_quad / ssr_lin):.1%}" if ssr_lin else "n/a"
    if qc > 0 and ssr_quad <= QUADRATIC_GAIN * ssr_lin:
        why = (
            f"constant + linear + quadratic: x^2 term positive and residuals {share} of "
            f"the linear fit's (kept at {float(QUADRATIC_GAIN):.0%} or less)"
        )
        return _with_error(
            Fit(
                "constant + linear + quadratic",
                float(qa),
                float(qb),
                float(qc),
                why,
                float(ssr_lin),
                float(ssr_quad),
                (qa, qb, qc),
            ),
            xs,
            ssr_quad,
            3,
        )
    reason = (
        "the x^2 term is not positive"
        if qc <= 0
        else f"a quadratic leaves {share} of the linear fit's residuals "
        f"(kept only at {float(QUADRATIC_GAIN):.0%} or less)"
    )
    return _linear(a, b, f"constant + linear: {reason}", xs, ssr_lin, ssr_quad)


def _linear(
    a: Fraction,
    b: Fraction,
    why: str,
    xs: list[Fraction],
    ssr_lin: Fraction,
    ssr_quad: Fraction | None,
) -> Fit:
    """The constant + linear model, its residuals beside the quadratic's where one was fit."""
    fit = Fit(
        "constant + linear",
        float(a),
        float(b),
        0.0,
        why,
        float(ssr_lin),
        None if ssr_quad is None else float(ssr_quad),
        (a, b, Fraction(0)),
    )
    return _with_error(fit, xs, ssr_lin, 2)


# -- GPUs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One GPU model of the catalog."""

    name: str
    memory_bytes: int
    """Memory per device, in bytes, from the nominal figure as its vendor states it."""
    stated: str
    """The nominal figure as written in the catalog ('80 GB')."""


_CATALOG_KEYS = {"note", "gpu"}
_GPU_KEYS = {"name", "memory", "source"}


def load_catalog(path: Path) -> tuple[tuple[Gpu, ...], str | None]:
    """The GPUs of a catalog file, and its note; a bad file, key or value is one line."""
    if not path.exists():
        raise ConfigError(f"{path}: no such GPU catalog")
    data = read_toml(path)
    for key in data:
        if key not in _CATALOG_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} (a catalog has: note, [[gpu]])")
    note = data.get("note")
    if note is not None and not isinstance(note, str):
        raise ConfigError(f"{path}: note: expected text, got {note!r}")
    entries = data.get("gpu")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: gpu: expected one or more [[gpu]] tables")
    gpus: list[Gpu] = []
    for i, entry in enumerate(entries):
        where = f"{path}: gpu[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table")
        for key in entry:
            if key not in _GPU_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r} (known: name, memory, source)")
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}.name: expected the GPU's name, got {name!r}")
        if any(g.name.lower() == name.strip().lower() for g in gpus):
            raise ConfigError(f"{where}.name: {name!r} is listed twice")
        if "memory" not in entry:
            raise ConfigError(f'{where}.memory: is required (e.g. "80 GB")')
        memory = parse_size(entry["memory"], what=f"{where}.memory")
        if memory <= 0:
            raise ConfigError(f"{where}.memory: must be more than 0, got {entry['memory']!r}")
        stated = entry["memory"] if isinstance(entry["memory"], str) else f"{memory} B"
        gpus.append(Gpu(name.strip(), memory, stated))
    return tuple(gpus), note


def select_gpus(gpus: Sequence[Gpu], names: Iterable[str], path: Path) -> tuple[Gpu, ...]:
    """The catalog's GPUs whose name contains each of `names` (any case); all without."""
    names = list(names)
    if not names:
        return tuple(gpus)
    chosen: list[Gpu] = []
    for n in names:
        found = [g for g in gpus if n.lower() in g.name.lower()]
        if not found:
            raise ConfigError(
                f"--gpu {n!r}: no such GPU in {path} (has: {', '.join(g.name for g in gpus)})"
            )
        chosen += [g for g in found if g not in chosen]
    return tuple(chosen)


# -- what fits -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Headroom:
    """What is kept free above the predicted peak, as a fraction of it, and why."""

    fraction: float
    source: str
    """'judge' (the gate's headroom over this case's baseline) or 'config' (plan_headroom)."""
    detail: str
    """The arithmetic or the key it came from, in words."""


@dataclass(frozen=True)
class GpuFit:
    """What one GPU holds of the swept param."""

    gpu: Gpu
    largest: Number | None
    """The largest value that fits; None where nothing fits, or where the peak does not
    grow with the param (`unbounded`)."""
    first_over: Number | None
    """The first value that does not fit (a count: largest + 1)."""
    unbounded: bool
    """The fitted peak does not grow with the param: any value that fits at the lowest does."""
    extrapolated: bool
    """The answer lies beyond the largest value measured."""
    measured_largest: Number | None
    """The largest measured value whose measured peak (with the headroom) fits."""
    levers: tuple[str, ...] = ()
    """Where nothing fits: what would make it fit."""
    measured_top: Number | None = None
    """The largest value measured."""
    carried_to: Number | None = None
    """Where the answer lies past what the fit carries (see `carried_to`): the largest value
    it carries, which fits; `largest` and `first_over` are then None, never a guess."""

    @property
    def refused(self) -> bool:
        """The answer lies past what the fit carries, and is not given."""
        return self.carried_to is not None

    @property
    def past(self) -> float | None:
        """How many times the largest measured value the answer is, where it lies past it."""
        if self.largest is None or not self.measured_top or self.largest <= self.measured_top:
            return None
        return self.largest / self.measured_top


@dataclass(frozen=True)
class Plan:
    """A sweep's verdict for every GPU of the catalog (or the ones asked for)."""

    case: str
    param: str
    metric: str
    """The figure that must fit: device, reserved or allocated."""
    metric_note: str
    points: tuple[tuple[Number, int], ...]
    fit: Fit
    headroom: Headroom
    lowest: Number
    """The smallest value considered (1 for a count)."""
    gpus: tuple[GpuFit, ...]
    notes: tuple[str, ...] = ()
    carried_to: Number | None = None
    """The largest value the fit answers for (see `carried_to`)."""


def need(fit_: Fit, x: Number, headroom: Headroom) -> Fraction:
    """Predicted peak at x, plus the headroom and the fit's own error there: what a device
    must hold."""
    return fit_.peak(x) * (1 + Fraction(str(headroom.fraction))) + fit_.error(x)


def _largest_fitting(
    fit_: Fit, headroom: Headroom, cap: Fraction, lowest: Number, guide: float
) -> float:
    """The largest x in [lowest, guide] whose need fits (need(lowest) does; the guide, the
    root without the fit's error, is an upper bound), by bisection."""
    lo, hi = float(lowest), max(float(lowest), guide)
    if need(fit_, hi, headroom) <= cap:
        return hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if need(fit_, mid, headroom) <= cap:
            lo = mid
        else:
            hi = mid
    return lo


def _largest_root(fit_: Fit, budget: Fraction) -> float | None:
    """The largest real x where peak(x) = budget; None where there is none."""
    a, b, c = (float(v) for v in fit_.exact)
    rest = a - float(budget)
    if c == 0:
        return None if b == 0 else -rest / b
    disc = b * b - 4 * c * rest
    if disc < 0:
        return None
    return (-b + math.sqrt(disc)) / (2 * c)


def carried_to(points: Sequence[tuple[Number, int]]) -> Number:
    """The largest value of the swept param that a fit of these points answers for:
    CARRY_FACTOR x the largest value measured where CARRY_MIN_VALUES or more distinct values
    were measured, else the largest value measured."""
    xs = {x for x, _ in points}
    top = max(xs)
    return CARRY_FACTOR * top if len(xs) >= CARRY_MIN_VALUES else top


def fits_on(
    fit_: Fit,
    gpu: Gpu,
    headroom: Headroom,
    *,
    lowest: Number,
    integer: bool,
    measured: Sequence[tuple[Number, int]] = (),
    reach: Number | None = None,
) -> GpuFit:
    """The largest value of the param (at least `lowest`) whose predicted need fits; an
    answer past `reach` (what the fit carries) is refused, not given."""
    cap = Fraction(gpu.memory_bytes)
    factor = 1 + Fraction(str(headroom.fraction))
    ok_measured = [x for x, y in measured if y * factor <= cap]
    measured_largest = max(ok_measured) if ok_measured else None
    top = max((x for x, _ in measured), default=lowest)
    bottom = min((x for x, _ in measured), default=lowest)
    known = max((x for x, _ in measured), default=None)
    if need(fit_, lowest, headroom) > cap:
        return GpuFit(gpu, None, lowest, False, lowest < bottom, measured_largest, (), known)
    refused = GpuFit(gpu, None, None, False, True, measured_largest, (), known, reach)
    a, b, c = fit_.exact
    if c == 0 and b <= 0 or c < 0:
        # Does not grow (a negative x^2 term is never chosen, but the rule may change).
        if reach is not None:  # "any value" is an answer past every measurement
            return dataclasses.replace(refused, unbounded=True)
        return GpuFit(gpu, None, None, True, False, measured_largest, (), known)
    guide = _largest_root(fit_, cap / factor)
    assert guide is not None and guide >= lowest  # need(lowest) fits and peak grows
    root = _largest_fitting(fit_, headroom, cap, lowest, guide)
    if not integer:
        if reach is not None and root > reach:
            return refused
        return GpuFit(gpu, root, None, False, root > top, measured_largest, (), known)
    k = max(int(lowest), math.floor(root))
    # The float root is a guide; the exact arithmetic decides.
    while need(fit_, k + 1, headroom) <= cap:
        k += 1
    while k > lowest and need(fit_, k, headroom) > cap:
        k -= 1
    if reach is not None and k > reach:
        return refused
    return GpuFit(gpu, k, k + 1, False, k > top, measured_largest, (), known)


def levers(
    fit_: Fit,
    gpu: Gpu,
    catalog: Sequence[Gpu],
    headroom: Headroom,
    *,
    param: str,
    lowest: Number,
    integer: bool,
    params: dict[str, Any],
    reach: Number | None = None,
) -> tuple[str, ...]:
    """What would make the case fit where even the lowest value of the param does not."""
    out = []
    conc = params.get("concurrency")
    if param != "concurrency" and isinstance(conc, int) and conc > 1:
        out.append(f"less concurrency (concurrency={conc} now)")
    if param != "max_len" and "max_len" in params:
        out.append(f"a shorter maximum input (max_len={params['max_len']} now)")
    dtype = str(params.get("dtype", ""))
    if dtype in ("float32", "fp32", "float64"):
        out.append(
            f"lower precision (dtype={dtype} now: bfloat16 stores weights and caches "
            "in half the bytes or less)"
        )
    elif not dtype:
        out.append("lower precision (a dtype param for bfloat16 or 8-bit weights)")
    else:
        out.append(f"lower precision than dtype={dtype} (8-bit weights or caches)")
    bigger = [
        g
        for g in sorted(catalog, key=lambda g: g.memory_bytes)
        if g.memory_bytes > gpu.memory_bytes
    ]
    for g in bigger:
        holds = fits_on(fit_, g, headroom, lowest=lowest, integer=integer, reach=reach)
        if holds.largest is not None or holds.unbounded or holds.refused:
            if holds.refused:
                upto = f"up to {param}={show_value(holds.carried_to)} at least"
            elif holds.unbounded:
                upto = "any value"
            else:
                upto = f"up to {param}={show_value(holds.largest)}"
            out.append(
                f"another GPU: {g.name} ({g.stated}) is the smallest in the catalog "
                f"that fits it ({upto})"
            )
            break
    else:
        out.append("another GPU: none in the catalog holds it on one device")
    total = need(fit_, lowest, headroom)
    n = math.ceil(total / gpu.memory_bytes)
    out.append(
        f"{n} or more x {gpu.name} with a parallel strategy (tensor or pipeline "
        f"parallel), each device holding its shard: {format_size(math.ceil(total))} "
        f"at {param}={show_value(lowest)} split {n} ways if everything shards evenly; " + NOT_POOLED
    )
    return tuple(out)


def show_value(x: Number | None) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:.4g}"


def plan(
    points: Sequence[tuple[Number, int]],
    catalog: Sequence[Gpu],
    headroom: Headroom,
    *,
    case: str,
    param: str,
    metric: str,
    metric_note: str,
    integer: bool,
    params: dict[str, Any],
    gpus: Sequence[Gpu] | None = None,
    notes: Sequence[str] = (),
) -> Plan:
    """Fit the points and say, for each GPU (`gpus`, else the whole catalog), the largest
    value of `param` that fits and the first that does not; where nothing fits, the levers
    (another GPU is looked for in the whole catalog)."""
    f = fit(points)
    lowest: Number = 1 if integer and min(x for x, _ in points) >= 1 else min(x for x, _ in points)
    reach = carried_to(points)
    rows = []
    for g in gpus if gpus is not None else catalog:
        row = fits_on(f, g, headroom, lowest=lowest, integer=integer, measured=points, reach=reach)
        if row.largest is None and not row.unbounded and not row.refused:
            row = dataclasses.replace(
                row,
                levers=levers(
                    f,
                    g,
                    catalog,
                    headroom,
                    param=param,
                    lowest=lowest,
                    integer=integer,
                    params=params,
                    reach=reach,
                ),
            )
        rows.append(row)
    top = max(x for x, _ in points)
    extra = [fit_error_note(f, param, top, rows, reach)]
    refused = [r for r in rows if r.refused]
    if refused:
        extra.append(
            f"{len(refused)} answer(s) not given, past {param}={show_value(reach)}: "
            f"{refusal(param, top)} ({CARRY_RULE})"
        )
    return Plan(
        case,
        param,
        metric,
        metric_note,
        tuple(points),
        f,
        headroom,
        lowest,
        tuple(rows),
        (*notes, *extra, NOMINAL_NOTE),
        reach,
    )


def fit_error_note(
    f: Fit, param: str, top: Number, rows: Sequence[GpuFit], reach: Number | None = None
) -> str:
    """How much of each need is the fit's own error, in words: at the largest value
    measured, and at the farthest answer (or, where none lies past it, as far as the fit
    carries)."""
    if f.residual_se is None:
        return (
            "the fit passes through every point (as many values as its terms): its own "
            "error cannot be estimated and is not in the need; measure another value"
        )
    answers = [r.largest for r in rows if r.largest is not None]
    far = max(answers, default=top)
    if far <= top and reach is not None:
        far = reach
    at = [(top, f.error(top))] + ([(far, f.error(far))] if far > top else [])
    return (
        f"each need includes the fit's own error: {FIT_ERROR_FACTOR} x its residual "
        f"standard error ({format_size(round(f.residual_se))}), widened with the "
        "distance from the values measured: "
        + ", ".join(f"{format_size(math.ceil(e))} at {param}={show_value(x)}" for x, e in at)
    )


def refusal(param: str, top: Number | None) -> str:
    """What is said instead of an answer past what the fit carries."""
    return (
        f"the fit cannot carry this: measured up to {param}={show_value(top)}; measure at "
        "larger values with `memtrack plan`"
    )


def times(ratio: float) -> str:
    """2.0 -> '2x', 1.375 -> '1.4x'."""
    return f"{ratio:.1f}".removesuffix(".0") + "x"


def answer(row: GpuFit) -> str:
    """One GPU's largest value, as a table shows it: '16', '16 (2x past the largest
    measured value)', 'any', 'none', or where the fit does not carry it, '> 32: not
    carried'."""
    if row.refused:
        return f"> {show_value(row.carried_to)}: not carried"
    if row.unbounded:
        return "any"
    if row.largest is None:
        return "none"
    past = row.past
    return show_value(row.largest) + (
        f" ({times(past)} past the largest measured value)" if past is not None else ""
    )


def describe(row: GpuFit, param: str) -> str:
    """One GPU's answer in words."""
    if row.refused:
        grows = "the peak does not grow with it over the values measured; " * row.unbounded
        return (
            f"{param} up to {show_value(row.carried_to)} at least, and no answer past it: "
            f"{grows}{refusal(param, row.measured_top)}"
        )
    if row.unbounded:
        return f"any {param}: the peak does not grow with it"
    if row.largest is None:
        return f"nothing fits, not even {param}={show_value(row.first_over)}"
    text = f"{param} up to {show_value(row.largest)}"
    if row.first_over is not None:
        text += f"; {show_value(row.first_over)} does not fit"
    past = row.past
    if past is not None:
        text += f" ({times(past)} past the largest measured value)"
    elif row.extrapolated:
        text += " (extrapolated beyond the values measured)"
    return text


def parse_sweep(
    text: str, declared: dict[str, tuple[Any, ...]], workload: str
) -> tuple[str, tuple[Number, ...]]:
    """'concurrency=1,2,4,8' -> ('concurrency', (1, 2, 4, 8)). The param must be one of the
    workload's, numeric, and each value parse as its declared type (an int param takes
    whole numbers only)."""
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not name or not rest.strip():
        raise ConfigError(f"--sweep {text!r}: expected PARAM=V1,V2,... (e.g. concurrency=1,2,4)")
    if name not in declared:
        raise ConfigError(
            f"--sweep {text!r}: {workload} has no param {name!r} (has: {', '.join(declared)})"
        )
    kinds = {type(v) for v in declared[name]}
    if kinds & {bool, str} or not kinds <= {int, float}:
        raise ConfigError(
            f"--sweep {text!r}: param {name!r} is not numeric "
            f"(declared {', '.join(repr(v) for v in declared[name])}): a sweep "
            f"fits a curve over numbers"
        )
    integer = kinds == {int}
    values: list[Number] = []
    for item in rest.split(","):
        item = item.strip()
        try:
            value: Number = int(item) if integer else float(item)
        except ValueError:
            kind = "a whole number" if integer else "a number"
            raise ConfigError(
                f"--sweep {text!r}: value {item!r} of {name!r} is not {kind}"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"--sweep {text!r}: value {item!r} of {name!r} must be a finite number, 0 or more"
            )
        if value in values:
            raise ConfigError(f"--sweep {text!r}: value {item!r} is listed twice")
        values.append(value)
    if len(values) < 2:
        raise ConfigError(f"--sweep {text!r}: a fit needs 2 or more values")
    return name, tuple(sorted(values))


__all__ = [
    "CARRY_FACTOR",
    "CARRY_MIN_VALUES",
    "CARRY_RULE",
    "NOMINAL_NOTE",
    "NOT_POOLED",
    "QUADRATIC_GAIN",
    "QUADRATIC_MIN_POINTS",
    "Fit",
    "Gpu",
    "GpuFit",
    "Headroom",
    "Plan",
    "answer",
    "carried_to",
    "describe",
    "fit",
    "fits_on",
    "levers",
    "load_catalog",
    "need",
    "parse_sweep",
    "plan",
    "refusal",
    "select_gpus",
    "show_value",
    "times",
]
