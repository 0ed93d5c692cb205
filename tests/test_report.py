"""The reports of `memtrack check` (memtrack.report) render one row model, built once from
the check's result, and read what they show of a verdict from its data: its words are
written once (memtrack.report.words), never parsed back. Judged on records stored in a real
SQLite file, then rendered as terminal text, Markdown and JSON."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from factories import MiB, make_measurement, make_run

from memtrack.config import Config
from memtrack.judge.check import CheckResult, check
from memtrack.judge.verdict import KINDS, Quality, Verdict
from memtrack.report import check as report
from memtrack.report import words
from memtrack.report.rows import check_rows
from memtrack.store.database import Store

BASE = 100 * MiB
WILD = [BASE, BASE + 4 * MiB, BASE - 3 * MiB, BASE + 2 * MiB, BASE - 2 * MiB]
"""A baseline too noisy to judge a growth of a MiB: the verdict is `noisy`."""


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "m.db")
    yield s
    s.close()


def _record(store: Store, measurements, minute: int, **kw) -> str:
    run = make_run(measurements, started_at=f"2026-01-01T00:{minute:02d}:00+00:00", **kw)
    store.write_run(run)
    return run.run_id


def _checked(store: Store, tmp_path: Path, candidate) -> CheckResult:
    """Five noisy runs of `decoder` and two steady ones of `loader` on main, then a pull
    request's run of `candidate`."""
    for i, peak in enumerate(WILD):
        steady = make_measurement("loader", {"batch": 1}, peak=BASE)
        _record(store, [make_measurement(peak=peak), steady], i)
    run_id = _record(store, candidate, 30, branch="pr")
    return check(store, Config(path=None, root=tmp_path), run_id=run_id)


def _terminal(result: CheckResult) -> str:
    from rich.console import Console
    from rich.text import Text

    console = Console(file=io.StringIO(), width=200)
    for r in report.terminal(result):
        console.print(r, soft_wrap=isinstance(r, Text))
    return console.file.getvalue()


def _verdict(result: CheckResult, case: str, metric: str) -> Verdict:
    (v,) = [v for v in result.verdicts if v.workload == case and v.metric == metric]
    return v


def test_a_noisy_verdict_carries_its_advice_and_the_comment_says_only_that(store, tmp_path):
    grown = make_measurement(peak=BASE + MiB)
    result = _checked(store, tmp_path, [grown, make_measurement("loader", peak=BASE)])
    v = _verdict(result, "decoder", "allocated")
    sharpen = words.sharpen(v)
    assert v.kind == "noisy" and sharpen is not None
    assert "more baseline runs (now 5 of 20)" in sharpen
    assert v.why.component == "intermediates"  # and the message says so after the advice
    assert f"; to sharpen it: {sharpen}; intermediates grew +" in words.message(v)
    assert words.message(v).endswith(words.words(v))
    # The comment's line of noise gives the advice alone, not what the message says after it.
    (line,) = [x for x in report.markdown(result).splitlines() if x.startswith("- `decoder`")]
    assert line.endswith(f"; to sharpen it: {sharpen}")
    assert v.why.runs == 5 and v.why.bound is None
    assert v.room == pytest.approx(v.threshold - v.baseline_value)


def test_a_failure_is_shown_by_its_reason_whatever_its_last_line_holds(store, tmp_path):
    oom = make_measurement(status="oom", message="Traceback\nCUDA out of memory; 2 GiB free")
    result = _checked(store, tmp_path, [oom, make_measurement("loader", peak=BASE)])
    v = _verdict(result, "decoder", "status")
    assert (v.kind, v.blocking) == ("failed", True)
    assert words.failure(v) == "oom (CUDA out of memory; 2 GiB free)"
    assert words.message(v) == f"status: {words.failure(v)}; {words.words(v)}"
    md = report.markdown(result)
    # the reason whole, cut only to its room: 40 characters in the outcome, 24 in the table
    assert md.startswith(
        "### ❌ memtrack: blocked by `decoder` failed (oom (CUDA out of memory; 2 GiB free))"
    )
    assert "| status | - | oom (CUDA out of memory; | - | - |" in md


def test_the_renderers_show_one_row_model_in_one_order(store, tmp_path):
    grown = make_measurement(peak=BASE + MiB)
    loader = make_measurement("loader", peak=BASE + 20 * MiB)  # a steady case that grew
    result = _checked(store, tmp_path, [grown, loader])
    s = check_rows(result)
    assert [r.verdict.kind for r in s.listed] == ["regression"]
    assert [r.verdict.case_id for r in s.rows if r.hint] == ["loader[batch=1]"]
    assert {r.verdict.kind for r in s.noisy} == {"noisy"}
    data = report.to_json(result)
    assert [(v["case_id"], v["metric"]) for v in data["verdicts"]] == [
        (r.verdict.case_id, r.verdict.metric) for r in s.rows
    ]
    text = _terminal(result)
    counted = ", ".join(f"{n} {k}" for k, n in [("noisy", 1), ("ok", len(s.rows) - 2)])
    assert f"{counted}: not in the table; each has its line below" in text
    md = report.markdown(result)
    assert f"Not listed: 〰️ 1 noisy · ✅ {len(s.rows) - 2} ok." in md
    assert md.count("memtrack snapshot 'loader[batch=1]'") == 1
    assert text.count("memtrack snapshot 'loader[batch=1]'") == 1


def test_a_kind_is_declared_once_and_every_renderer_reads_it():
    # the order, whether it can block, the mark and the word: one table, in memtrack.judge
    from memtrack.report.rows import EMOJI, ORDER, QUIET, WORD

    assert set(KINDS) == set(ORDER) == set(EMOJI) == set(WORD)
    assert {k for k, kind in KINDS.items() if kind.blocks} == {
        "failed",
        "over_budget",
        "regression",
        "leak",
        "quality",
    }
    assert set(QUIET) == {"noisy", "accepted", "abstained", "new", "improvement", "ok"}


def test_the_json_report_holds_each_verdict_flat_with_its_message(store, tmp_path):
    result = _checked(store, tmp_path, [make_measurement(peak=BASE + MiB)])
    data = report.to_json(result)
    assert data["report_version"] == 2
    for v, flat in zip(check_rows(result).rows, data["verdicts"], strict=True):
        assert flat["message"] == words.message(v.verdict)
        assert (flat["kind"], flat["blocking"], flat["threshold"]) == (
            v.verdict.kind,
            v.verdict.blocking,
            v.verdict.threshold,
        )
    grown = next(v for v in data["verdicts"] if v["metric"] == "allocated")
    assert grown["noise"] > 0 and grown["factor"] == 3 and grown["noise_runs"] == 5


def test_each_mark_and_column_means_one_thing(store, tmp_path):
    """Two steady cases grow and block; a young case (two runs) grows 1 %, a provisional
    regression that warns. The table marks the two apart and its legend says what each
    does; its threshold column says what the terminal's says (the growth allowed over the
    baseline); the outcome counts the other blocking verdicts apart from what grew."""
    for i in range(5):
        steady = [make_measurement(w, {"batch": 1}, peak=BASE) for w in ("loader", "encoder")]
        young = [make_measurement("young", {"batch": 1}, peak=BASE)] if i >= 3 else []
        _record(store, [*steady, *young], i)
    grown = [
        make_measurement("loader", {"batch": 1}, peak=BASE + 20 * MiB),
        make_measurement("encoder", {"batch": 1}, peak=BASE + 5 * MiB),
        make_measurement("young", {"batch": 1}, peak=BASE + MiB),
    ]
    pr = _record(store, grown, 30, branch="pr")
    result = check(store, Config(path=None, root=tmp_path), run_id=pr)
    young = _verdict(result, "young", "allocated")
    assert (young.kind, young.blocking, young.provisional) == ("regression", False, True)
    md = report.markdown(result)
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| | case | metric | baseline | candidate | delta | threshold |"
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| 🔺", "| 🔺", "| 🔸"], md
    assert rows[-1].endswith("| +1.00 MiB (+1.0%) | +512 B |")  # baseline + headroom
    assert "🔺 regression: blocks · 🔸 provisional regression: warns" in md
    assert md.startswith(
        "### ❌ memtrack: blocked by `encoder` allocated +5.00 MiB (+5.0%), intermediates "
        "grew; 1 more verdict blocks"
    )
    # the terminal's threshold column says the same: the growth allowed over the baseline
    text = _terminal(result)
    cells = [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in text.splitlines()
        if line.startswith("│")
    ]
    assert [c[4] for c in cells] == ["+512 B"] * 3 and cells[2][0] == "warn regression"


def test_a_case_that_is_its_own_reference_is_not_said_to_be_at_full_precision():
    """A case without a dtype param is its own reference, whatever dtype its tensors hold
    (a bf16 model says so in its notes): the quality table does not call it full precision."""
    from memtrack.report.rows import quality_rows

    v = Verdict(
        case_id="gpt[batch=1]",
        workload="gpt",
        metric="quality",
        kind="ok",
        blocking=False,
        why=Quality("ok", "gpt[batch=1]", None, None, "max abs 0"),
    )
    result = CheckResult(
        run_id="r" * 32,
        commit=None,
        branch=None,
        started_at="2026-01-01T00:00:00+00:00",
        fingerprint="f",
        base_branch="main",
        merge_base=None,
        baseline_mode="time",
        verdicts=(v,),
    )
    ((_, cells),) = quality_rows(result)
    assert cells[1:5] == ("itself", "-", "-", "(its own reference)")
