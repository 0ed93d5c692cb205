"""What a paired timing costs, and what it tells apart, side by side in one run.

Cost: a pull request's job on the shipped suite, `memtrack run` unpaired against `memtrack
run --against main` (every case timed again against the base branch's code, measure.pairs),
in interleaved rounds, so that the machine's load hits every side alike: each job's wall time
(goal: paired <= 1.5 x unpaired) and the CPU time of its whole process tree. With --before DIR
(a checkout of memtrack's code at another commit), the paired job also runs with that code
(PYTHONPATH=DIR), for the cost of a change to the pairing itself.

What it tells apart: real pairs (measure.pairs.time_pair: two live workers taking turns) of
`--pair-rounds` rounds, recorded quiet and beside one busy process, each with OpenMP's idle
threads spinning (its default) and asleep (OMP_WAIT_POLICY=PASSIVE, what a paired run sets):
every shipped single-process case against itself (a cosmetic pair: any time warning is false;
goal 0), and a multi-threaded matmul case against itself made 2x slower, `--mm-pairs` pairs
(goal: >= 90 % warn beside a busy process). The gate's own time verdict (judge.timing) judges
draws of 5 of the recorded rounds, for each figure a pair can compare (tree CPU time, CPU
time, wall time) and each statistic of a pass a round can compare (its median iteration, what
a paired run compares, and its fastest); and, were each draw's rounds stopped where a pair stops
them (worker.turns: the first round not slower, with the shipped config), how many rounds it
ran and how many verdicts that changed (goal 0: the verdict on the rounds run is the one all
of them give).

    python scripts/bench_pairs.py [--rounds 3] [--before /tmp/memtrack-before] [--draws 500]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}
CONFIG = 'modules = ["memtrack.examples"]\n'


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, check=True)


def _repo(root: Path) -> Path:
    """The shipped suite on main, and a pull request that changes only its README."""
    root.mkdir(parents=True)
    (root / "memtrack.toml").write_text(CONFIG)
    (root / "README.md").write_text("the shipped suite\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "the shipped suite")
    _git(root, "checkout", "-q", "-b", "pr")
    (root / "README.md").write_text("the shipped suite, documented\n")
    _git(root, "commit", "-qam", "a cosmetic change")
    return root


def _cpu_s() -> float:
    """CPU seconds of this process's reaped children (their own reaped children's too)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """The command's wall time, the CPU time of its whole process tree, and its stdout."""
    t0, c0 = time.perf_counter(), _cpu_s()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed, cpu = time.perf_counter() - t0, _cpu_s() - c0
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return elapsed, cpu, done.stdout


MM = """\
import torch

import memtrack


@memtrack.workload(params={"times": [1, 2]})
def mm(ctx):
    a, b = ctx.randn(384, 384), ctx.randn(384, 384)  # every core's threads: torch's default

    def step():
        for _ in range(8 * ctx["times"]):
            a @ b

    return step
"""
FIGURES = ("tree CPU time", "CPU time", "wall time")


PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


def _record(pair_rounds: int, mm_pairs: int) -> dict[str, list[tuple]]:
    """condition -> [(case, REF's side, the candidate's side)], each a live pair: quiet and
    beside a busy process, each with OpenMP's idle threads spinning (its default) and asleep
    (OMP_WAIT_POLICY=PASSIVE): every case against itself and `mm_pairs` pairs of the matmul
    against itself made 2x slower."""
    import processes

    from memtrack.config import load_config
    from memtrack.measure.forkserver import ForkServer
    from memtrack.measure.launcher import worker_env
    from memtrack.measure.pairs import time_pair
    from memtrack.workload.registry import ranks_of, select_cases

    with tempfile.TemporaryDirectory(prefix="memtrack-bench-pairs-") as tmp:
        repo = Path(tmp)
        (repo / "mm.py").write_text(MM)
        (repo / "memtrack.toml").write_text('modules = ["memtrack.examples", "mm.py"]\n')
        config = dataclasses.replace(load_config(repo / "memtrack.toml"), pair_rounds=pair_rounds)
        out: dict[str, list[tuple]] = {}
        conditions = (
            ("quiet", {}, 0),
            ("quiet, OMP_WAIT_POLICY=PASSIVE", PASSIVE, 0),
            ("beside a busy process", {}, 1),
            ("beside a busy process, OMP_WAIT_POLICY=PASSIVE", PASSIVE, 1),
        )
        for name, env, busy in conditions:
            with ForkServer.start(worker_env() | env, cwd=repo, pairs=True) as server:
                found = select_cases(server.discover(config))
                cases = [c for c in found if not ranks_of(c.params)]
                by_id = {c.case_id: c for c in cases}
                once, twice = by_id["mm[times=1]"], by_id["mm[times=2]"]
                with processes.busy_loops(busy, settle_s=0.5):
                    pairs = []
                    for c in cases:
                        if c is not twice:
                            side = (config, c, server)
                            pairs.append((c.case_id, *time_pair(config, side, side, "cpu", False)))
                    ref, cand = (config, once, server), (config, twice, server)
                    for _ in range(mm_pairs):
                        pairs.append(("mm 2x", *time_pair(config, ref, cand, "cpu", False)))
                out[name] = pairs
                print(f"  recorded: {name}", flush=True)
    return out


STATISTICS = {"median": statistics.median, "fastest": min}
"""What a pass's iterations give its round: their median, or the fastest of them."""


def _judged(
    pairs, figure: str, stat: str, draws: int, rng: random.Random
) -> tuple[Counter, Counter]:
    """Verdict kinds of `draws` draws of 5 rounds of each pair, judged as the shipped
    config judges them; and, were each draw's rounds stopped where a pair stops them
    (worker.turns), the verdicts that changed and the rounds run."""
    from memtrack.config import load_config
    from memtrack.judge.timing import futile_after
    from memtrack.worker.turns import not_slower as not_slower_round

    config = load_config(ROOT / "pyproject.toml")
    kinds: Counter = Counter()
    stopped: Counter = Counter()  # what the early stop would have changed, rounds it ran
    for _, there, here in pairs:
        if here.status != "ok" or there.status != "ok":
            kinds["failed"] += draws
            continue
        mine, theirs = (_passes(m, figure, STATISTICS[stat]) for m in (here, there))
        for _ in range(draws):
            rounds = rng.sample(range(len(mine)), 5)
            here_s, there_s = [mine[r] for r in rounds], [theirs[r] for r in rounds]
            kind = _kind(here, figure, here_s, there_s, config)
            kinds[kind] += 1
            # the rounds a pair runs: up to the `futile_after`-th round not slower
            stop, not_slower, ran = futile_after(5, config.headroom_factor), 0, 5
            for i, (h, t) in enumerate(zip(here_s, there_s, strict=True)):
                not_slower += not_slower_round({figure: h}, {figure: t}) is True
                if not_slower >= stop:
                    ran = i + 1
                    break
            early = _kind(here, figure, here_s[:ran], there_s[:ran], config)
            stopped["changed"] += early != kind
            stopped["rounds"] += ran
    return kinds, stopped


def _passes(m, figure: str, stat) -> list[float]:
    """Each pass's `stat` of its iterations' `figure`, in order."""
    from memtrack.measure.pairs import _times

    times, n = list(_times(m, figure)), m.repeats
    return [stat(times[i : i + n]) for i in range(0, len(times), n)]


def _kind(m, figure: str, here: list[float], there: list[float], config) -> str:
    """The time verdict's kind on these rounds of a pair (judge.timing, as `check` runs it)."""
    from memtrack.judge.memory import Candidate
    from memtrack.judge.timing import verdict

    paired = dataclasses.replace(
        m,
        pair_ref="a" * 40,
        pair_figure=figure,
        pair_times_s=tuple(here),
        pair_ref_times_s=tuple(there),
    )
    v = verdict(Candidate(paired, []), config)
    return v.kind if v is not None else "none"


def sensitivity(pair_rounds: int, mm_pairs: int, draws: int, cache: Path | None) -> None:
    print(
        f"\nreal pairs of {pair_rounds} rounds, recorded (shipped cases against themselves, "
        "and a matmul case against itself made 2x slower):",
        flush=True,
    )
    if cache is not None and cache.exists():
        recorded = pickle.loads(cache.read_bytes())
    else:
        recorded = _record(pair_rounds, mm_pairs)
        if cache is not None:
            cache.write_bytes(pickle.dumps(recorded))
    rng = random.Random(47)
    print(
        f"\ndraws of 5 rounds, {draws} a pair; false: time warnings on a cosmetic pair; "
        "2x: the share of the 2x matmul's draws that warn"
    )
    for name, pairs in recorded.items():
        cosmetic = [p for p in pairs if p[0] != "mm 2x"]
        slower = [p for p in pairs if p[0] == "mm 2x"]
        for stat in STATISTICS:
            turn = f"a pass's {stat}"
            cells = []
            for figure in FIGURES:
                false, false_stop = _judged(cosmetic, figure, stat, draws, rng)
                warn, warn_stop = _judged(slower, figure, stat, draws, rng)
                judged = sum(false.values())
                share = warn["time_regression"] / max(1, sum(warn.values()))
                stop = false_stop + warn_stop
                ran = stop["rounds"] / max(1, judged + sum(warn.values()))
                cells.append(
                    f"{figure}: false {false['time_regression']}/{judged:,}, 2x {share:.0%}, "
                    f"stopped early at {ran:.1f} rounds, {stop['changed']} verdicts changed"
                )
            print(f"  {name:47} {turn:16} " + "; ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, help="a checkout of memtrack's code to compare")
    ap.add_argument("--pair-rounds", type=int, default=20, help="rounds of each recorded pair")
    ap.add_argument("--draws", type=int, default=500, help="draws of 5 rounds a pair")
    ap.add_argument("--mm-pairs", type=int, default=4, help="recorded pairs of the 2x matmul")
    ap.add_argument("--no-cost", action="store_true", help="only what a pair tells apart")
    ap.add_argument("--cache", type=Path, help="keep the recorded pairs here, and reuse them")
    args = ap.parse_args()
    if not args.no_cost:
        cost(args.rounds, args.before)
    sensitivity(args.pair_rounds, args.mm_pairs, args.draws, args.cache)


def cost(rounds_n: int, before_code: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="memtrack-bench-pairs-") as tmp:
        repo = _repo(Path(tmp) / "repo")
        out = Path(tmp) / "run.json"
        run = [sys.executable, "-m", "memtrack.cli", "run", "--no-db", "--json", str(out)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        sides: dict[str, tuple[list[str], dict[str, str]]] = {
            "unpaired": (run, env),
            "paired": ([*run, "--against", "main"], env),
        }
        if before_code is not None:
            before = {**env, "PYTHONPATH": str(before_code.resolve())}
            sides["paired, --before code"] = ([*run, "--against", "main"], before)
        times: dict[str, list[float]] = {name: [] for name in sides}
        cpus: dict[str, list[float]] = {name: [] for name in sides}
        said = ""
        for r in range(rounds_n):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for name in order:
                cmd, side_env = sides[name]
                elapsed, cpu, stdout = _timed(cmd, repo, side_env)
                times[name].append(elapsed)
                cpus[name].append(cpu)
                if name == "paired":
                    said = next((x for x in stdout.splitlines() if "paired timing" in x), "")
                    if "timing passes more" not in said:
                        sys.exit(f"the paired job paired nothing: {said or stdout[-2000:]}")
            print(
                f"round {r + 1}/{rounds_n}: "
                + ", ".join(f"{name} {times[name][-1]:.1f} s" for name in sides),
                flush=True,
            )
    load = os.getloadavg()[0]
    print(f"\nmedians of {rounds_n} rounds, load average {load:.1f}: wall s, CPU s of the tree")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in medians.items():
        print(f"  {name:28} {m:7.1f} {statistics.median(cpus[name]):7.1f}")
    print(f"the paired job said: {said}")
    for name in medians:
        if name != "unpaired":
            ratio = medians[name] / medians["unpaired"]
            print(f"{name} / unpaired: {ratio:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
