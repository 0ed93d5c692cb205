"""The dashboard's pages. Each module has `render(ctx)`; they share `Context` and helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import streamlit as st
from memtrack.dashboard import data, model
from streamlit.errors import StreamlitAPIException

from memtrack.config import Config
from memtrack.escape import markdown_text, one_line

PAGES = ("Overview", "History", "Regressions", "Run detail", "Compare", "Plan")
"""Page names, as the page selector and the `page` query parameter spell them (any case;
`run-detail` and `run_detail` work too)."""


def plain(df: Any) -> Any:
    """A table for st.dataframe, each text cell on one line with no control, separator or
    bidi character: the grid shows recorded text as it is."""
    from pandas.api.types import is_object_dtype, is_string_dtype

    out = df.copy()
    for col in out.columns:
        if is_object_dtype(out[col]) or is_string_dtype(out[col]):
            out[col] = out[col].map(lambda v: one_line(v) if isinstance(v, str) else v)
    return out


def esc(text: object, limit: int | None = None) -> str:
    """Recorded or URL-supplied text made inert for Markdown (memtrack.escape): no link,
    image, emphasis, directive, math or auto-link can form; line breaks flattened; cut to
    `limit` characters."""
    return markdown_text(text, limit)


def page_name(text: str | None) -> str | None:
    """The page a `page` query parameter names, in any case; None when it names none."""
    key = re.sub(r"[\s_+-]+", " ", (text or "").strip()).lower()
    return next((p for p in PAGES if p.lower() == key), None)


STATUS_LOOK = {  # palette colour, Material icon, table cell background and text colour
    "failed": ("red", ":material/error:", "#fbd5d5", "#7f1d1d"),
    "over budget": ("red", ":material/block:", "#fbd5d5", "#7f1d1d"),
    "regression": ("orange", ":material/trending_up:", "#fde2c4", "#7c3a00"),
    "near budget": ("yellow", ":material/warning:", "#fdf1bf", "#5f4b00"),
    "ok": ("green", ":material/check_circle:", "#d9f2de", "#1b5e2b"),
}


def badge(status: str) -> str:
    """A coloured Markdown badge for a status."""
    color, icon, _, _ = STATUS_LOOK[status]
    return f":{color}-badge[{icon} {status}]"


def status_cell_style(status: str) -> str:
    """CSS for a status cell of a table (a drawn table's, or a pandas Styler's)."""
    _, _, background, text = STATUS_LOOK.get(status, STATUS_LOOK["ok"])
    return f"background-color: {background}; color: {text}; font-weight: 600"


@dataclass(frozen=True)
class Context:
    """What every page needs: the database, its stamp (the cache key) and the config."""

    db: str
    key: data.Stamp
    config: Config | None
    summary: dict[str, Any]
    choices: dict[str, Any] = field(default_factory=dict)
    repository: str | None = "*"
    """The repository whose history is shown, with the runs that record none
    (`Store.repository`); '*': every run, where the database records no repository."""

    @property
    def base_branch(self) -> str:
        return self.config.base_branch if self.config else "main"

    @property
    def forge_url(self) -> str:
        """Where commits and compares are linked: the config's forge, else GitHub's."""
        return self.config.forge_url if self.config else Config.forge_url

    @property
    def headroom_factor(self) -> float:
        return self.config.headroom_factor if self.config else model.HEADROOM_FACTOR

    def env(self, env_id: str | None) -> dict[str, Any]:
        return self.choices["environments"].get(env_id) or {}

    def budgets(
        self, row: dict[str, Any], verdicts: list[dict[str, Any]]
    ) -> list[model.CaseBudget]:
        """Budgets for a measurement: the config's today, else those the gate recorded."""
        found: list[model.CaseBudget] = []
        if self.config is not None:
            found = model.budgets_for(
                self.config.budgets, row, model.gpu_names(self.env(row.get("env_id")))
            )
        return found or model.verdict_budgets(verdicts)


def goto(page: str, **state: Any) -> None:
    """A callback: switch page and set its selections before the next rerun. The page and
    the widgets they belong to follow the URL, so the address bar then links to exactly
    what is shown; the URL is set here too for a widget of another page, not drawn in this
    run."""
    st.session_state["page"] = page
    st.query_params["page"] = page
    for k, v in state.items():
        st.session_state[k] = v
        try:
            st.query_params[k] = v
        except StreamlitAPIException:  # bound to a widget of this run: it follows the state
            pass


def short(sha: str | None) -> str:
    return (sha or "-")[:10]


def resolve_case(ctx: Context, text: str | None) -> tuple[str | None, list[str]]:
    """A case id from what a link may carry: the id itself, the short label the Overview
    shows, or a workload name with a single case. Returns (case, candidates): no case and
    the candidates when the text is ambiguous or unknown (candidates then share its
    workload, or are empty)."""
    cases: list[str] = ctx.choices["cases"]
    text = (text or "").strip()
    if not text or text in cases:
        return (text or None), []
    labels = model.short_case_labels(cases)
    found = [c for c in cases if labels[c] == text]
    if len(found) == 1:
        return found[0], []
    name = text.split("[", 1)[0]
    same = [c for c in cases if c.split("[", 1)[0] == name]
    if len(same) == 1 and not found:
        return same[0], []
    return None, found or same


def when(iso: str | None) -> str:
    """'2026-01-03 14:05 (2 days ago)'."""
    if not iso:
        return "-"
    try:
        t = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    secs = (datetime.now(timezone.utc) - t).total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if secs >= size:
            n = int(secs // size)
            ago = f"{n} {unit}{'s' if n > 1 else ''} ago"
            break
    else:
        ago = "just now" if secs >= 0 else "in the future"
    return f"{t.strftime('%Y-%m-%d %H:%M')} ({ago})"


def run_label(r: dict[str, Any]) -> str:
    """'2026-01-03 14:05 · main · 1a2b3c4d5e · subject' for run pickers."""
    subject = " ".join((r.get("git_subject") or "").split())[:50]
    failed = f" · {r['failed']} failed" if r.get("failed") else ""
    return (
        f"{(r.get('started_at') or '')[:16].replace('T', ' ')} · {r.get('git_branch') or '-'}"
        f" · {short(r.get('git_commit'))} · {subject}{failed}"
    )


def resolve_run(ctx: Context, text: str | None) -> str | None:
    """A run id from a run id or commit prefix; None when it matches nothing."""
    text = (text or "").strip()
    if not text:
        return None
    found = data.find_runs(ctx.db, ctx.key, text, repository=ctx.repository)
    return found[0]["run_id"] if found else None
