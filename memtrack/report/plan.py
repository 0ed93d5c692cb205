"""`memtrack plan`'s result shown: a terminal table, Markdown, or JSON. Nothing is printed
here; the command prints what these return."""

from __future__ import annotations

from typing import Any

from memtrack.escape import markdown_code, markdown_text, terminal_text
from memtrack.plan.fit import CARRY_RULE, Plan, answer, describe, show_value
from memtrack.units import format_size


def _exact(n: int) -> str:
    return f"{format_size(n)} ({n:,} B)"


def _header(p: Plan) -> list[str]:
    f = p.fit
    lines = [
        f"plan · {p.case} · swept {p.param}: "
        + ", ".join(f"{show_value(x)} -> {format_size(y)}" for x, y in p.points),
        f"must fit: {p.metric} ({p.metric_note})",
        f"model: peak({p.param}) = {f.formula()} [{f.rule}]",
        f"headroom: {p.headroom.fraction:.2%} of the predicted peak, from {p.headroom.detail}",
        f"fits: peak({p.param}) x (1 + headroom) <= the GPU's memory; lowest value considered "
        f"{show_value(p.lowest)}",
    ]
    if p.carried_to is not None:
        lines.append(f"answers: up to {p.param}={show_value(p.carried_to)} ({CARRY_RULE})")
    return lines


def terminal(p: Plan) -> list[Any]:
    """Rich renderables: the arithmetic in lines, then one row per GPU, then notes."""
    from rich.table import Table
    from rich.text import Text

    def text(line: str) -> Any:
        return Text(terminal_text(line))

    out: list[Any] = [text(line) for line in _header(p)]
    table = Table(title=None)
    for col, justify in (
        ("GPU", "left"),
        ("memory (nominal)", "right"),
        (f"largest {p.param}", "right"),
        ("first not fitting", "right"),
        ("largest measured that fits", "right"),
        ("need at largest", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in p.gpus:
        at = row.largest if row.largest is not None else None
        need_at = (
            "-"
            if at is None
            else format_size(round(float(p.fit.peak(at)) * (1 + p.headroom.fraction)))
        )
        table.add_row(
            *(
                text(c)
                for c in (
                    row.gpu.name,
                    f"{row.gpu.stated} ({row.gpu.memory_bytes:,} B)",
                    answer(row),
                    show_value(row.first_over),
                    show_value(row.measured_largest),
                    need_at,
                )
            )
        )
    out.append(table)
    for row in p.gpus:
        if row.levers:
            out.append(text(f"{row.gpu.name}: {describe(row, p.param)}. Levers:"))
            out += [text(f"  - {lever}") for lever in row.levers]
    out += [text(f"note: {n}") for n in p.notes]
    return out


def markdown(p: Plan) -> str:
    def md(text: object) -> str:
        return markdown_text(text, inline=True)

    lines = [f"### Will it fit? {markdown_code(p.case)} over {markdown_code(p.param)}", ""]
    lines += [f"- {md(line)}" for line in _header(p)[1:]]
    lines += ["", f"| {md(p.param)} | measured peak |", "|---:|---:|"]
    lines += [f"| {md(show_value(x))} | {md(_exact(y))} |" for x, y in p.points]
    lines += [
        "",
        f"| GPU | memory (nominal) | largest {md(p.param)} | first not fitting | "
        "largest measured that fits |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in p.gpus:
        lines.append(
            f"| {md(row.gpu.name)} | {md(row.gpu.stated)} | {md(answer(row))} | "
            f"{md(show_value(row.first_over))} | "
            f"{md(show_value(row.measured_largest))} |"
        )
    for row in p.gpus:
        if row.levers:
            lines += ["", f"**{md(row.gpu.name)}**: {md(describe(row, p.param))}. Levers:"]
            lines += [f"- {md(lever)}" for lever in row.levers]
    lines += [""] + [f"_{md(n)}_" for n in p.notes]
    return "\n".join(lines) + "\n"


def to_json(p: Plan) -> dict[str, Any]:
    f = p.fit
    return {
        "case": p.case,
        "param": p.param,
        "metric": p.metric,
        "metric_note": p.metric_note,
        "points": [{"value": x, "peak_bytes": y} for x, y in p.points],
        "fit": {
            "model": f.model,
            "a_bytes": f.a,
            "b_bytes": f.b,
            "c_bytes": f.c,
            "rule": f.rule,
            "residual_linear": f.residual_linear,
            "residual_quadratic": f.residual_quadratic,
        },
        "headroom": {
            "fraction": p.headroom.fraction,
            "source": p.headroom.source,
            "detail": p.headroom.detail,
        },
        "lowest": p.lowest,
        "carried_to": p.carried_to,
        "gpus": [
            {
                "name": r.gpu.name,
                "memory_bytes": r.gpu.memory_bytes,
                "memory_stated": r.gpu.stated,
                "largest": r.largest,
                "first_over": r.first_over,
                "unbounded": r.unbounded,
                "extrapolated": r.extrapolated,
                "measured_largest": r.measured_largest,
                "measured_top": r.measured_top,
                "times_past_measured": r.past,
                "carried_to": r.carried_to,
                "levers": list(r.levers),
            }
            for r in p.gpus
        ],
        "notes": list(p.notes),
    }


__all__ = ["markdown", "terminal", "to_json"]
