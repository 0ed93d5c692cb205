"""How often does time warn wrongly on a shared runner, and what slowdown does it catch?

Real timing passes of every shipped single-process case are recorded on one unchanged
commit, in rounds of two passes of each case one after the other (A then B, then B then A:
a paired timing's order), under
three loads: quiet, as many busy loops as cores, and twice the cores plus two (the
oversubscription of a shared 2-core runner). They are then judged by the gate's own time
verdict (memtrack.judge.timing), in thousands of draws:

- unpaired: a history of 20 passes drawn from every load (a shared runner's history; and,
  apart, from the quiet passes alone: a runner of its own), and one more pass of any load
  as the candidate, as `memtrack check` judges a pull request without a pair;
- paired: 5 rounds drawn from one load, side B the candidate, side A its reference, as
  `memtrack run --against` pairs them.

Nothing changed between A and B: every time warning is false. Goal: 0. Then the candidate's
times are multiplied by a slowdown (1.05x to 3x) and the share of draws that warn is
printed, per candidate load: the smallest slowdown that warns in 90 % of draws, paired and
unpaired. (Unpaired, a candidate timed on a contended machine abstains: it cannot warn.)

    python scripts/bench_time.py                                  # the recorded passes
    python scripts/bench_time.py --record 12 --save tests/data/time-reruns.json.gz
    python scripts/bench_time.py --draws 5000
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import processes  # noqa: E402
from factories import CPU_ENV, make_run  # noqa: E402

from memtrack.config import Config, load_config  # noqa: E402
from memtrack.judge.evidence import Point  # noqa: E402
from memtrack.judge.load import Load, own_demand  # noqa: E402
from memtrack.judge.memory import Candidate  # noqa: E402
from memtrack.judge.timing import verdict  # noqa: E402
from memtrack.measure.case import run_case  # noqa: E402
from memtrack.measure.forkserver import ForkServer  # noqa: E402
from memtrack.measure.launcher import worker_env  # noqa: E402
from memtrack.records import Measurement, run_from_dict, to_dict  # noqa: E402
from memtrack.workload.registry import ranks_of, select_cases  # noqa: E402

RECORDS = ROOT / "tests" / "data" / "time-reruns.json.gz"
LOADS = ("quiet", "busy", "oversubscribed")
SLOWDOWNS = (1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0)
PAIR_ROUNDS = 5
HISTORY = 20


def _hogs(load: str) -> int:
    cores = len(os.sched_getaffinity(0))
    return {"quiet": 0, "busy": cores, "oversubscribed": 2 * cores + 2}[load]


def record(rounds: int, path: Path) -> None:
    """Time every shipped single-process case in `rounds` rounds of two passes per load."""
    config = load_config(ROOT / "pyproject.toml")
    passes = []
    with ForkServer.start(worker_env()) as server:
        cases = [c for c in select_cases(server.discover(config)) if ranks_of(c.params) is None]
        for load in LOADS:
            with processes.busy_loops(_hogs(load), settle_s=0.5):
                for r in range(rounds):
                    # as a paired timing alternates: each case's two passes one after the
                    # other, A B in even rounds, B A in odd ones
                    sides: dict[str, list[Measurement]] = {"A": [], "B": []}
                    for c in cases:
                        for side in "AB" if r % 2 == 0 else "BA":
                            m = run_case(config, c, "cpu", (), server=server, timing_only=True)
                            sides[side].append(m)
                    for side, ms in sides.items():
                        passes.append({"load": load, "round": r, "side": side, "run": ms})
                    print(f"  {load}: round {r + 1} of {rounds}", file=sys.stderr)
    data = {
        "cores": len(os.sched_getaffinity(0)),
        "passes": [
            {k: v for k, v in p.items() if k != "run"}
            | {"record": to_dict(make_run(p["run"], env=CPU_ENV))}
            for p in passes
        ],
    }
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f)
    print(f"{len(passes)} rounds' passes of {len(cases)} cases saved to {path}")


def read(path: Path) -> dict[str, dict[str, dict[int, dict[str, Measurement]]]]:
    """case -> load -> round -> side -> its pass."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for p in data["passes"]:
        run = run_from_dict(p["record"], where=f"{path}: a pass")
        for m in run.measurements:
            if m.status == "ok":
                out[m.case_id][p["load"]][p["round"]][p["side"]] = m
    return out


def _point(m: Measurement, i: int) -> Point:
    return Point(
        run_id=f"r{i}",
        commit=None,
        started_at="2026-01-01T00:00:00+00:00",
        env_id=None,
        status="ok",
        values={},
        times=m.iteration_times_s,
        cpu_times=m.iteration_cpu_times_s,
        device_times=m.iteration_device_times_s,
        load=dataclasses.replace(
            Load.of(m), own=own_demand(m.iteration_cpu_times_s, m.iteration_times_s)
        ),
    )


def _slower(m: Measurement, s: float) -> Measurement:
    return dataclasses.replace(
        m,
        iteration_times_s=tuple(t * s for t in m.iteration_times_s),
        iteration_cpu_times_s=tuple(t * s for t in m.iteration_cpu_times_s),
    )


def _kind(m: Measurement, points: list[Point], config: Config) -> str:
    v = verdict(Candidate(m, points), config)
    return v.kind if v is not None else "none"


def unpaired(
    history_pool: list[tuple[str, Measurement]],
    passes: list[tuple[str, Measurement]],
    draws: int,
    config: Config,
    rng: random.Random,
) -> dict:
    """Per slowdown (1.0 = none) and candidate load: the verdicts' kinds, counted. The
    history from `history_pool`, the candidate any other pass."""
    counts: dict = defaultdict(lambda: defaultdict(int))
    if len(history_pool) <= HISTORY:
        return counts
    for _ in range(draws):
        history = rng.sample(history_pool, HISTORY)
        load, cand = rng.choice([p for p in passes if all(p[1] is not h for _, h in history)])
        points = [_point(m, i) for i, (_, m) in enumerate(history)]
        for s in (1.0, *SLOWDOWNS):
            counts[(s, load)][_kind(_slower(cand, s) if s != 1.0 else cand, points, config)] += 1
    return counts


def paired(rounds: dict[str, dict[int, dict[str, Measurement]]], draws: int, config, rng):
    counts: dict = defaultdict(lambda: defaultdict(int))
    figure = "CPU time"
    for load, by_round in rounds.items():
        whole = [r for r, sides in by_round.items() if set(sides) == {"A", "B"}]
        if len(whole) < PAIR_ROUNDS:
            continue
        for _ in range(draws):
            chosen = rng.sample(whole, PAIR_ROUNDS)
            here = [by_round[r]["B"] for r in chosen]
            there = [by_round[r]["A"] for r in chosen]
            ref = [float(_median(m.iteration_cpu_times_s)) for m in there]
            for s in (1.0, *SLOWDOWNS):
                mine = [float(_median(m.iteration_cpu_times_s)) * s for m in here]
                m = dataclasses.replace(
                    here[0],
                    pair_ref="a" * 40,
                    pair_figure=figure,
                    pair_times_s=tuple(mine),
                    pair_ref_times_s=tuple(ref),
                )
                counts[(s, load)][_kind(m, [], config)] += 1
    return counts


def _median(xs) -> float:
    import statistics

    return statistics.median(xs)


def _report(name: str, totals: dict) -> None:
    false = sum(totals[(1.0, load)]["time_regression"] for load in LOADS)
    judged = sum(sum(totals[(1.0, load)].values()) for load in LOADS)
    abstained = sum(totals[(1.0, load)]["abstained"] for load in LOADS)
    print(f"{name}: {false} false time warnings of {judged:,} verdicts ({abstained:,} abstained)")
    for load in LOADS:
        n = sum(totals[(1.0, load)].values())
        if not n:
            continue
        rates = []
        smallest = None
        for s in SLOWDOWNS:
            c = totals[(s, load)]
            rate = c["time_regression"] / max(1, sum(c.values()))
            rates.append(f"{s:g}x {rate:.0%}")
            if smallest is None and rate >= 0.9:
                smallest = s
        said = f"{smallest:g}x" if smallest else "none up to 3x"
        print(f"  candidate {load:14} ({n:,}): warns in 90 % from {said}; " + ", ".join(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", type=int, metavar="ROUNDS", help="record passes first")
    ap.add_argument("--save", type=Path, default=RECORDS)
    ap.add_argument("--records", type=Path, default=RECORDS)
    ap.add_argument("--draws", type=int, default=1000, help="draws per case (and per load)")
    ap.add_argument("--seed", type=int, default=47)
    args = ap.parse_args()
    if args.record:
        record(args.record, args.save)
        args.records = args.save
    data = read(args.records)
    config = Config(path=None, root=ROOT)
    rng = random.Random(args.seed)
    totals: dict = {k: defaultdict(lambda: defaultdict(int)) for k in ("all", "quiet", "paired")}
    print(f"{len(data)} cases, {args.records.name}")
    for _case, loads in sorted(data.items()):
        passes = [
            (load, m) for load, rs in loads.items() for sides in rs.values() for m in sides.values()
        ]
        quiet = [(load, m) for load, m in passes if load == "quiet"]
        for name, drawn in (
            ("all", unpaired(passes, passes, args.draws, config, rng)),
            ("quiet", unpaired(quiet, passes, args.draws, config, rng)),
            ("paired", paired(loads, args.draws // len(LOADS), config, rng)),
        ):
            for key, c in drawn.items():
                for kind, n in c.items():
                    totals[name][key][kind] += n
    _report(f"unpaired, history of {HISTORY} passes of every load", totals["all"])
    _report(f"unpaired, history of {HISTORY} quiet passes", totals["quiet"])
    _report(f"paired, {PAIR_ROUNDS} rounds under one load", totals["paired"])


if __name__ == "__main__":
    main()
