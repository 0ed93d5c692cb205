"""How sharp and how fast is `memtrack check`? Prints five figures:

1. false blocks: real runs of every shipped case (concurrency included) on one unchanged
   commit, either re-run here (`--reruns N`) or read from recorded reruns (`--records
   FILE`, by default tests/data/reruns.json.gz). From them, a thousand histories of the
   base branch are resampled per case (each distinct real runs in a random order, of every
   length from 1 to 20 runs: a young project as well as a mature one), and one more real
   run is judged against each, per metric, as the gate judges a pull request. Goal: 0
   blocked.
2. detection: into the candidate of such histories (20 runs each) a growth is injected per
   metric (allocated: every iteration's peak; host: the whole case's peak; host_step: the
   step's peak above its starting level; load_host, disk: their figure) and the smallest
   one that blocks is searched for, per case and metric: the median and the worst over the
   histories. Goals: any growth past 512 B (allocated), past 2 MiB (host_step), past the
   larger of 1 % and 4 MiB (host) blocks, on a case whose figures allow it.
3. history: `check --history` on resampled histories of 150 commits of unchanged code, per
   case and metric: steps found and creeps flagged (goal 0 each).
4. the PR comment of a pull request that grows one case by 2 MiB: its size in bytes, the
   lines and table rows above its first folded section, and (with Chromium here) the widest
   table's width and the height above the fold, drawn with GitHub's widths, for the
   shipped suite and a 50-case suite.
5. speed: a database with 1,000,000 measurement rows (20,000 recorded commits of a
   50-case suite, on a real 20,000-commit git history) is made here, and `memtrack check`
   is timed as a user runs it (a fresh process, default options). Goal: under 0.5 s.

    python scripts/bench_check.py                    # the recorded reruns, then the timing
    python scripts/bench_check.py --reruns 30 --save reruns.json.gz   # re-run, keep them
    python scripts/bench_check.py --histories 1000 -k decoder_serve
    python scripts/bench_check.py --skip-reruns      # only the 1,000,000-row timing
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from factories import (  # noqa: E402
    CPU_ENV,
    GIT_ENV,
    RERUNS,
    make_measurement,
    make_run,
)

from memtrack.config import Config, load_config  # noqa: E402
from memtrack.judge.check import check  # noqa: E402
from memtrack.judge.evidence import Point  # noqa: E402
from memtrack.judge.history import judge_series  # noqa: E402
from memtrack.judge.load import Load  # noqa: E402
from memtrack.judge.memory import Candidate, verdict  # noqa: E402
from memtrack.records import (  # noqa: E402
    Measurement,
    RunRecord,
    metrics,  # noqa: E402
    read_json,
    run_from_dict,
    to_dict,
)
from memtrack.store.database import Store  # noqa: E402
from memtrack.units import format_size  # noqa: E402

MiB = 2**20
MEMTRACK = [sys.executable, "-c", "from memtrack.cli import main; main()"]
RECORDS = [RERUNS]  # every shipped case
PR_RUN = "e" * 32
"""The pull request's run in the comment's history."""


def _git(repo: Path, *args: str, **kw) -> str:
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        **kw,
    )
    return out.stdout.strip()


# -- 1, 2 and 3: real re-runs ------------------------------------------------------------

GROWN = {"allocated", "host", "host_step", "load_host", "disk"}
"""Metrics a growth can be injected into (the CPU measures no reserved or device view)."""


def _drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def rerun_suite(work: Path, reruns: int, patterns: list[str], drop: bool) -> list[RunRecord]:
    """One run after another (a dropped cache must not hit a run half-way)."""
    repo = work / "suite"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "memtrack.toml").write_text('modules = ["memtrack.examples"]\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the unchanged commit")
    records = work / "records"
    records.mkdir()
    k = [a for p in patterns for a in ("-k", p)]
    t0 = time.perf_counter()
    for i in range(reruns):
        if drop and i % 2:
            _drop_page_cache()
        subprocess.run(
            [*MEMTRACK, "run", "--no-db", "--json", str(records / f"{i:03d}.json"), *k],
            cwd=repo,
            check=True,
            capture_output=True,
        )
        if (i + 1) % 5 == 0:
            print(f"  {i + 1}/{reruns} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return [read_json(p) for p in sorted(records.glob("*.json"))]


def load_records(path: Path) -> tuple[list[RunRecord], str]:
    """Recorded reruns: a gzipped JSON object {"how": ..., "records": [run records]}."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return [
        run_from_dict(r, where=f"{path}: record {i}") for i, r in enumerate(data["records"])
    ], data.get("how", "")


def save_records(path: Path, runs: list[RunRecord], how: str) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"how": how, "records": [to_dict(r) for r in runs]}, f, sort_keys=True)


def by_case(runs: list[RunRecord], patterns: list[str]) -> dict[str, list[tuple]]:
    """Case id -> its (run, measurement) pairs, ok ones only, in recording order."""
    out: dict[str, list[tuple]] = {}
    for r in runs:
        for m in r.measurements:
            if m.status == "ok" and (not patterns or any(p in m.case_id for p in patterns)):
                out.setdefault(m.case_id, []).append((r, m))
    return out


def _point(run, m: Measurement, i: int, fingerprint: str = "env") -> Point:
    values = {name: v for name in metrics.NAMES if (v := metrics.value(m, name)) is not None}
    parts = {
        name: getattr(m, col)
        for name, col in metrics.COMPONENTS.items()
        if getattr(m, col, None) is not None
    }
    # Each draw is a run of its own: a run id and a time of its own, in history order.
    return Point(
        f"{run.run_id}-{i}",
        run.git.commit,
        f"2026-01-01T00:00:{i:02d}",
        None,
        m.status,
        values,
        m.iteration_times_s,
        parts,
        m.allocated_samples,
        fingerprint,
        m.retained_samples,
        m.iteration_cpu_times_s,
        m.iteration_device_times_s,
        Load.of(m),
    )


def _judge(config: Config, m: Measurement, base: list[tuple], before: list | None = None) -> dict:
    """Verdicts per measured metric of `m` against the baseline (run, measurement) pairs,
    oldest first; `before`: the pairs of an older environment, whose noise the gate knows."""
    points = [_point(r, b, i) for i, (r, b) in enumerate(base)][::-1]  # newest first
    known = [_point(r, b, i, "older") for i, (r, b) in enumerate(before or [])][::-1]
    c = Candidate(m, points, known=known)
    return {
        metric: verdict(c, metric, config)
        for metric in metrics.NAMES
        if metrics.value(m, metric) is not None
    }


def _histories(pairs: list, rng: random.Random, count: int, size: int | None = None):
    """`count` (baseline, candidate) draws: each an ordered sample of distinct real runs
    (sizes 1..20 in turn, capped by the runs there are), the candidate another one. A
    sample with replacement would repeat one run's exact figures, which two real runs of
    a noisy figure never do."""
    for h in range(count):
        n = min(size or 1 + h % 20, len(pairs) - 1)
        drawn = rng.sample(pairs, n + 1)
        yield drawn[:-1], drawn[-1][1]


def false_blocks(
    config: Config, cases: dict[str, list], histories: int, seed: int
) -> tuple[list[dict], list[str]]:
    rng = random.Random(seed)
    rows: list[dict] = []
    reasons: list[str] = []
    for case_id, pairs in cases.items():
        counts: dict[str, dict[str, int]] = {}
        for base, m in _histories(pairs, rng, histories):
            for metric, v in _judge(config, m, base).items():
                if v is None:
                    continue
                c = counts.setdefault(metric, {"judged": 0, "blocked": 0, "noisy": 0})
                c["judged"] += 1
                c["noisy"] += v.kind == "noisy"
                if v.blocking:
                    c["blocked"] += 1
                    if len(reasons) < 12:
                        shown = ", ".join(
                            f"{(metrics.value(b, metric) or 0) / MiB:.2f}" for _, b in base
                        )
                        reasons.append(
                            f"{case_id} {metric} ({len(base)} runs: {shown} MiB, "
                            f"oldest first): {v.message}"
                        )
        rows += [{"case": case_id, "metric": k, **c} for k, c in counts.items()]
    return rows, reasons


def _inject(m: Measurement, metric: str, delta: int) -> Measurement:
    if metric == "allocated":
        # a growth of the step moves every view of it: each iteration's peak, and with
        # concurrent sessions one session's own and their sum
        return replace(
            m,
            peak_allocated_bytes=(m.peak_allocated_bytes or 0) + delta,
            allocated_samples=tuple(s + delta for s in m.allocated_samples),
            session_peak_bytes=None
            if m.session_peak_bytes is None
            else m.session_peak_bytes + delta,
            sessions_sum_bytes=None
            if m.sessions_sum_bytes is None
            else m.sessions_sum_bytes + delta,
        )
    if metric == "host":
        return replace(m, host_peak_rss_bytes=(m.host_peak_rss_bytes or 0) + delta)
    if metric == "host_step":
        return replace(m, host_step_peak_rss_bytes=(m.host_step_peak_rss_bytes or 0) + delta)
    if metric == "load_host":
        return replace(m, load_host_peak_rss_bytes=(m.load_host_peak_rss_bytes or 0) + delta)
    return replace(m, disk_bytes=(m.disk_bytes or 0) + delta)


def _blocks(verdicts: dict, metric: str) -> bool:
    """Whether a growth of `metric` blocks: its verdict, or for the allocated view of a
    concurrent case the sum of its sessions (the same step, seen without its interleaving)."""
    seen = [verdicts.get(metric)] + ([verdicts.get("sessions")] if metric == "allocated" else [])
    return any(v is not None and v.blocking for v in seen)


def detection(config: Config, cases: dict[str, list], histories: int, seed: int) -> list[dict]:
    """Per case and metric: the smallest injected growth that blocks, over `histories`
    resampled baselines of 20 runs (median and worst)."""
    rng = random.Random(seed + 1)
    out = []
    for case_id, pairs in cases.items():
        drawn = list(_histories(pairs, rng, histories, size=20))
        for metric in sorted(GROWN):
            if metrics.value(pairs[0][1], metric) is None:
                continue
            found: list[int | None] = []
            for base, m in drawn:

                def blocks(delta: int, m=m, base=base, metric=metric) -> bool:
                    return _blocks(_judge(config, _inject(m, metric, delta), base), metric)

                lo, hi = 0, 1 << 30  # lo never blocks, hi does
                if not blocks(hi):
                    found.append(None)
                    continue
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if blocks(mid) else (mid, hi)
                found.append(hi)
            value = statistics.median(metrics.value(m, metric) or 0 for _, m in pairs)
            goal = {"allocated": 512, "host_step": 2 * MiB, "disk": 4096}.get(
                metric, max(int(value) // 100, 4 * MiB)
            )
            caught = [f for f in found if f is not None]
            out.append(
                {
                    "case": case_id,
                    "metric": metric,
                    "value": value,
                    "median": statistics.median(caught) if caught else None,
                    "worst": None if len(caught) < len(found) else max(caught),
                    "goal": goal,
                }
            )
    return out


MESSY = ("revert", "second cycle", "accepted step", "environment change")
"""The histories real teams make, each around a growth of the case (see `messy`)."""


def _growth(m: Measurement, metric: str) -> int:
    """The regression a messy history merges, reverts or accepts: 15 % of the figure (past
    the 10 % a provisional verdict needs), and at least four times its floor (a figure
    under its floor's reach is no regression)."""
    value = metrics.value(m, metric) or 0
    return max(int(0.15 * value), int(4 * metrics.floor(metric, value)))


def messy(config: Config, cases: dict[str, list], histories: int, seed: int) -> list[dict]:
    """Per case and metric, over `histories` histories of 5 to 20 distinct real runs in
    random order, each with one growth of the case (`_growth`) at a random place:

    - revert: one run of main at +growth, then the runs after it back at the old level;
    - second cycle: two such runs (a merge and revert, twice);
    - accepted step: every run from a place on at +growth (a change accepted and merged);
    - environment change: the history's runs on an older environment, then one to three
      runs of the new one (host moved by 6 MiB, as a torch upgrade moved it).

    An unchanged candidate judged against each must pass (a false block otherwise); the
    same candidate re-landing the growth (on top of the accepted step's level, or on the
    new environment) must block (a miss otherwise), where the same growth blocks against the
    same runs without the mess (the control: a growth the gate cannot see on a clean
    history is no history's fault)."""
    rng = random.Random(seed + 3)
    out = []
    for case_id, pairs in cases.items():
        for metric in sorted(GROWN):
            if metrics.value(pairs[0][1], metric) is None:
                continue
            counts = {k: [0, 0, 0, 0] for k in MESSY}  # judged, false blocks, misses, control
            for h in range(histories):
                n = min(5 + h % 16, len(pairs) - 1)
                drawn = rng.sample(pairs, n + 1)
                base, m = drawn[:-1], drawn[-1][1]
                delta = _growth(m, metric)
                grown = _inject(m, metric, delta)

                def up(pair: tuple, d: int = delta, metric: str = metric) -> tuple:
                    return (pair[0], _inject(pair[1], metric, d))

                def blocks(
                    cand: Measurement, hist: list, before: list | None = None, metric: str = metric
                ) -> bool:
                    return _blocks(_judge(config, cand, hist, before), metric)

                control = blocks(grown, base)
                at = rng.randrange(3, n - 1)
                second = rng.randrange(at + 2, n - 1) if at + 2 < n - 1 else None
                scenes = {
                    "revert": ([*base[:at], up(base[at]), *base[at + 1 :]], m, grown, None),
                    "second cycle": (
                        [up(p) if i == at or i == second else p for i, p in enumerate(base)],
                        m,
                        grown,
                        None,
                    ),
                    "accepted step": (
                        [*base[:at], *(up(p) for p in base[at:])],
                        grown,
                        _inject(grown, metric, delta),
                        None,
                    ),
                }
                moved = min(3, max(1, n - at))
                if metric in ("host", "load_host"):
                    shift = 6 * MiB
                    new_env = [up(p, shift) for p in base[-moved:]]
                    same, again = _inject(m, metric, shift), _inject(grown, metric, shift)
                else:
                    new_env, same, again = base[-moved:], m, grown
                scenes["environment change"] = (new_env, same, again, base[:-moved])
                for name, (hist, unchanged, relanded, before) in scenes.items():
                    c = counts[name]
                    c[0] += 1
                    c[1] += blocks(unchanged, hist, before)
                    if control:
                        c[3] += 1
                        c[2] += not blocks(relanded, hist, before)
            for name, (judged, false, missed, control) in counts.items():
                out.append(
                    {
                        "case": case_id,
                        "metric": metric,
                        "history": name,
                        "judged": judged,
                        "false": false,
                        "missed": missed,
                        "control": control,
                    }
                )
    return out


def history_false(
    config: Config, cases: dict[str, list], histories: int, commits: int, seed: int
) -> list[dict]:
    """Steps and flagged creeps that `check --history` reports on resampled histories of
    unchanged code (`commits` runs each), per case and metric."""
    rng = random.Random(seed + 2)
    out = []
    for case_id, pairs in cases.items():
        counts: dict[str, list[int]] = {}
        for _ in range(histories):
            # 150 commits from fewer real runs: whole shuffles of them, end to end.
            draws: list[Measurement] = []
            while len(draws) < commits:
                draws += [m for _, m in rng.sample(pairs, len(pairs))]
            draws = draws[:commits]
            for metric in metrics.NAMES:
                values = [metrics.value(m, metric) for m in draws]
                if any(v is None for v in values):
                    continue
                found = judge_series(
                    [float(v or 0) for v in values],
                    metric,
                    config,
                    anchor_index=max(0, commits - 1 - 50),
                    samples=[m.allocated_samples for m in draws],
                )
                c = counts.setdefault(metric, [0, 0, 0])
                c[0] += 1
                c[1] += len(found.starts)
                c[2] += int(found.creep is not None and found.creep.flagged)
        out += [
            {"case": case_id, "metric": k, "histories": c[0], "steps": c[1], "creeps": c[2]}
            for k, c in counts.items()
        ]
    return out


def _label(case_id: str, labels: dict[str, str]) -> str:
    return labels.get(case_id, case_id)[:34]


def report_reruns(config: Config, runs: list[RunRecord], how: str, args) -> None:
    from memtrack.workload.registry import short_case_labels

    cases = by_case(runs, args.patterns)
    labels = short_case_labels(cases)
    sizes = ", ".join(f"{_label(c, labels)} {len(p)}" for c, p in cases.items())
    print(f"real runs: {how} ({sizes} runs per case)")
    rows, reasons = false_blocks(config, cases, args.histories, args.seed)
    total = sum(r["blocked"] for r in rows)
    print(
        f"1. false blocks: {args.histories} resampled histories per case (1-20 distinct "
        f"real runs each, in random order), one more run judged against each "
        f"(goal 0): {total} blocked of {sum(r['judged'] for r in rows):,} verdicts"
    )
    for r in rows:
        print(
            f"  {_label(r['case'], labels):34} {r['metric']:9} {r['blocked']:4} blocked of "
            f"{r['judged']:5} ({r['noisy']} said noisy)"
        )
    for line in reasons:
        print(f"    {line}")
    print(
        f"2. detection: the smallest injected growth that blocks, over {args.bases} "
        "resampled 20-run baselines per case (median, worst)"
    )
    for r in detection(config, cases, args.bases, args.seed):

        def shown(x):
            return "not caught" if x is None else f"{format_size(int(x))}"

        worst = r["worst"]
        met = (
            "met"
            if worst is not None and worst <= r["goal"] + 1
            else "within 25%"
            if worst is not None and worst <= 1.25 * r["goal"]
            else "NOT met"
        )
        print(
            f"  {_label(r['case'], labels):34} {r['metric']:9} figure "
            f"{format_size(int(r['value'])):>11}: median {shown(r['median']):>11}, worst "
            f"{shown(worst):>11} ({100 * (worst or 0) / max(r['value'], 1):.2f}%)  goal "
            f"{format_size(r['goal'])}: {met}"
        )
    rows = messy(config, cases, args.messy, args.seed)
    print(
        f"2b. messy histories: {args.messy} histories of 5-20 real runs per case, metric and "
        "kind, each around one growth (15 %, at least 4 x the floor): an unchanged candidate "
        "must pass, the growth re-landed must block wherever it blocks on the same runs "
        f"without the mess: {sum(r['false'] for r in rows)} false blocks, "
        f"{sum(r['missed'] for r in rows)} missed of {sum(r['control'] for r in rows):,} "
        "re-landed growths"
    )
    for name in MESSY:
        mine = [r for r in rows if r["history"] == name]
        print(
            f"  {name:19} {sum(r['false'] for r in mine):4} false blocks of "
            f"{sum(r['judged'] for r in mine):5}, {sum(r['missed'] for r in mine):4} missed of "
            f"{sum(r['control'] for r in mine):5} re-landed"
        )
    for r in rows:
        if r["false"] or r["missed"]:
            print(
                f"    {_label(r['case'], labels):34} {r['metric']:9} {r['history']}: "
                f"{r['false']} false, {r['missed']} missed of {r['control']}"
            )
    rows = history_false(config, cases, args.history_runs, 150, args.seed)
    print(
        f"3. history: `check --history` on {args.history_runs} resampled histories of 150 "
        "commits of unchanged code per case: steps found and creeps flagged (goal 0)"
    )
    for r in rows:
        print(
            f"  {_label(r['case'], labels):34} {r['metric']:9} {r['steps']:3} steps, "
            f"{r['creeps']:3} creeps over {r['histories']} histories"
        )


# -- 2c: histories recorded out of commit order ------------------------------------------

ORDER_COMMITS = 12
"""Main commits of each out-of-order history."""


def _suite_of(cases: dict[str, list], rng: random.Random) -> list[Measurement]:
    """One run of every case: a real measurement of each, drawn."""
    return [rng.choice(pairs)[1] for pairs in cases.values()]


def out_of_order(cases: dict[str, list], histories: int, seed: int, work: Path) -> dict:
    """`check` (store and git, as a user runs it) of a pull request against histories of
    ORDER_COMMITS main commits, one of which merged a step (every case's allocated view up
    by 15 %), whose runs are recorded out of commit order: each commit's run, then re-runs
    of commits before the step (at the old level) started last, as a re-run job or a queued
    runner records them. An unchanged candidate (at main's level) must pass (false blocks);
    one that grows every case by 15 % more must block each (misses), as it does against
    the same runs recorded in order."""
    from memtrack.records import GitInfo

    repo = work / "order"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(ORDER_COMMITS):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    heads = []
    for name in ("unchanged", "grown"):  # two pull requests off main's newest commit
        _git(repo, "checkout", "-q", "-b", name, shas[-1])
        (repo / "f").write_text(name)
        _git(repo, "commit", "-q", "-am", f"the {name} pull request")
        heads.append(_git(repo, "rev-parse", "HEAD"))
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    config = load_config(repo / "memtrack.toml")
    rng = random.Random(seed + 4)
    counts = {"judged": 0, "false": 0, "missed": 0, "control": 0, "reruns": 0}
    # one growth per case (a change adds the same bytes to every run of it)
    step = {case: _growth(pairs[0][1], "allocated") for case, pairs in cases.items()}

    def stepped(ms: list[Measurement]) -> list[Measurement]:
        return [_inject(m, "allocated", step[m.case_id]) for m in ms]

    for h in range(histories):
        at = rng.randrange(3, ORDER_COMMITS - 2)  # a step merged at this commit
        suites = [_suite_of(cases, rng) for _ in shas]
        suites = [stepped(ms) if i >= at else ms for i, ms in enumerate(suites)]
        late = rng.sample(range(at), k=min(at, rng.randint(1, 3)))  # older than the step
        order = [(i, suites[i]) for i in range(ORDER_COMMITS)]
        order += [(i, _suite_of(cases, rng)) for i in late]  # re-runs, started last
        counts["reruns"] += len(late)
        cand = stepped(_suite_of(cases, rng))  # unchanged: at main's level
        grown = stepped(cand)
        for shuffled in (True, False):
            db = work / f"order-{h}-{shuffled}.db"
            with Store.open(db) as store:
                recorded = order if shuffled else sorted(order, key=lambda x: x[0])
                for minute, (i, ms) in enumerate(recorded):
                    when = f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}:00+00:00"
                    run = make_run(ms, commit=shas[i], started_at=when)
                    store.write_run(replace(run, git=replace(run.git, merge_base=shas[i])))
                for k, (ms, head) in enumerate(zip((cand, grown), heads, strict=True)):
                    git = GitInfo(
                        commit=head,
                        branch="pr",
                        parent=shas[-1],
                        dirty=False,
                        base_branch="main",
                        merge_base=shas[-1],
                    )
                    run = make_run(ms, commit=head, started_at=f"2026-01-02T00:0{k}:00Z")
                    store.write_run(replace(run, git=git))
                    result = check(store, config, run_id=run.run_id, root=repo)
                    blocked = {v.case_id for v in result.blocking if v.metric == "allocated"}
                    if k == 0 and shuffled:
                        counts["judged"] += len(cand)
                        counts["false"] += len(result.blocking)
                    elif k == 1:
                        key = "missed" if shuffled else "control"
                        counts[key] += len(cand) - len(blocked)
    return counts


def report_out_of_order(cases: dict[str, list], args, work: Path) -> None:
    c = out_of_order(cases, args.out_of_order, args.seed, work)
    print(
        f"2c. histories recorded out of commit order: {args.out_of_order} histories of "
        f"{ORDER_COMMITS} main commits and a step, {c['reruns']} re-runs of commits before the "
        "step recorded last, "
        f"every case judged by `check` (store and git): {c['false']} false blocks of "
        f"{c['judged']:,} verdicts of an unchanged pull request; a 15 % growth of every case's "
        f"allocated view: {c['missed']} missed (in commit order: {c['control']} missed)"
    )


# -- 4: the PR comment ---------------------------------------------------------------------

GITHUB_CSS = """
body { width: 760px; margin: 0; font-family: -apple-system, "Segoe UI", "Noto Sans",
       Helvetica, Arial, sans-serif; font-size: 14px; line-height: 1.5; }
table { border-spacing: 0; border-collapse: collapse; display: block; width: max-content;
        max-width: 100%; overflow: auto; }
td, th { padding: 6px 13px; border: 1px solid #d1d9e0; }
h3 { font-size: 1.25em; } code { font-size: 85%; padding: .2em .4em; }
"""
"""GitHub's Markdown styles that set a comment's width (its tables scroll past the body,
which is about 760 px wide in a pull request's conversation on a laptop screen)."""


def shipped_suite(runs: list[RunRecord]) -> list[RunRecord]:
    """Runs of the whole shipped suite: each recorded run of the suite, with the cases it
    lacks (recorded apart, in later reruns of those cases alone) taken from the next of
    those reruns, in order."""
    widest = max(len(r.measurements) for r in runs)
    suite = [r for r in runs if len(r.measurements) == widest]
    held = {m.case_id for m in suite[0].measurements}
    apart = [r for r in runs if not held & {m.case_id for m in r.measurements}]
    return [
        replace(r, measurements=r.measurements + (apart[i].measurements if i < len(apart) else ()))
        for i, r in enumerate(suite)
    ]


def comment_result(runs: list[RunRecord], work: Path, cases: int | None = None):
    """`memtrack check` of a pull request that grows one case's KV cache by 2 MiB, against
    20 real runs of the shipped suite on main (or, with `cases`, a made-up suite of that
    many cases, each with host and time figures)."""
    db = work / f"comment-{cases or 'shipped'}.db"
    config = Config(path=None, root=work, dashboard_url="https://memtrack.example.org")
    if cases is None:
        base = shipped_suite(runs)[:20]
    else:
        names = [
            (f"w{c // 5:02d}", {"batch": 2 ** (c % 5), "dtype": "float32"}) for c in range(cases)
        ]
        base = [
            make_run(
                [
                    make_measurement(
                        w,
                        p,
                        peak=(c + 1) * 10 * MiB,
                        host=400 * MiB + ((i * 7 + c) % 5) * 256 * 1024,
                    )
                    for c, (w, p) in enumerate(names)
                ]
            )
            for i in range(20)
        ]
    with Store.open(db) as store:
        for i, r in enumerate(base):
            store.write_run(
                replace(
                    r,
                    run_id=f"{i:032x}",  # run ids are 32 hex digits, as records hold them
                    started_at=f"2026-01-01T00:{i:02d}:00+00:00",
                    finished_at=f"2026-01-01T00:{i:02d}:30+00:00",
                    git=replace(
                        r.git, commit=f"{i:02d}" + "a" * 38, branch="main", subject=f"main {i}"
                    ),
                )
            )
        cand = base[-1]
        grown = list(cand.measurements)
        m = (
            next((x for x in grown if "sessions=4" in x.case_id), grown[0])
            if cases is None
            else grown[len(grown) // 2]
        )
        grown[grown.index(m)] = replace(
            m,
            peak_allocated_bytes=(m.peak_allocated_bytes or 0) + 2 * MiB,
            allocated_samples=tuple(x + 2 * MiB for x in m.allocated_samples),
            caches_bytes=(m.caches_bytes or 0) + 2 * MiB,
        )
        store.write_run(
            replace(
                cand,
                run_id=PR_RUN,
                started_at="2026-01-01T01:00:00+00:00",
                finished_at="2026-01-01T01:00:30+00:00",
                measurements=tuple(grown),
                git=replace(
                    cand.git,
                    commit="f" * 40,
                    branch="feature",
                    merge_base="19" + "a" * 38,
                    subject="grow the cache",
                ),
            )
        )
        result = check(store, config, run_id=PR_RUN, root=work)
    from memtrack.report import check as report

    return result, report.markdown(result, dashboard_url=config.dashboard_url)


def rendered(md: str) -> dict | None:
    """The comment drawn in Chromium with GitHub's widths: the widest table's width and
    the height above the first folded section, px; None without a browser here."""
    try:
        import markdown as mdlib
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path("/usr/bin/chromium").exists():
        return None
    html = mdlib.markdown(md, extensions=["tables"])
    page_html = (
        f"<!DOCTYPE html><html><head><style>{GITHUB_CSS}</style></head><body>{html}</body></html>"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_content(page_html)
        out = page.evaluate("""() => {
            const tables = [...document.querySelectorAll('table')];
            const natural = tables.map(t => {
                t.style.maxWidth = 'none';
                const w = t.scrollWidth;
                t.style.maxWidth = '';
                return w;
            });
            const line = parseFloat(getComputedStyle(document.body).lineHeight);
            const wrapped = tables.flatMap(t => [...t.querySelectorAll('tbody tr')])
                .filter(r => r.getBoundingClientRect().height > 2 * line).length;
            const d = document.querySelector('details');
            return {table: Math.max(0, ...natural), wrapped: wrapped,
                    fold: d ? d.getBoundingClientRect().top : document.body.scrollHeight,
                    body: document.body.clientWidth};
        }""")
        browser.close()
    return out


def comment_size(runs: list[RunRecord], work: Path) -> None:
    print(
        "4. the PR comment of a pull request that grows one case by 2 MiB (one block): "
        "size, and what shows above the first folded section"
    )
    for what, cases in (("shipped suite", None), ("50-case suite", 50)):
        result, md = comment_result(runs, work, cases)
        top = md.split("<details>", 1)[0]
        rows = sum(1 for line in top.splitlines() if line.startswith("| ") and "---" not in line)
        drawn = rendered(md)
        shown = (
            f"; drawn: widest table {drawn['table']} px unwrapped, in a {drawn['body']} "
            f"px comment {drawn['wrapped']} of its rows wrap; {drawn['fold']:.0f} px "
            "above the fold"
            if drawn
            else ""
        )
        print(
            f"  {what}: {len(result.verdicts)} verdicts, {len(md.encode()):,} bytes, "
            f"{len(top.splitlines())} Markdown lines and {rows} table rows (1 header) "
            f"above the fold{shown}"
        )


# -- 5: the 1,000,000-row database -----------------------------------------------------


def big_history(work: Path, commits: int) -> tuple[Path, list[str], str]:
    """A linear history of `commits` commits on main, and one PR commit off the tenth
    newest, made with git fast-import (seconds, not minutes)."""
    repo = work / "big"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    t0 = 1_767_225_600
    lines = []
    for i in range(1, commits + 1):
        body = f"{i}\n"
        lines += [
            "commit refs/heads/main",
            f"mark :{i}",
            f"committer Bench <bench@example.com> {t0 + 60 * i} +0000",
            f"data {len(f'commit {i}')}",
            f"commit {i}",
        ]
        if i > 1:
            lines.append(f"from :{i - 1}")
        lines += ["M 644 inline f.txt", f"data {len(body)}", body.rstrip("\n"), ""]
    fork = commits - 10
    body = "pr\n"
    lines += [
        "commit refs/heads/feature",
        f"mark :{commits + 1}",
        f"committer Bench <bench@example.com> {t0 + 60 * (commits + 5)} +0000",
        "data 9",
        "a comment",
        f"from :{fork}",
        "M 644 inline f.txt",
        f"data {len(body)}",
        body.rstrip("\n"),
        "",
    ]
    marks = work / "marks"
    subprocess.run(
        ["git", "fast-import", "--quiet", f"--export-marks={marks}"],
        cwd=repo,
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    sha = {int(m.split()[0][1:]): m.split()[1] for m in marks.read_text().splitlines()}
    return repo, [sha[i] for i in range(1, commits + 1)], sha[commits + 1]


def big_database(work: Path, shas: list[str], pr: str, cases: int) -> tuple[Path, str, int]:
    db = work / "big.db"
    with Store.open(db) as store:  # the real schema, through the migrations
        store.write_run(make_run([make_measurement()], branch="seed"))  # the environment row
        conn = store.conn
        env_id = conn.execute("select env_id from runs").fetchone()[0]
        conn.execute("delete from measurements")
        conn.execute("delete from runs")
        names = [(f"w{c // 5}", {"batch": 2 ** (c % 5)}) for c in range(cases)]
        case_ids = [f"{w}[batch={p['batch']}]" for w, p in names]
        run_rows, m_rows = [], []
        t0 = 1_767_225_600
        for i, sha in enumerate(shas, 1):
            run_id = f"{i:032x}"  # run ids are 32 hex digits, as records hold them
            iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * i))
            started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * i + 30))
            run_rows.append(
                (
                    run_id,
                    started,
                    started,
                    started,
                    "suite",
                    1,
                    env_id,
                    CPU_ENV.fingerprint,
                    sha,
                    "main",
                    f"commit {i}",
                    iso,
                    0,
                    "main",
                    sha,
                    0,
                    "[]",
                )
            )
            for c, ((w, params), cid) in enumerate(zip(names, case_ids, strict=True)):
                peak = (c + 1) * 10 * MiB
                host = 400 * MiB + ((i * 7 + c) % 5) * 256 * 1024
                m_rows.append(
                    (
                        run_id,
                        w,
                        cid,
                        json.dumps(params),
                        0,
                        "cpu",
                        "float32",
                        1,
                        3,
                        "ok",
                        "memtracker",
                        peak,
                        f"[{peak}, {peak}, {peak}]",
                        host,
                        host,
                        host - 90 * MiB,
                        10 * MiB,
                        "[0.01, 0.0101, 0.0099]",
                        0.01,
                    )
                )
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "insert into runs (run_id, started_at, finished_at, recorded_at, suite_hash, "
            "schema_version, env_id, fingerprint, git_commit, git_branch, git_subject, "
            "git_committed_at, git_dirty, git_base_branch, git_merge_base, git_shallow, "
            "git_notes) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            run_rows,
        )
        conn.executemany(
            "insert into measurements (run_id, workload, case_id, params, seed, device, dtype, "
            "warmup, repeats, status, framework, peak_allocated_bytes, allocated_samples, "
            "host_peak_rss_bytes, host_step_peak_rss_bytes, host_bytes, host_step_bytes, "
            "iteration_times_s, time_median_s) "
            "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            m_rows,
        )
        conn.execute("COMMIT")
        candidate = make_run(
            [
                # At the history's level, as bench_check_speed's candidate: its gated
                # host figure is the history's host_bytes (peak RSS less 90 MiB).
                make_measurement(
                    w, p, peak=(c + 1) * 10 * MiB, host=310 * MiB, times=(0.01, 0.0101, 0.0099)
                )
                for c, (w, p) in enumerate(names)
            ],
            commit=pr,
            branch="feature",
            merge_base=shas[-11],
            started_at=time.strftime(
                "%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0 + 60 * (len(shas) + 6))
            ),
        )
        store.write_run(candidate)
        rows = conn.execute("select count(*) from measurements").fetchone()[0]
        conn.execute("ANALYZE")
    return db, candidate.run_id, rows


def time_check(repo: Path, db: Path, run_id: str, tries: int) -> tuple[list[float], int, str]:
    (repo / "memtrack.toml").write_text('base_branch = "main"\n')
    walls = []
    out = None
    for _ in range(tries):
        t = time.perf_counter()
        out = subprocess.run(
            [
                "memtrack",
                "check",
                "--config",
                str(repo / "memtrack.toml"),
                "--db",
                str(db),
                "--run",
                run_id,
            ],
            cwd=repo,
            capture_output=True,
            text=True,
        )
        walls.append(time.perf_counter() - t)
    assert out is not None
    return walls, out.returncode, out.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--reruns",
        type=int,
        default=0,
        help="re-run the shipped suite this many times here (default: read the recorded reruns)",
    )
    ap.add_argument(
        "--records",
        type=Path,
        action="append",
        help="recorded reruns to read (a .json.gz written by --save; repeatable; default: "
        "tests/data's, which hold every shipped case)",
    )
    ap.add_argument("--save", type=Path, help="with --reruns: write the reruns here")
    ap.add_argument(
        "--drop-cache",
        action="store_true",
        help="with --reruns: drop the page cache before every other run (root)",
    )
    ap.add_argument(
        "-k",
        dest="patterns",
        action="append",
        default=[],
        help="only cases whose id contains this (repeatable)",
    )
    ap.add_argument(
        "--histories",
        type=int,
        default=1000,
        help="resampled histories per case for the false blocks",
    )
    ap.add_argument(
        "--bases",
        type=int,
        default=40,
        help="resampled 20-run baselines per case for the detection",
    )
    ap.add_argument(
        "--messy",
        type=int,
        default=200,
        help="histories per case, metric and kind of mess (revert, accepted step, ...)",
    )
    ap.add_argument(
        "--history-runs",
        type=int,
        default=20,
        help="resampled 150-commit histories per case for `check --history`",
    )
    ap.add_argument(
        "--out-of-order",
        type=int,
        default=20,
        help="histories recorded out of commit order, each checked by `check` (0: none)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--skip-reruns", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memtrack-bench-"))
    try:
        if not args.skip_reruns:
            config = Config(path=None, root=work)
            if args.reruns:
                print(
                    f"re-running the shipped suite {args.reruns} times on one commit ...",
                    file=sys.stderr,
                )
                runs = rerun_suite(work, args.reruns, args.patterns, args.drop_cache)
                how = (
                    f"{len(runs)} runs of the shipped suite on one commit, here, one after "
                    "another"
                    + (", the page cache dropped before every other run" if args.drop_cache else "")
                )
                if args.save:
                    save_records(args.save, runs, how)
            else:
                runs, hows = [], []
                for path in args.records or RECORDS:
                    more, how = load_records(path)
                    runs += more
                    hows.append(f"{path.name}: {how}")
                how = "; ".join(hows)
            report_reruns(config, runs, how, args)
            if args.out_of_order:
                report_out_of_order(by_case(runs, args.patterns), args, work)
            comment_size(runs, work)
        if args.skip_speed:
            return 0
        print(
            f"building a history of {args.commits} commits and {args.commits * args.cases:,} "
            "measurement rows ...",
            file=sys.stderr,
        )
        t = time.perf_counter()
        repo, shas, pr = big_history(work, args.commits)
        db, run_id, rows = big_database(work, shas, pr, args.cases)
        print(f"  built in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        walls, code, last = time_check(repo, db, run_id, tries=7)
        with Store.open(db) as store:
            t = time.perf_counter()
            result = check(store, load_config(repo / "memtrack.toml"), run_id=run_id, root=repo)
            inproc = time.perf_counter() - t
        print(
            f"speed: `memtrack check` against {rows:,} measurement rows "
            f"({args.commits:,} commits x {args.cases} cases): median "
            f"{statistics.median(walls):.3f} s, best {min(walls):.3f} s wall as a fresh process "
            f"(goal < 0.5 s); the check itself {inproc:.3f} s in process; exit {code}, "
            f"{len(result.verdicts)} verdicts, baseline {result.baseline_mode} "
            f"({result.verdicts[0].baseline_runs} runs per case); last line: {last}"
        )
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
