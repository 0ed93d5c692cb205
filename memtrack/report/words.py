"""Every verdict in words, written once: `message(v)` is its one line of arithmetic and
conclusion (what the terminal, the Markdown, the annotations, the JSON report and the
database's verdicts table say), `words(v)` its conclusion alone, `details(v)` its further
lines. The judge decides and hands over data (memtrack.judge.verdict); nothing here decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memtrack.judge.verdict import (
    Abstained,
    BudgetChange,
    BudgetUse,
    Failure,
    Headroom,
    Leak,
    Paired,
    Quality,
    Removed,
    Unbased,
    Unpaired,
    Verdict,
)
from memtrack.units import format_seconds, format_size

if TYPE_CHECKING:
    from memtrack.judge.evidence import Estimate
    from memtrack.judge.history import Creep

# -- figures ------------------------------------------------------------------------------


def size(n: float) -> str:
    return format_size(int(n))


def pct(p: float | None) -> str:
    return "n/a" if p is None else f"{p:+.2f}%"


def delta_bytes(d: float) -> str:
    """'+2.00 MiB (+2,097,152 B)', '+513 B'."""
    n = int(round(d))
    if abs(n) < 1024:
        return f"{n:+,} B"
    return f"{'+' if n >= 0 else '-'}{format_size(abs(n))} ({n:+,} B)"


def signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_size(abs(int(round(x))))


# -- the conclusion ------------------------------------------------------------------------


def words(v: Verdict) -> str:
    """The conclusion in words, as the message says it after its arithmetic and before the
    budget's part: 'regression', 'the baseline passed (20 of 20 runs ok)'."""
    said = _WORDS.get(type(v.why))
    return said(v, v.why) if said is not None else v.kind.replace("_", " ")


def _memory_words(v: Verdict, h: Headroom) -> str:
    room, base = v.room or 0.0, v.baseline_value or 0.0
    if v.kind == "regression" and not v.blocking and v.context != "base":
        text = (
            "regression (provisional: blocks only past a 10% jump and past "
            f"{size(h.factor * h.floor)})"
        )
    elif v.kind == "improvement" and h.suggested_budget:
        text = f"improvement; a budget of {format_size(h.suggested_budget)} would hold it"
    elif v.kind == "noisy":
        share = 100 * room / base if base else 0.0
        text = (
            f"noisy: the headroom is {share:.2f}% of the baseline, wider than "
            f"{h.noisy_above:.0%}, so a growth up to {size(room)} would pass unseen; to "
            f"sharpen it: {h.sharpen}"
        )
    else:
        text = v.kind.replace("_", " ")
    a = v.acceptance
    if a is not None and v.closes is None:  # an open regression accepted: said after
        text += (
            f" ({'within' if a.within else 'beyond'} the {a.amount} accepted in commit "
            f"{a.commit[:12]}: {a.reason})"
        )
    if v.would is not None:
        w = v.would
        given = f"names {w.other_metric} only" if w.other_metric else f"allows {w.amount}"
        text += (
            f"; the Memtrack-Accept trailer of commit {w.commit[:12]} {given}; "
            f"`Memtrack-Accept: {w.value}` would accept this"
        )
    if h.component is not None and h.component_delta is not None:
        text += f"; {h.component} grew {delta_bytes(h.component_delta)}"
    return text


def _failure_why(f: Failure) -> str:
    if f.known:
        return f"the newest baseline run failed too ({f.newest}): a known failure, not caused here"
    if f.baseline_runs:
        return f"the baseline passed ({f.passed} of {f.baseline_runs} runs ok)"
    return "no baseline: a case that does not run cannot be gated"


def _leak_why(k: Leak) -> str:
    if k.before is not None and k.before >= k.per:
        return (
            f"the newest baseline run leaked {k.before:,} B per iteration too: a known leak, "
            "not caused here"
        )
    if not k.measured:
        return (
            "no baseline run says what the case retained before, so it is reported: memory "
            "that grows with every call is a leak, unless the runtime's caches fill"
        )
    return "memory that grows with every call is a leak, never noise"


def _warned(v: Verdict, text: str) -> str:
    return text + (" (warning)" if v.kind == "time_regression" and not v.blocking else "")


def _paired_words(v: Verdict, p: Paired) -> str:
    pv = v.p_value or 0.0
    if v.kind == "time_regression":
        return _warned(v, f"slower in {p.slower} of {p.rounds} rounds (sign test p = {pv:.2g})")
    if p.ratio <= p.line:
        return "within the threshold"
    return (
        f"slower in {p.slower} of {p.rounds} rounds, sign test p = {pv:.2g} above "
        f"{p.alpha:g}: not a finding"
    )


def _unpaired_words(v: Verdict, u: Unpaired) -> str:
    n, pv = u.runs, v.p_value or 0.0
    value, threshold = v.candidate_value or 0.0, v.threshold or 0.0
    runs = f"{n} baseline run{'s' * (n != 1)}"
    if v.provisional:
        return f"{runs} of the {u.minimum} the gate needs: not judged"
    if v.kind == "time_regression":
        return _warned(v, f"slower than all {runs} (rank p = {pv:.2g})")
    if value <= threshold:
        return "within the threshold"
    if u.as_slow:
        return f"{u.as_slow} of {n} baseline runs were as slow: not a finding"
    if value <= u.slowest * (1 + u.min_effect):
        return (
            f"within {u.min_effect:.0%} of the slowest baseline run "
            f"({format_seconds(u.slowest)}): not a finding"
        )
    window = (
        f"before {u.needed} runs"
        if u.window >= u.needed
        else f"in a window of {u.window} (baseline_runs): it takes {u.needed}"
    )
    return (
        f"slower than all {runs}, but rank p = {pv:.2g} is above {u.alpha:g}: not a finding "
        f"{window} (or a paired timing, `memtrack run --against`)"
    )


def _quality_what(q: Quality) -> str:
    if q.status == "ok":
        return "quality kept"
    if q.status == "none":
        return "not compared"
    if q.status == "error":
        return "quality error"
    return "the precision change breaks its tolerance" if q.changed else "the result changed"


def _unbased_words(v: Verdict, u: Unbased) -> str:
    if u.other_run is not None:
        return (
            f"environment changed ({'; '.join(u.environment) or 'fingerprint differs'}): no "
            f"baseline on {u.base_branch} with this environment, not compared (newest "
            f"other-environment run {u.other_run[:12]} of {(u.other_commit or '?')[:12]})"
        )
    if u.failed:
        return (
            f"new: no ok run on {u.base_branch}: its {u.runs} run{'s' * (u.runs != 1)} there "
            f"failed ({', '.join(u.failed)})"
        )
    if u.runs:
        return f"new: no run on {u.base_branch} measured its {v.metric} figure"
    return f"new: no baseline on {u.base_branch}"


# -- the message ---------------------------------------------------------------------------


def message(v: Verdict) -> str:
    """The verdict's one line: its arithmetic and conclusion, then what it carries beside
    (a rank, the VRAM fit, an open regression it accepts, where it grew, what changed
    around the code), a renamed case's predecessor first."""
    text = _core(v)
    if v.rank is not None:
        text += rank_words(v)
    text += _vram(v)
    if v.closes is not None and v.acceptance is not None:
        a = v.acceptance
        text += (
            f"; accepted: the regression on {v.closes.branch} {v.closes.describe()} is within "
            f"the {a.amount} accepted in commit {a.commit[:12]}: {a.reason}"
        )
    if v.where is not None:
        text += f"; where: {v.where.text()}"
    if v.around:
        text += f" ({v.around} between baseline and candidate)"
    if v.rename is not None:
        r = v.rename
        text = f"{r.change} (against {r.compared_with}, the case it replaces): {text}"
    return text


def _core(v: Verdict) -> str:
    said = _MESSAGES.get(type(v.why))
    return said(v, v.why) if said is not None else words(v)


def _leak_message(v: Verdict, why: Leak) -> str:
    shown = ", ".join(f"{b:,} B" for b in why.retained)
    return (
        f"retained: leak: +{why.per:,} B per iteration (each of the {len(why.retained)} "
        f"measured iterations left memory allocated when it ended: {shown}), "
        f"{format_size(why.per * why.calls)} after {why.calls:,} calls; {words(v)}"
    )


def _memory_message(v: Verdict, h: Headroom) -> str:
    base, room = v.baseline_value or 0.0, v.room or 0.0
    value = v.candidate_value or 0.0
    n = v.baseline_runs
    at = (
        f"median of {n} run{'s' * (n != 1)}"
        + (f" at the level since {(h.level_since or '?')[:12]}" if h.steps else "")
        + (f", {h.window_runs} in the window" if h.window_runs != n else "")
        + (", provisional" if v.provisional else "")
    )
    if h.bound is not None:
        arithmetic = (
            f"bounded by the sum of {h.sessions} sessions {size(h.bound)} (the peak if every "
            "session peaked at once; how they interleave moves it below that), floor "
            f"{size(h.floor)} -> headroom {size(room)}"
        )
    else:
        known = f", {h.known_runs} of them on other environments" if h.known_runs else ""
        arithmetic = (
            f"spread {size(h.spread)} (noise {size(h.noise)} x {h.widen:.2f} for "
            f"{h.runs} run{'s' * (h.runs != 1)}{known}) x factor {h.factor:g}, floor "
            f"{size(h.floor)} -> headroom {size(room)}"
        )
    delta = value - base
    cmp = "> headroom" if delta > room else "< -headroom" if delta < -room else "within ±headroom"
    against = (
        f"threshold {size(base + room)}; candidate {size(value)}, delta {delta_bytes(delta)} "
        f"{pct(v.delta_pct)} {cmp}"
    )
    return (
        f"{v.metric}: baseline {size(base)} ({at}), {arithmetic}, {against}: {words(v)}"
        f"{budget_words(v)}"
    )


def budget_words(v: Verdict) -> str:
    """'; budget 16.00 MiB (reason): margin 4.33 MiB', or 'OVER by ...'."""
    b = v.budget
    if b is None or b.vram:
        return ""
    value = int(v.candidate_value or 0)
    margin = b.limit_bytes - value
    state = f"margin {format_size(margin)}" if margin >= 0 else f"OVER by {format_size(-margin)}"
    if b.device_bytes is not None and margin >= 0 and value > b.device_bytes:
        state += (
            f", but above the {format_size(b.device_bytes)} of {b.device_name}: it cannot be "
            "within budget"
        )
    return f"; budget {format_size(b.limit_bytes)} ({b.reason}): {state}"


def rank_words(v: Verdict) -> str:
    r = v.rank
    if r is None:
        return ""
    if r.summed:
        return f"; summed over {r.ranks} ranks (they share the host)"
    if r.rank is None:
        return ""
    return f"; largest per-device peak, rank {r.rank} (device {r.device})"


def _vram(v: Verdict) -> str:
    if not v.fits:
        return ""
    worst = min(v.fits, key=lambda f: f.margin)
    if worst.margin >= 0:
        return f"; fits VRAM of device {worst.index} with {size(worst.margin)} to spare"
    if v.budget is not None and v.budget.vram:
        return (
            f"; peak + headroom does NOT fit the {format_size(worst.total_bytes)} VRAM of "
            f"device {worst.index} ({worst.name})"
        )
    return ""


def _paired_message(v: Verdict, p: Paired) -> str:
    ref = p.ref[:12]
    k = p.rounds
    return (
        f"time ({p.figure}), paired with {ref} over {k} round{'s' * (k != 1)} under the same "
        f"load: {ref} median {format_seconds(v.baseline_value)}, candidate median "
        f"{format_seconds(v.candidate_value)}; ratio median {p.ratio:.3f}, spread "
        f"{p.spread:.1%} (half the rounds' range) to the power {p.factor:g}, floor "
        f"{p.min_effect:.0%} -> threshold {p.line:.3f}: {words(v)}"
    )


def _unpaired_message(v: Verdict, u: Unpaired) -> str:
    n, base = u.runs, v.baseline_value or 0.0
    left = (
        f"; {u.left_out} run{'s' * (u.left_out != 1)} timed on a contended machine left out"
        if u.left_out
        else ""
    )
    return (
        f"time ({u.figure}): baseline {format_seconds(base)} (median of {n} run median"
        f"{'s' * (n != 1)}{', provisional' if v.provisional else ''}{left}), run-to-run "
        f"spread {format_seconds(u.spread)} x factor {u.factor:g}, floor {u.min_effect:.0%} = "
        f"{format_seconds(u.min_effect * base)} -> threshold {format_seconds(v.threshold)}; "
        f"candidate median {format_seconds(v.candidate_value)} of {u.iterations} iterations, "
        f"delta {pct(v.delta_pct)}: {words(v)}"
    )


def _quality_message(v: Verdict, q: Quality) -> str:
    pinned = f" (sha256 {q.sha256[:12]})" if q.sha256 else ""
    against = (
        f"{q.changed} against {q.reference}{pinned}"
        if q.changed
        else f"at the reference's own precision, against {q.reference}{pinned}"
    )
    if q.status == "ok":
        memory = ""
        if q.changed and v.baseline_value is not None and v.candidate_value is not None:
            full, own = int(v.baseline_value), int(v.candidate_value)
            memory = (
                f"; framework peak {format_size(own)} against {format_size(full)} at full "
                f"precision: saves {saving(full, own)}"
            )
        elif q.changed:
            memory = "; the full-precision sibling was not measured in this run: no saving shown"
        return f"quality kept, {against}: {q.outcome}{memory}"
    if q.status == "none":
        return f"not compared: {q.outcome}"
    return f"{_quality_what(q)} ({against}): {q.outcome}"


def saving(full: int, own: int) -> str:
    """'3.00 MiB (50.0%)', or 'none: 1.00 MiB more (10.0%)'."""
    saved = full - own
    share = 100.0 * saved / full if full else 0.0
    if saved >= 0:
        return f"{format_size(saved)} ({share:.1f}%)"
    return f"none: {format_size(-saved)} more ({-share:.1f}%)"


# -- further lines -------------------------------------------------------------------------


def details(v: Verdict) -> list[str]:
    """A verdict's further lines: the budget changes touching it, a budget beyond its device,
    the versions that differ, each device's VRAM fit, where it grew, what changed around."""
    out = [budget_change(ch) for ch in v.changes]
    b = v.budget
    if (
        b is not None
        and not b.vram
        and b.device_bytes is not None
        and b.limit_bytes > b.device_bytes
    ):
        out.append(
            f"budget {format_size(b.limit_bytes)} is above the {format_size(b.device_bytes)} "
            f"of {b.device_name}: a peak that fits the device is all it can hold"
        )
    if isinstance(v.why, Unbased):
        out[:0] = list(v.why.environment)
    for f in v.fits:
        fit = f"fits, margin {size(f.margin)}" if f.margin >= 0 else "does NOT fit"
        out.append(
            f"device {f.index} ({f.name or '?'}): peak {format_size(f.peak_bytes)} + headroom "
            f"{size(f.room)} of {format_size(f.total_bytes)} VRAM: {fit}"
        )
    if v.where is not None:
        out.append(v.where.text())
    if v.around:
        out.append(f"{v.around} between baseline and candidate")
    return out


def budget_change(ch: BudgetChange) -> str:
    """'budget raised: decoder (allocated) on H100 16.00 MiB -> 20.00 MiB (reason)'."""
    where = (
        ch.workload + (f" ({ch.metric})" if ch.metric else "") + (f" on {ch.gpu}" if ch.gpu else "")
    )
    return (
        f"budget {ch.change}: {where} {format_size(ch.old_bytes)} -> "
        f"{format_size(ch.new_bytes)} ({ch.reason})"
    )


def budget_use(b: BudgetUse) -> str:
    return f"{format_size(b.limit_bytes)} ({b.reason})"


def failure(v: Verdict) -> str | None:
    """A failed verdict's status and, in brackets, the last line of its message."""
    return v.why.failure if isinstance(v.why, Failure) else None


def sharpen(v: Verdict) -> str | None:
    return v.why.sharpen if isinstance(v.why, Headroom) else None


def estimate(e: Estimate) -> str:
    """'estimate 4.90 MiB (tensors only: excludes kernel scratch) (measured 4.90 MiB,
    +0.00%)', or with the scratch of a measured run that calibrated it; 'estimate of commit
    1a2b3c4d5e6f ...' where it was made for another commit than the one checked."""
    text = f"estimate {format_size(e.estimate_bytes)}"
    if e.candidate_commit is not None and e.commit != e.candidate_commit:
        text = (
            f"estimate of commit {(e.commit or 'unknown')[:12]} (not the one "
            f"checked) {format_size(e.estimate_bytes)}"
        )
    if e.scratch_bytes is None:
        text += " (tensors only: excludes kernel scratch)"
    else:
        text += (
            f" ({format_size(e.estimate_bytes - e.scratch_bytes)} of tensors + "
            f"{format_size(e.scratch_bytes)} kernel scratch from run "
            f"{(e.scratch_run_id or 'unknown')[:12]}"
            + (", this run" if e.scratch_run_id == e.candidate_run_id else "")
            + ")"
        )
    if e.measured_bytes:
        share = 100.0 * (e.estimate_bytes / e.measured_bytes - 1)
        text += f" (measured {format_size(e.measured_bytes)}, {share:+.2f}%)"
    if e.budget_bytes is not None:
        share = 100.0 * e.estimate_bytes / e.budget_bytes if e.budget_bytes else 0.0
        text += (
            f"; {e.budget_metric} budget {format_size(e.budget_bytes)} "
            f"({share:.0f}% of it, information only)"
        )
    return text


def creep(c: Creep) -> str:
    """A series' growth since its anchor, with the fit's arithmetic and its steps."""
    if c.largest is not None:
        how = (
            f"{c.steps_between} step(s) between, the largest {signed(c.largest[0])} at "
            f"{c.largest[1][:12]}"
        )
    else:
        how = "no single step: slow creep" if c.trend_flagged else "no step between"
    if c.taken:
        how += (
            f"; {signed(c.accepted)} of it accepted ("
            + "; ".join(f"{commit[:12]}: {reason}" for commit, reason in c.taken)
            + "), which is never flagged"
        )
    since = (
        f"its first run {c.anchor_commit[:12]} (the series starts after the anchor)"
        if c.young
        else f"anchor {c.anchor_commit[:12]}"
    )
    return (
        f"{c.metric}: fitted {size(c.latest_value)} at {c.latest_commit[:12]} vs "
        f"{size(c.anchor_value)} at {since}, {c.runs} runs: {signed(c.delta)} "
        f"({c.delta_pct:+.2f}%; trend {signed(c.trend)}) "
        f"{'>' if c.trend_flagged else '<='} allowed {size(c.allowed)} = max(tolerance "
        f"{c.tolerance:.1%}, factor x standard error {size(c.error)}); {how}"
    )


# -- each record's words, by its type ------------------------------------------------------

_WORDS: dict[type, Callable[[Verdict, Any], str]] = {
    Headroom: _memory_words,
    Failure: lambda v, why: _failure_why(why),
    Leak: lambda v, why: _leak_why(why),
    Paired: _paired_words,
    Unpaired: _unpaired_words,
    Abstained: lambda v, why: (
        f"not judged: the machine was contended while this case was timed ({why.busy})"
    ),
    Quality: lambda v, why: _quality_what(why),
    Unbased: _unbased_words,
    Removed: lambda v, why: (
        f"held by {why.base_branch}'s runs of the same kind (the suite, or the tests of its "
        "file) and by none of this commit's: its series ends here"
    ),
}
"""The conclusion (`words`) of each kind of verdict record."""

_MESSAGES: dict[type, Callable[[Verdict, Any], str]] = {
    Headroom: _memory_message,
    Unbased: lambda v, why: (
        f"{v.metric} {size(v.candidate_value or 0)}: {words(v)}{budget_words(v)}"
    ),
    Failure: lambda v, why: f"status: {why.failure}; {words(v)}",
    Leak: _leak_message,
    Paired: _paired_message,
    Unpaired: _unpaired_message,
    Abstained: lambda v, why: f"time: {words(v)}",
    Quality: _quality_message,
    Removed: lambda v, why: f"removed: {words(v)}",
}
"""The message's arithmetic and conclusion (`message`, before what it adds) by record."""


__all__ = [
    "budget_change",
    "budget_words",
    "creep",
    "delta_bytes",
    "details",
    "estimate",
    "failure",
    "message",
    "pct",
    "rank_words",
    "saving",
    "sharpen",
    "signed",
    "size",
    "words",
]
