"""The judge's decisions on data in memory: no database, no git repository. The gather step
(memtrack.judge.gather) reads the store and git; the rest of the judge decides; these tests
hand the rules what gathering would, as records and dicts, and check what they decide."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from factories import MiB, make_measurement, make_run

from memtrack.config import Config
from memtrack.judge.accept import Acceptance
from memtrack.judge.decide import accepts_open, still_open
from memtrack.judge.evidence import CheckInput, Point
from memtrack.judge.gather.baseline import eligible
from memtrack.judge.history import SeriesPoint, analyze_series, series_points
from memtrack.judge.memory import Candidate, verdict
from memtrack.judge.verdict import OpenRegression, Verdict
from memtrack.records import Measurement, metrics
from memtrack.report.words import creep as creep_words
from memtrack.report.words import message

BASE = 100 * MiB
JUDGE = Path(__file__).resolve().parents[1] / "memtrack" / "judge"


def _config(tmp_path: Path, **kw) -> Config:
    return Config(path=None, root=tmp_path, **kw)


def _point(i: int, m: Measurement) -> Point:
    """A baseline run's point as the finder makes it of a stored row."""
    return Point(
        f"run{i}",
        f"commit{i}",
        f"2026-01-01T00:{i:02d}:00+00:00",
        None,
        m.status,
        {k: x for k in metrics.NAMES if (x := metrics.value(m, k)) is not None},
        m.iteration_times_s,
        samples=m.allocated_samples,
        fingerprint="cpu",
    )


def test_the_judge_holds_no_sql():
    # Every statement is the store's (memtrack.store.judging): the judge asks, and decides.
    for path in sorted(JUDGE.rglob("*.py")):
        text = path.read_text()
        found = re.findall(r"\.execute(?:many)?\(|\.conn\b|\bsqlite3\b|BEGIN IMMEDIATE", text)
        assert found == [], path.name


def test_only_the_gather_step_reads_the_store_or_runs_git():
    # The rules decide on what was gathered: no module of the judge but the gather step
    # imports the store, or runs git (or any process).
    import ast

    reaching = ("memtrack.store", "memtrack.machine.provenance", "subprocess", "git")
    for path in sorted(JUDGE.rglob("*.py")):
        if "gather" in path.relative_to(JUDGE).parts:
            continue
        tree = ast.parse(path.read_text())
        typing_only = {  # `if TYPE_CHECKING:` imports read nothing at run time
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
            for n in ast.walk(block)
        }
        imported = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        assert not [m for m in imported if m.startswith(reaching)], path.name


def test_a_growth_past_the_threshold_is_a_regression_on_points_in_memory(tmp_path):
    points = [_point(i, make_measurement(peak=BASE)) for i in range(3, 0, -1)]  # newest first
    grown = make_measurement(peak=BASE + MiB)
    v = verdict(Candidate(grown, points), "allocated", _config(tmp_path))
    assert v is not None and (v.kind, v.blocking) == ("regression", True)
    assert (v.baseline_value, v.threshold, v.delta, v.baseline_runs) == (BASE, BASE + 512, MiB, 3)
    same = verdict(Candidate(make_measurement(peak=BASE), points), "allocated", _config(tmp_path))
    assert same is not None and (same.kind, same.blocking) == ("ok", False)


def test_a_baseline_run_is_eligible_by_ancestry_else_by_time():
    row = {
        "git_commit": "a" * 40,
        "git_committed_at": "2026-01-01T00:10:00+00:00",
        "started_at": "2026-01-01T00:20:00+00:00",
    }
    at = 1767226200.0  # 2026-01-01T00:10:00Z
    # by time: its commit no newer than the cutoff; the run's start where the commit's is
    # not known
    assert eligible(row, cutoff=at, ancestor=None)
    assert not eligible(row, cutoff=at - 1, ancestor=None)
    undated = {**row, "git_committed_at": None}
    assert not eligible(undated, cutoff=at, ancestor=None)
    assert eligible(undated, cutoff=at + 600, ancestor=None)
    assert not eligible(row, cutoff=None, ancestor=None)  # no reference time: none
    # by ancestry: git's answer, given the commit and its time; time no longer matters
    asked = []

    def ancestor(sha: str, committed: float | None) -> bool:
        asked.append((sha, committed))
        return sha == "a" * 40

    assert eligible(row, cutoff=0.0, ancestor=ancestor)
    assert asked == [("a" * 40, at)]
    assert not eligible({**row, "git_commit": "b" * 40}, cutoff=at, ancestor=ancestor)
    assert not eligible({**row, "git_commit": None}, cutoff=at, ancestor=ancestor)


def _open(threshold: float = BASE + 512, delta: float = MiB) -> OpenRegression:
    return OpenRegression(
        "decoder[batch=1]",
        "allocated",
        "r" * 32,
        "c" * 40,
        "grow the cache",
        "2026-01-01T00:05:00+00:00",
        "cpu",
        BASE,
        threshold,
        BASE + delta,
        delta,
        100 * delta / BASE,
    )


def _ok(m: Measurement) -> Verdict:
    return Verdict(m.case_id, m.workload, "allocated", "ok", False)


def _input(run, context: str, in_history: bool = True) -> CheckInput:
    return CheckInput(
        run=run,
        base_branch="main",
        context=context,
        merge_base=None,
        baseline_mode="ancestry",
        cases=(),
        checked_at="",
        open_found=((_open(), in_history),),
    )


def test_a_regression_stays_open_until_a_base_run_is_back_within_its_threshold():
    still_high = make_measurement(peak=BASE + MiB)
    run = make_run([still_high], branch="main")
    found, notes = still_open(_input(run, "base"), [_ok(still_high)])
    assert [(o.case_id, o.fixed_here) for o in found] == [("decoder[batch=1]", False)]
    assert notes == []
    back = make_measurement(peak=BASE)
    # a run of the base branch back within it fixes it, and says so
    found, notes = still_open(_input(make_run([back]), "base"), [_ok(back)])
    assert found == [] and len(notes) == 1 and "fixed by this run" in notes[0]
    # a pull request back within it: still open on the base branch, fixed here
    pr = make_run([back], branch="pr")
    found, notes = still_open(_input(pr, "pull_request"), [_ok(back)])
    assert [o.fixed_here for o in found] == [True] and notes == []
    # a branch cut before the regression merged: not in this change, being within fixes nothing
    found, _ = still_open(_input(pr, "pull_request", in_history=False), [_ok(back)])
    assert [(o.predates, o.fixed_here) for o in found] == [(True, False)]
    # a failed case says nothing of its figures: still open, not fixed here
    failed = make_measurement(peak=BASE, status="oom")
    found, _ = still_open(_input(make_run([failed]), "base"), [_ok(failed)])
    assert [o.fixed_here for o in found] == [False]


def test_an_acceptance_that_allows_the_growth_accepts_the_open_regression():
    m = make_measurement(peak=BASE + MiB)
    run = make_run([m], branch="pr")
    allows = Acceptance("d" * 40, "decoder", "allocated", 2 * MiB, None, "a longer context")
    v = accepts_open(_ok(m), m, [_open()], [allows])
    assert (v.kind, v.blocking, v.acceptance.reason) == ("accepted", False, "a longer context")
    assert "within the +2.00 MiB accepted in commit dddddddddddd" in message(v)
    found, notes = still_open(_input(run, "pull_request"), [v])
    assert found == [] and notes == []  # accepted: closed
    # one that allows less leaves it open, and the verdict as it was
    small = replace(allows, bytes=MiB // 2)
    assert accepts_open(_ok(m), m, [_open()], [small]) == _ok(m)
    assert len(still_open(_input(run, "pull_request"), [_ok(m)])[0]) == 1
    # nor does an acceptance turn a blocking verdict into an accepted one
    blocking = replace(_ok(m), kind="regression", blocking=True)
    assert accepts_open(blocking, m, [_open()], [allows]) == blocking


def _row(commit: str, minute: int, case: str = "decoder[batch=1]", peak: int = BASE) -> dict:
    row = dict.fromkeys(metrics.COLUMNS.values())
    row.update(
        git_commit=commit,
        git_subject=f"subject of {commit}",
        started_at=f"2026-01-01T00:{minute:02d}:30+00:00",
        git_committed_at=f"2026-01-01T00:{minute:02d}:00+00:00",
        case_id=case,
        allocated_samples=f"[{peak}, {peak}]",
    )
    row[metrics.COLUMNS["allocated"]] = peak
    return row


def test_history_rows_become_series_of_commits_with_their_medians():
    rows = [
        _row("c2", 2, peak=BASE + 2 * MiB),
        _row("c1", 1),
        _row("c2", 3, peak=BASE),  # a rerun of c2: its point is the median
        _row("c1", 1, case="other[batch=1]"),
        _row("", 4),  # no commit: not a point
    ]
    notes: list[str] = []
    series = series_points(rows, "main", (), None, notes)  # no git order: by commit time
    assert sorted(series) == ["decoder[batch=1]", "other[batch=1]"]
    points = series["decoder[batch=1]"]
    assert [(p.position, p.commit, p.values["allocated"]) for p in points] == [
        (0, "c1", BASE),
        (1, "c2", BASE + MiB),
    ]
    assert points[1].samples == [[BASE + 2 * MiB] * 2, [BASE] * 2] and notes == []
    # with git's first-parent order: a commit off it is left out, and said so
    only = series_points(rows, "main", ("decoder",), {"c2": 7}, notes)
    assert [(p.position, p.commit) for p in only["decoder[batch=1]"]] == [(7, "c2")]
    assert list(only) == ["decoder[batch=1]"]
    assert notes == [
        "1 recorded commit(s) are not on the first-parent history of main (rewritten?): left out"
    ]


def test_a_series_step_and_its_growth_since_the_anchor(tmp_path):
    values = [BASE] * 6 + [BASE + 8 * MiB] * 6
    pts = [
        SeriesPoint(i, f"{i:040x}", f"commit {i}", {"allocated": float(v)}, [[v] * 3])
        for i, v in enumerate(values)
    ]
    config = _config(tmp_path)
    steps, creep = analyze_series("decoder[batch=1]", "allocated", pts, config, anchor_pos=2)
    assert [(s.commit, s.previous_commit, s.delta) for s in steps] == [
        (pts[6].commit, pts[5].commit, 8 * MiB)
    ]
    assert creep is not None and creep.flagged and creep.steps_between == 1
    assert (creep.anchor_commit, creep.latest_commit) == (pts[2].commit, pts[-1].commit)
    assert creep.delta == 8 * MiB and "1 step(s) between, the largest +8.00 MiB" in creep_words(
        creep
    )
    # no anchor: steps only; a flat series: nothing
    assert analyze_series("decoder[batch=1]", "allocated", pts, config, None)[1] is None
    flat = [replace(p, values={"allocated": float(BASE)}) for p in pts]
    steps, creep = analyze_series("decoder[batch=1]", "allocated", flat, config, anchor_pos=2)
    assert steps == [] and creep is not None and not creep.flagged and creep.delta == 0


# -- one trailer per change -----------------------------------------------------------------


def _grown(tmp_path, acceptances, grow_small=True):
    """Two cases of one workload, both grown in the allocator's view (+12 MiB) and in the
    step's host growth (+14 MiB), judged against three identical runs: the verdicts."""
    config = _config(tmp_path)
    out = []
    for batch in (1, 8):
        base = make_measurement(params={"batch": batch}, peak=BASE, host_step=20 * MiB)
        points = [_point(i, base) for i in range(3, 0, -1)]
        grown = make_measurement(params={"batch": batch}, peak=BASE + 12 * MiB, host_step=34 * MiB)
        c = Candidate(grown, points, acceptances=acceptances)
        out += [verdict(c, metric, config) for metric in ("allocated", "host_step")]
    return [v for v in out if v is not None]


def test_a_trailer_without_a_metric_accepts_every_memory_metric_of_its_cases(tmp_path):
    from memtrack.judge.accept import parse

    a = parse("d" * 40, "decoder +14 MiB one longer context, every view")
    assert (a.target, a.metric, a.bytes, a.reason) == (
        "decoder",
        None,
        14 * MiB,
        "one longer context, every view",
    )
    assert parse("d" * 40, "decoder[batch=1] +50 % relative").percent == 50.0
    # the workload's name covers both cases, and every memory metric of each
    verdicts = _grown(tmp_path, [a])
    assert [(v.case_id, v.metric, v.kind, v.blocking) for v in verdicts] == [
        ("decoder[batch=1]", "allocated", "accepted", False),
        ("decoder[batch=1]", "host_step", "accepted", False),
        ("decoder[batch=8]", "allocated", "accepted", False),
        ("decoder[batch=8]", "host_step", "accepted", False),
    ]
    assert {v.acceptance.reason for v in verdicts} == {"one longer context, every view"}
    assert {v.acceptance.commit for v in verdicts} == {"d" * 40}
    # a relative amount, for each metric against its own baseline: +12 % of 100 MiB and
    # +70 % of 20 MiB
    (relative,) = [parse("d" * 40, "decoder +70 % a longer context")]
    assert {v.kind for v in _grown(tmp_path, [relative])} == {"accepted"}


def test_a_trailer_with_a_metric_accepts_that_one_and_a_block_says_which_trailer_would(
    tmp_path,
):
    from memtrack.judge.accept import parse

    one = parse("d" * 40, "decoder allocated +12 MiB the longer context")
    verdicts = _grown(tmp_path, [one])
    kinds = {(v.case_id, v.metric): (v.kind, v.blocking) for v in verdicts}
    assert kinds[("decoder[batch=1]", "allocated")] == ("accepted", False)
    assert kinds[("decoder[batch=1]", "host_step")] == ("regression", True)
    blocked = next(v for v in verdicts if v.metric == "host_step")
    # it names the trailer that would accept it: the same, for every memory metric, with
    # the amount this growth needs
    assert blocked.would.value == "decoder +14 MiB the longer context"
    assert (
        "the Memtrack-Accept trailer of commit dddddddddddd names allocated only; "
        "`Memtrack-Accept: decoder +14 MiB the longer context` would accept this"
    ) in message(blocked)
    # a trailer that allows too little: the same metric, with enough
    small = parse("d" * 40, "decoder[batch=8] allocated +10 MiB too little")
    (v,) = [
        v
        for v in _grown(tmp_path, [small])
        if (v.case_id, v.metric) == ("decoder[batch=8]", "allocated")
    ]
    assert (v.kind, v.would.value) == (
        "regression",
        "decoder[batch=8] allocated +12 MiB too little",
    )
    assert "beyond the +10.00 MiB accepted" in message(v) and "allows +10.00 MiB" in message(v)
    # a percentage stays one, rounded up to a whole percent
    pct = parse("d" * 40, "decoder allocated +5 % not enough")
    (v,) = [v for v in _grown(tmp_path, [pct]) if v.metric == "allocated"][:1]
    assert v.would.value == "decoder allocated +12% not enough"
    # a trailer naming another case says nothing of this one
    other = parse("d" * 40, "encoder +1 GiB another workload")
    assert all(v.would is None for v in _grown(tmp_path, [other]))
