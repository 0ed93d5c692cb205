"""History panels drawn on the server as SVG: one view of a case per panel, on its own
y-scale, with the budget, the headroom band, failures, verdicts and environment changes.

Vega-Lite in the browser cost a new visitor about 0.6 s of the History page (its library
loaded and compiled for every fresh browser); an SVG arrives drawn. It is shown through
Markdown as an HTML block (st.html drops SVG): one element per line, no blank line, every
text escaped, so Markdown and math never read inside it. Every mark carries a
<title> (the browser's tooltip) and data-* attributes with its exact figures; each panel
says its y-range in its aria-label, as a screen reader (or a test) reads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from memtrack.dashboard import model
from memtrack.dashboard.charts import (
    MARKER_COLORS,
    MARKER_NAMES,
    MORE_BRANCHES,
    OTHER_BRANCHES,
    VIEW_COLORS,
    unit_for,
)

from memtrack.escape import html_text
from memtrack.units import format_seconds, format_size

WIDTH = 1000
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 26
"""Margins of the plot area inside the panel's viewBox (it scales to the page's width)."""
_STEPS = (
    60,
    2 * 60,
    5 * 60,
    10 * 60,
    15 * 60,
    30 * 60,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    7 * 86400,
    14 * 86400,
    30 * 86400,
    91 * 86400,
    182 * 86400,
    365 * 86400,
)
"""Time-axis tick spacings, seconds: the smallest that gives at most 8 ticks is taken
(runs a few minutes apart get minutes: an hour's spacing left one label on the axis)."""


def _epoch(iso: str) -> float:
    t = datetime.fromisoformat(iso)
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _a(text: Any) -> str:
    """Text for an attribute or an element, escaped, on one line (a blank line would end
    the Markdown HTML block that carries the panel)."""
    return html_text(text)


def time_format(times: Sequence[str]) -> str:
    """Dates (and hours over short spans) that stay readable: a strftime format."""
    span = (_epoch(max(times)) - _epoch(min(times))) if times else 0.0
    return "%b %d %H:%M" if span < 3 * 86400 else "%b %d" if span < 300 * 86400 else "%Y-%m-%d"


class _Frame:
    """The panel's two scales: time on x (the page's whole range), a figure on y."""

    def __init__(self, times: Sequence[str], low: float, high: float, height: int):
        first, last = _epoch(min(times)), _epoch(max(times))
        pad = max((last - first) * 0.015, 300.0)  # the last mark stays whole
        self.t0, self.t1 = first - pad, last + pad
        self.height = height
        self.low, self.high, self.step = _nice(low, high)

    def x(self, iso: str) -> float:
        return LEFT + (_epoch(iso) - self.t0) / (self.t1 - self.t0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        bottom = self.height - BOTTOM
        return bottom - (value - self.low) / (self.high - self.low) * (bottom - TOP)

    def axes(self, fmt: str, title: str, unit_label: str) -> list[str]:
        out = []
        n = round((self.high - self.low) / self.step)
        for i in range(n + 1):
            v = self.low + i * self.step
            y = self.y(v)
            out.append(
                f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
                f'y2="{y:.1f}" stroke="#e6e6e6"/>'
                f'<text class="ytick" x="{LEFT - 6}" y="{y + 4:.1f}" '
                f'text-anchor="end">{_a(_tick(v))}</text>'
            )
        span = self.t1 - self.t0
        step = next((s for s in _STEPS if span / s <= 8), _STEPS[-1])
        t = math.ceil(self.t0 / step) * step
        while t <= self.t1:
            x = LEFT + (t - self.t0) / span * (WIDTH - LEFT - RIGHT)
            label = datetime.fromtimestamp(t, timezone.utc).strftime(fmt)
            # a label at an edge is drawn inside it, not cut in half
            anchor = "end" if x > WIDTH - RIGHT - 40 else "middle"
            out.append(
                f'<text class="xtick" x="{x:.1f}" y="{self.height - 6}" '
                f'text-anchor="{anchor}">{_a(label)}</text>'
            )
            t += step
        out.append(
            f'<text class="title" x="{LEFT - 56}" y="16" font-weight="bold" '
            f'fill="#333">{_a(title)} ({_a(unit_label)})</text>'
        )
        return out


def _nice(low: float, high: float) -> tuple[float, float, float]:
    """A y-range around [low, high] on round ticks (about 4 of them): not from 0."""
    if high <= low:
        pad = abs(high) * 0.05 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return math.floor(low / step) * step, math.ceil(high / step) * step, step


def _tick(v: float) -> str:
    return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


def _point(x: float, y: float, tip: str, cls: str, color: str, figure: float) -> str:
    return (
        f'<circle class="{cls}" cx="{x:.1f}" cy="{y:.1f}" r="3.2" fill="{color}" '
        f'data-bytes="{figure:.0f}"><title>{_a(tip)}</title></circle>'
    )


def _diamond(
    x: float,
    y: float,
    tip: str,
    figure: float,
    unit: str = "bytes",
    color: str = "#555",
    branch: str | None = None,
) -> str:
    """Another branch's run: an open diamond off the line, in its branch's colour; its
    figure in data-`unit`, its branch in data-branch."""
    d = 5.5
    data = f"{figure:.0f}" if unit == "bytes" else f"{figure:g}"
    named = f' data-branch="{_a(branch)}"' if branch is not None else ""
    return (
        f'<path class="point other" d="M{x:.1f},{y - d:.1f} L{x + d:.1f},{y:.1f} '
        f'L{x:.1f},{y + d:.1f} L{x - d:.1f},{y:.1f} Z" fill="none" stroke="{color}" '
        f'stroke-width="1.8" data-{unit}="{data}"{named}><title>{_a(tip)}</title></path>'
    )


LANE = 9.0
"""How far apart, in the panel's units, the runs of branches that share an x are drawn."""


def _lanes(at: Sequence[tuple[float, str]], order: Sequence[str]) -> list[float]:
    """How far right of its x each other branch's run is drawn: branches whose runs fall on
    one x (the same merge-base) side by side, a lane each in `order` (the legend's), all
    right of the base branch's point there; a branch's reruns share its lane."""
    rank = {b: i for i, b in enumerate(order)}
    near: dict[int, list[str]] = {}
    for x, branch in at:
        here = near.setdefault(round(x / 4), [])
        if branch not in here:
            here.append(branch)
    out = []
    for x, branch in at:
        here = sorted(near[round(x / 4)], key=lambda b: rank.get(b, len(rank)))
        out.append(LANE * (here.index(branch) + 1))
    return out


def _others(
    frame: _Frame,
    others: Sequence[tuple[str, float, str, float, str]],
    branches: dict[str, str],
    unit: str = "bytes",
) -> list[str]:
    """Other branches' runs, (x, y value, tip, figure, branch) each: a diamond in the
    branch's colour, in its lane beside the x where it was placed."""
    lanes = _lanes([(frame.x(x), b) for x, _, _, _, b in others], list(branches))
    return [
        _diamond(
            frame.x(x) + lane,
            frame.y(value),
            tip,
            figure,
            unit,
            branches.get(branch, MORE_BRANCHES),
            branch,
        )
        for (x, value, tip, figure, branch), lane in zip(others, lanes, strict=True)
    ]


def _branch_legend(
    base: str | None, base_color: str, branches: dict[str, str], shown: Sequence[str]
) -> list[str]:
    """Which mark is which branch, in one row under the title: the base branch's line,
    then each other branch of `shown` that has a colour of its own, in the order of
    `branches`; the rest (past the palette, or past the row) counted at its end."""
    names = [b for b in branches if b in set(shown)]
    if not names:
        return []
    coloured = [b for b in names if branches[b] != MORE_BRANCHES]
    items = ([(base, True)] if base else []) + [(b, False) for b in coloured]
    out, x, y = [], float(LEFT), 31.0
    drawn = 0
    for i, (name, on_line) in enumerate(items):
        text = name if len(name) <= 40 else name[:39] + "…"
        width = 26 + 6.4 * len(text)
        last = i == len(items) - 1 and len(coloured) == len(names)
        if x + width + (0 if last else 170) > WIDTH - RIGHT:
            break
        if on_line:
            mark = (
                f'<path d="M{x:.1f},{y:.1f} L{x + 14:.1f},{y:.1f}" stroke="{base_color}" '
                f'stroke-width="1.6"/><circle cx="{x + 7:.1f}" cy="{y:.1f}" r="3" '
                f'fill="{base_color}"/>'
            )
        else:
            drawn += 1
            mark = (
                f'<path d="M{x + 7:.1f},{y - 5:.1f} L{x + 12:.1f},{y:.1f} L{x + 7:.1f},'
                f'{y + 5:.1f} L{x + 2:.1f},{y:.1f} Z" fill="none" stroke="{branches[name]}" '
                f'stroke-width="1.8"/>'
            )
        out.append(
            f'<g class="branches" data-branch="{_a(name)}">{mark}'
            f'<text x="{x + 18:.1f}" y="{y + 4:.1f}">{_a(text)}</text></g>'
        )
        x += width
    rest = len(names) - drawn
    if rest:
        out.append(
            f'<text class="branches more" x="{x:.0f}" y="{y + 4:.0f}">'
            f"+{rest} more branch{'es' * (rest != 1)} (hover a mark)</text>"
        )
    return out


SHAPES = {
    "failed": "cross",
    "over_budget": "square",
    "regression": "up",
    "leak": "up",
    "time_regression": "up-open",
    "improvement": "down",
    "accepted": "diamond",
    "noisy": "ring",
    "environment_changed": "bar",
    "estimate": "plus",
    "new": "dot",
}
"""The shape of each kind of mark: told apart without colour too."""


def _shape(kind: str, x: float, y: float, d: float = 6.0) -> str:
    """An SVG element of the kind's shape centred at (x, y), without its closing tag."""
    color = MARKER_COLORS.get(kind, "#444")
    shape = SHAPES.get(kind, "up")
    fill = f'fill="{color}" fill-opacity="0.9"'
    line = f'fill="none" stroke="{color}" stroke-width="2.2"'
    if shape == "square":
        return (
            f'<rect x="{x - d:.1f}" y="{y - d:.1f}" width="{2 * d:.1f}" height="{2 * d:.1f}" {fill}'
        )
    if shape in ("ring", "dot"):
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{d:.1f}" ' + (
            line if shape == "ring" else fill
        )
    if shape in ("cross", "plus"):
        a, b = ((d, d), (d, -d)) if shape == "cross" else ((d, 0), (0, d))
        return (
            f'<path d="M{x - a[0]:.1f},{y - a[1]:.1f} L{x + a[0]:.1f},{y + a[1]:.1f} '
            f'M{x - b[0]:.1f},{y - b[1]:.1f} L{x + b[0]:.1f},{y + b[1]:.1f}" {line}'
        )
    if shape == "diamond":
        return (
            f'<path d="M{x:.1f},{y - d:.1f} L{x + d:.1f},{y:.1f} L{x:.1f},{y + d:.1f} '
            f'L{x - d:.1f},{y:.1f} Z" {fill}'
        )
    if shape == "bar":
        return f'<path d="M{x:.1f},{y - d:.1f} L{x:.1f},{y + d:.1f}" {line}'
    if shape == "down":
        return (
            f'<path d="M{x - d:.1f},{y - d:.1f} L{x + d:.1f},{y - d:.1f} L{x:.1f},'
            f'{y + d:.1f} Z" {fill}'
        )
    style = line if shape == "up-open" else fill
    return (
        f'<path d="M{x - d:.1f},{y + d:.1f} L{x + d:.1f},{y + d:.1f} L{x:.1f},'
        f'{y - d:.1f} Z" {style}'
    )


def _mark(x: float, y: float, tip: str, kind: str, figure: float) -> str:
    return (
        f'{_shape(kind, x, y)} class="mark" data-kind="{_a(kind)}" '
        f'data-bytes="{figure:.0f}"><title>{_a(tip)}</title></{_tag(kind)}>'
    )


def _tag(kind: str) -> str:
    shape = SHAPES.get(kind, "up")
    return {"square": "rect", "ring": "circle", "dot": "circle"}.get(shape, "path")


def _legend(kinds: Sequence[str]) -> list[str]:
    out: list[str] = []
    x = float(WIDTH - RIGHT)
    for kind in reversed(kinds):
        name = MARKER_NAMES.get(kind, kind.replace("_", " "))
        x -= 22 + 6.2 * len(name)
        out.append(
            f'<g class="legend" data-kind="{_a(kind)}">{_shape(kind, x + 6, 13, 5)}/>'
            f'<text x="{x + 15:.0f}" y="17">{_a(name)}</text></g>'
        )
    return out


def _svg(frame: _Frame, body: list[str], label: str, unit_label: str, metric: str) -> str:
    aria = (
        f"{label}: Y-axis titled '{label} ({unit_label})' for a linear scale with values "
        f"from {_tick(frame.low)} to {_tick(frame.high)}"
    )
    return (
        f'<svg class="panel" data-metric="{_a(metric)}" viewBox="0 0 {WIDTH} '
        f'{frame.height}" width="100%" role="img" aria-label="{_a(aria)}" '
        f'font-family="sans-serif" font-size="11" fill="#555" '
        f'xmlns="http://www.w3.org/2000/svg">\n' + "\n".join(body) + "\n</svg>"
    )


def view_panel(
    metric: str,
    points: Sequence[dict[str, Any]],
    fmt: str,
    budget: tuple[str, int] | None,
    band: tuple[str, str, str, int, int] | None,
    marks: Sequence[dict[str, Any]],
    env_changes: Sequence[dict[str, Any]],
    times: Sequence[str],
    height: int = 210,
    scale: str = "data",
    branches: dict[str, str] | None = None,
) -> str:
    """One view of a case on its own y-scale: the base branch as a line per environment,
    other branches as separate points (each branch its colour from `branches`, runs of
    several branches at one merge-base side by side, a legend naming them), the budget
    line, the headroom band over the current level, and marks (failures where they were
    seen, verdicts at their figure).

    The scale follows the data (`scale` 'data'): a budget within a span of the data is a
    line, a budget far from it a marker at the panel's edge that says how far, so that a
    creep of a few MiB under a 1 GiB budget is not a flat line. 'budget' takes the budget
    into the scale whatever its distance; 'zero' starts it at 0.

    points: dicts with x (ISO time), bytes, line ('base' or OTHER_BRANCHES), environment,
    commit, subject, branch; budget: (label, bytes); band: (label, x from, x to, low,
    high); marks: dicts with x, bytes, kind, commit, message; env_changes: x, change.
    """
    label = model.METRIC_LABELS[metric]
    figures = [p["bytes"] for p in points] + [m["bytes"] for m in marks]
    figures += [band[3], band[4]] if band else []
    low, high, edge = _scale(figures, budget, scale)
    unit, factor = unit_for(max(figures + [1]))
    frame = _Frame(times, low / factor, high / factor, height)
    body = frame.axes(fmt, label, unit)
    if band is not None:
        body.append(_band(frame, band, factor))
    body += [_environment_rule(frame, e, height) for e in env_changes]
    if budget is not None:
        body.append(_budget(frame, budget, edge, points, factor, height))
    color = VIEW_COLORS.get(metric, "#1f77b4")
    body += _series(frame, points, factor, color, branches or {})
    body += [
        _mark(
            frame.x(m["x"]),
            frame.y(m["bytes"] / factor),
            f"{MARKER_NAMES.get(m['kind'], m['kind'])} · {m['commit']} · {m['message']}",
            m["kind"],
            m["bytes"],
        )
        for m in marks
    ]
    body += _legend(sorted({m["kind"] for m in marks}))
    base = next((p["branch"] for p in points if p["line"] != OTHER_BRANCHES), None)
    others = [p["branch"] for p in points if p["line"] == OTHER_BRANCHES]
    body += _branch_legend(base, color, branches or {}, others)
    return _svg(frame, body, label, unit, metric)


def _scale(
    figures: list[Any], budget: tuple[str, int] | None, scale: str
) -> tuple[float, float, str | None]:
    """The y-range, and where a budget too far from the data to draw sits ('above' or
    'below' the panel; None where it is drawn or there is none). `figures` gains what the
    scale takes in."""
    edge = None
    if budget is not None:
        low, high = min(figures), max(figures)
        span = max(high - low, 0.02 * high, 1.0)
        if scale == "budget" or low - span <= budget[1] <= high + span:
            figures.append(budget[1])
        else:
            edge = "above" if budget[1] > high else "below"
    if scale == "zero":
        figures.append(0)
    low, high = min(figures), max(figures)
    if high - low < 0.01 * high:
        # A flat (deterministic) series: a span of 1 % around it, so that its ticks read
        # apart and a change of a few KiB does not fill the panel.
        mid = (high + low) / 2
        low, high = mid - 0.005 * high, mid + 0.005 * high
    return low, high, edge


def _band(frame: _Frame, band: tuple[str, str, str, int, int], factor: float) -> str:
    what, x0, x1, low, high = band
    top, bottom = frame.y(high / factor), frame.y(low / factor)
    return (
        f'<rect class="band" x="{frame.x(x0):.1f}" y="{top:.1f}" '
        f'width="{max(1.0, frame.x(x1) - frame.x(x0)):.1f}" '
        f'height="{max(1.0, bottom - top):.1f}" fill="#2ca02c" fill-opacity="0.18">'
        f"<title>{_a(f'headroom ({what}): {format_size(low)} – {format_size(high)}')}"
        f"</title></rect>"
    )


def _environment_rule(frame: _Frame, e: dict[str, Any], height: int) -> str:
    x = frame.x(e["x"])
    return (
        f'<line class="environment" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
        f'y2="{height - BOTTOM}" stroke="#8c564b" stroke-dasharray="2 3" '
        f'stroke-width="1.5"><title>{_a("environment: " + e["change"])}</title>'
        f"</line>"
    )


def _budget(
    frame: _Frame,
    budget: tuple[str, int],
    edge: str | None,
    points: Sequence[dict[str, Any]],
    factor: float,
    height: int,
) -> str:
    """The budget as a dashed line at its figure, or at the panel's edge saying how far."""
    text, limit = budget
    if edge is not None:
        highest = max(p["bytes"] for p in points)
        y = float(TOP + 4 if edge == "above" else height - BOTTOM - 4)
        far = (
            f"budget {format_size(limit)} {'↑ above' if edge == 'above' else '↓ below'} "
            f"the scale: the highest point is {100 * highest / limit:.0f}% of it"
        )
        return (
            f'<line class="budget edge" x1="{WIDTH - RIGHT - 260}" x2="{WIDTH - RIGHT}" '
            f'y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" stroke-dasharray="6 4" '
            f'stroke-width="2" data-bytes="{limit}"><title>{_a(far + text)}</title>'
            f'</line><text x="{WIDTH - RIGHT - 262}" y="{y + 4:.1f}" fill="#d62728" '
            f'text-anchor="end" font-weight="bold">{_a(far)}</text>'
        )
    y = frame.y(limit / factor)
    return (
        f'<line class="budget" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
        f'y2="{y:.1f}" stroke="#d62728" stroke-dasharray="6 4" stroke-width="2" '
        f'data-bytes="{limit}"><title>{_a(f"budget {format_size(limit)}{text}")}'
        f'</title></line><text x="{LEFT + 4}" y="{y - 4:.1f}" fill="#d62728" '
        f'font-weight="bold">{_a(f"budget {format_size(limit)}{text}"[:120])}'
        f"</text>"
    )


def _held(xy: Sequence[tuple[float, float]]) -> str:
    """A line's points drawn as steps: each figure holds until the next run, which moves it
    at once. A run's memory is its commit's until another commit changes it; a line drawn
    straight between two runs showed a step as a ramp across the time between them."""
    out: list[tuple[float, float]] = []
    for x, y in xy:
        if out:
            out.append((x, out[-1][1]))
        out.append((x, y))
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in out)


def _series(
    frame: _Frame,
    points: Sequence[dict[str, Any]],
    factor: float,
    color: str,
    branches: dict[str, str],
) -> list[str]:
    """The base branch as one line per environment (figures of two software stacks are
    never joined), other branches as separate points, each in its branch's colour."""

    def tip(p: dict[str, Any]) -> str:
        return (
            f"{format_size(p['bytes'])} · {p['commit']} {p['subject']} · {p['branch']} · "
            f"{p['x'][:16].replace('T', ' ')} · {p['environment']}"
        )

    body = []
    by_env: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        if p["line"] != OTHER_BRANCHES:
            by_env.setdefault(p["environment"], []).append(p)
    for line in by_env.values():
        xy = _held([(frame.x(p["x"]), frame.y(p["bytes"] / factor)) for p in line])
        body.append(
            f'<polyline class="line base" points="{xy}" fill="none" stroke="{color}" '
            f'stroke-width="1.6"/>'
        )
        body += [
            _point(
                frame.x(p["x"]),
                frame.y(p["bytes"] / factor),
                tip(p),
                "point base",
                color,
                p["bytes"],
            )
            for p in line
        ]
    others = [
        (p["x"], p["bytes"] / factor, tip(p), p["bytes"], p["branch"])
        for p in points
        if p["line"] == OTHER_BRANCHES
    ]
    return body + _others(frame, others, branches)


def time_panel(
    rows: Sequence[dict[str, Any]],
    fmt: str,
    times: Sequence[str],
    height: int = 180,
    base: str | None = None,
    branches: dict[str, str] | None = None,
) -> str | None:
    """Median (solid) and p95 (dashed) iteration time per run (rows carry their x). Each
    run has one mark, on its median, whose tooltip gives both and its branch: a second mark
    per run (on the p95) doubled the panel's elements, and SVG tooltips are what a browser
    pays most for in a panel. With `base`, only that branch's runs make the lines; the
    other branches' are separate ◇ points, in their colours and lanes as on the memory
    panels."""

    def on_line(r: dict[str, Any]) -> bool:
        return base is None or r.get("git_branch") == base

    series = {
        stat: [(r["x"], r[col]) for r in rows if r.get(col) is not None and on_line(r)]
        for col, stat in (("time_median_s", "median"), ("time_p95_s", "p95"))
    }
    seconds = [r[c] for r in rows for c in ("time_median_s", "time_p95_s") if r.get(c) is not None]
    if not seconds:
        return None
    scale, unit = (1000, "ms") if max(seconds) < 1 else (1, "s")
    frame = _Frame(times, min(seconds) * scale, max(seconds) * scale, height)
    body = frame.axes(fmt, "iteration time", unit)
    for stat, color, dash in (("median", "#1f77b4", ""), ("p95", "#6baed6", "5 3")):
        xy = " ".join(f"{frame.x(x):.1f},{frame.y(s * scale):.1f}" for x, s in series[stat])
        body.append(
            f'<polyline class="line {stat}" points="{xy}" fill="none" '
            f'stroke="{color}" stroke-width="1.4" stroke-dasharray="{dash}"/>'
        )
    others: list[tuple[str, float, str, float, str]] = []
    for r in rows:
        median, p95 = r.get("time_median_s"), r.get("time_p95_s")
        at = median if median is not None else p95
        if at is None:
            continue
        figures = " · ".join(
            f"{stat} {format_seconds(v)}"
            for stat, v in (("median", median), ("p95", p95))
            if v is not None
        )
        tip = (
            f"{figures} · {(r.get('git_commit') or '-')[:10]} "
            f"{(r.get('git_subject') or '')[:60]} · {r.get('git_branch') or '-'} · "
            f"{r['x'][:16].replace('T', ' ')}"
        )
        stat = "median" if median is not None else "p95"
        if not on_line(r):
            others.append((r["x"], at * scale, tip, at, r.get("git_branch") or "-"))
            continue
        body.append(
            f'<circle class="point {stat}" cx="{frame.x(r["x"]):.1f}" '
            f'cy="{frame.y(at * scale):.1f}" r="2.4" fill="#1f77b4">'
            f"<title>{_a(tip)}</title></circle>"
        )
    body += _others(frame, others, branches or {}, "seconds")
    body.append(f'<text x="{WIDTH - RIGHT - 150}" y="18">— median   - - p95</text>')
    body += _branch_legend(base, "#1f77b4", branches or {}, [o[4] for o in others])
    return _svg(frame, body, "iteration time", unit, "time")
