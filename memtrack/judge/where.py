"""Where a case's memory grew: the site diff of a candidate against its baseline.

Sites (records.Site, measured by probes.sites) are matched by module path and
`file:function`, never by line, so that a pull request that only moves lines keeps every
site matched. A growth is said by the pairs (module at file:function) that grew most, until
they explain nine tenths of it, and the rest as 'elsewhere'. Where three pairs do not, the
pairs of one indexed module path and function are named as one (`8 x `blocks.*` at
model.py:forward (1.25 MiB each)`), so that a growth spread over many layers adds up. Memory
made in backward is named without a line: the line a source site holds is the forward's. A
weight's or buffer's growth (a '(setup)' pair) is named by the line that made it, where the
record has its frames. A growth of the process tree's host peak is said the same way by the
processes that grew ('process' sites: `main`, `pt_data_worker 1`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from memtrack.records import BACKWARD, SETUP, Site, pair_key, pair_parts
from memtrack.units import format_size

SHOWN = 3
"""Pairs a 'where' line names at most; the rest is 'elsewhere'."""
EXPLAINED = 0.9
"""The share of the growth the named pairs should explain."""


@dataclass(frozen=True)
class Change:
    """One site's bytes at the peak, baseline and candidate."""

    grouping: str
    key: str
    before: int
    after: int
    line: int | None = None
    """The candidate's line of it, for display."""
    count: int = 1
    """The pairs it stands for: more than one for the layers of an indexed module path
    (`blocks.*`) that grew at one source site."""
    even: bool = True
    """Whether the pairs it stands for grew alike (else each is 'about' its share)."""
    frames: tuple[str, ...] = ()
    """The candidate's frames of it ('file:line', innermost first: Site.frames)."""

    @property
    def delta(self) -> int:
        return self.after - self.before


def diff(base: tuple[Site, ...], candidate: tuple[Site, ...], grouping: str) -> list[Change]:
    """Every site of `grouping` in either run, with its bytes in each, largest growth first
    (sites present in one run only count 0 in the other)."""
    before = {s.key: s.size_bytes for s in base if s.grouping == grouping}
    after = {s.key: s for s in candidate if s.grouping == grouping}
    changes = [
        Change(
            grouping,
            key,
            before.get(key, 0),
            after[key].size_bytes if key in after else 0,
            after[key].line if key in after else None,
            frames=after[key].frames if key in after else (),
        )
        for key in dict.fromkeys([*before, *after])
    ]
    return sorted(changes, key=lambda c: (-c.delta, c.key))


@dataclass(frozen=True)
class Where:
    """Where a case's peak grew against its baseline: the pairs that grew most, and the
    rest."""

    grew: int
    """The growth of the sites' total at the peak (bytes)."""
    named: tuple[Change, ...]
    rest: int
    """What the named pairs do not explain (bytes; negative where others shrank)."""

    def parts(self, site: Callable[[Change], str]) -> list[str]:
        """'+10.50 MiB in ...' for each named pair, in the words `site` gives it, and
        '+0.28 MiB elsewhere' for the rest."""
        parts = [f"+{format_size(c.delta)} in {site(c)}" for c in self.named]
        if self.rest:
            sign = "+" if self.rest > 0 else "-"
            parts.append(f"{sign}{format_size(abs(self.rest))} elsewhere")
        return parts

    what: str = "at the peak"
    """What the bytes are: a growth at the peak, or what one call kept (a leak)."""

    def text(self) -> str:
        """'+10.78 MiB at the peak: +10.50 MiB in `lm_head` at serve.py:generate (line
        42), +0.28 MiB elsewhere'."""
        return f"+{format_size(self.grew)} {self.what}: {', '.join(self.parts(pair_text))}"


def where(
    base: tuple[Site, ...], candidate: tuple[Site, ...], grouping: str = "pair"
) -> Where | None:
    """Where the candidate's peak grew, by the sites of `grouping` ('pair', or 'process' for
    the process tree's peak); None where either run has none or nothing grew."""
    if not any(s.grouping == grouping for s in base) or not any(
        s.grouping == grouping for s in candidate
    ):
        return None
    changes = diff(base, candidate, grouping)
    grew = sum(c.delta for c in changes)
    if grew <= 0:
        return None
    growing = [c for c in changes if c.delta > 0]
    named = _named(growing, grew)
    if sum(c.delta for c in named) < EXPLAINED * grew and grouping == "pair":
        named = _named(_layers(growing), grew)
    return Where(grew, tuple(named), grew - sum(c.delta for c in named))


KEPT_BY_A_CALL = "kept by one call"


def kept(candidate: tuple[Site, ...]) -> Where | None:
    """Where a leak is made: what one call of the step allocated and still held after it
    returned ('retained' sites), by the pairs that kept most; None where none was recorded."""
    changes = [
        Change("pair", s.key, 0, s.size_bytes, s.line, frames=s.frames)
        for s in candidate
        if s.grouping == "retained"
    ]
    total = sum(c.delta for c in changes)
    if total <= 0:
        return None
    named = _named(changes, total)
    return Where(total, tuple(named), total - sum(c.delta for c in named), KEPT_BY_A_CALL)


def _named(growing: list[Change], grew: int) -> list[Change]:
    """The largest of `growing` until they explain EXPLAINED of `grew`, SHOWN at most."""
    named: list[Change] = []
    for c in sorted(growing, key=lambda c: (-c.delta, c.key)):
        if len(named) == SHOWN:
            break
        named.append(c)
        if sum(n.delta for n in named) >= EXPLAINED * grew:
            break
    return named


_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")
"""A module path's index: `3` of `blocks.3.attn`."""


def _layers(growing: list[Change]) -> list[Change]:
    """`growing` with the pairs of one indexed module path (its numbers as `*`) and one
    source site as one change each: the layers of a stack that all grew."""
    groups: dict[str, list[Change]] = {}
    for c in growing:
        module, source = pair_parts(c.key)
        shape = _INDEX.sub("*", module) if module else ""
        key = pair_key(shape, source) if shape != module else c.key
        groups.setdefault(key, []).append(c)
    out = []
    for key, members in groups.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        lines = {m.line for m in members}
        out.append(
            Change(
                members[0].grouping,
                key,
                sum(m.before for m in members),
                sum(m.after for m in members),
                lines.pop() if len(lines) == 1 else None,
                len(members),
                len({m.delta for m in members}) == 1,
                max(members, key=lambda m: m.delta).frames,
            )
        )
    return out


def pair_text(c: Change) -> str:
    if c.grouping == "process":
        return f"process `{c.key}`"
    module, source = pair_parts(c.key)
    at = shown_line(c)
    line = f" (line {at})" if at else ""
    made = made_at(c)
    if made is not None:
        where, line = f"made at {made}", ""
    else:
        where = f"at {source}"
    if c.count > 1:
        return f"{c.count} x `{module}` {where}{line} ({each(c)})"
    return f"`{module}` {where}{line}" if module else f"{source}{line}"


def made_at(c: Change) -> str | None:
    """Where a weight's or buffer's growth (a '(setup)' pair) was made ('file:line'), where
    its record says so; None for any other change."""
    if c.grouping == "pair" and c.frames and pair_parts(c.key)[1] == SETUP:
        return c.frames[0]
    return None


def shown_line(c: Change) -> int | None:
    """The line a change is shown at: none for memory made in backward (the site's line
    is the forward's, which did not make it)."""
    return None if pair_parts(c.key)[0] == BACKWARD else c.line


def each(c: Change) -> str:
    """What each of a group's pairs grew: '1.25 MiB each', or 'about 1.25 MiB each' where
    they differ."""
    about = "" if c.even else "about "
    return f"{about}{format_size(c.delta // c.count)} each"


__all__ = [
    "Change",
    "Where",
    "diff",
    "each",
    "kept",
    "made_at",
    "pair_text",
    "shown_line",
    "where",
]
