"""The judge's oracle: every verdict the gate gives on every recorded history, written down,
so that a change to the judge is compared with what it replaces, verdict by verdict.

Three sources of histories:

- draws: real reruns of every shipped case (tests/data/reruns.json.gz) resampled into
  baselines, as scripts/bench_check.py draws them: plain histories of 1 to 20 runs with one
  more run as the candidate; 20-run histories with a candidate grown by fixed amounts per
  metric; messy histories (a revert, two cycles, an accepted step, an environment change)
  with the unchanged and the re-landed candidate; and 150-commit series for `check
  --history` (steps and creeps). Deterministic for a seed.
- tests: the test suite run with a hook (scripts/oracle_hook/sitecustomize.py) that writes
  every check's verdicts and every history's steps, from the tests' own processes and from
  the `memtrack` processes they start, keyed by the test and the check's order in it.
- diff: two such files compared: each verdict kind that changed, per source, case and
  metric, and how the headroom moved.

    python scripts/judge_oracle.py draws --tree /path/to/old/checkout --out old.jsonl
    python scripts/judge_oracle.py draws --out new.jsonl
    python scripts/judge_oracle.py tests --tree /path/to/old/checkout --out old-tests.jsonl
    python scripts/judge_oracle.py diff old.jsonl new.jsonl

`--tree` imports memtrack, and the tree's scripts/bench_check.py (its `_judge` and
`judge_series` adapters, which each version keeps with one signature), from that checkout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
MiB = 2**20


def _use_tree(tree: Path) -> Any:
    """Import memtrack and bench_check from `tree`, first on the import path."""
    for sub in ("scripts", "tests", ""):
        sys.path.insert(0, str(tree / sub) if sub else str(tree))
    import bench_check  # noqa: E402

    import memtrack  # noqa: E402

    if not Path(memtrack.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"memtrack was imported from {memtrack.__file__}, not from {tree}")
    return bench_check


def _room(v: Any) -> float | None:
    t, b = getattr(v, "threshold", None), getattr(v, "baseline_value", None)
    return None if t is None or b is None else float(t) - float(b)


def _row(source: str, key: str, metric: str, v: Any) -> dict[str, Any]:
    return {
        "source": source,
        "key": key,
        "metric": metric,
        "kind": v.kind,
        "blocking": bool(v.blocking),
        "baseline": getattr(v, "baseline_value", None),
        "room": _room(v),
    }


def _judged(bc: Any, config: Any, m: Any, base: list, before: list | None = None) -> dict:
    verdicts = bc._judge(config, m, base, before)
    return {metric: v for metric, v in verdicts.items() if v is not None}


def draws(bc: Any, out: Any, seed: int, plain: int, grown: int, messy: int, series: int) -> int:
    """Every draw's verdicts, written to `out` as JSON lines; returns how many."""
    from memtrack.config import Config
    from memtrack.records import metrics

    config = Config(path=None, root=HERE)
    runs, _ = bc.load_records(HERE / "tests" / "data" / "reruns.json.gz")
    cases = bc.by_case(runs, [])
    n = 0

    def write(source: str, key: str, verdicts: dict) -> None:
        nonlocal n
        for metric, v in sorted(verdicts.items()):
            out.write(json.dumps(_row(source, key, metric, v)) + "\n")
            n += 1

    rng = random.Random(seed)
    for case_id, pairs in cases.items():
        for h in range(plain):
            size = min(1 + h % 20, len(pairs) - 1)
            drawn = rng.sample(pairs, size + 1)
            write("plain", f"{case_id}#{h}", _judged(bc, config, drawn[-1][1], drawn[:-1]))
    rng = random.Random(seed + 1)
    for case_id, pairs in cases.items():
        for h in range(grown):
            drawn = rng.sample(pairs, min(20, len(pairs) - 1) + 1)
            base, m = drawn[:-1], drawn[-1][1]
            for metric in sorted(bc.GROWN):
                value = metrics.value(m, metric)
                if value is None:
                    continue
                floor = metrics.floor(metric, value)
                for k in (1, 2, 4, 8, 32, 128):
                    for delta in (k * floor, int(value * k / 200)):
                        grown_m = bc._inject(m, metric, delta)
                        found = _judged(bc, config, grown_m, base)
                        kept = {x: found[x] for x in (metric, "sessions") if x in found}
                        write("grown", f"{case_id}#{h}:{metric}+{delta}", kept)
    rng = random.Random(seed + 3)
    for case_id, pairs in cases.items():
        for metric in sorted(bc.GROWN):
            if metrics.value(pairs[0][1], metric) is None:
                continue
            for h in range(messy):
                size = min(5 + h % 16, len(pairs) - 1)
                drawn = rng.sample(pairs, size + 1)
                base, m = drawn[:-1], drawn[-1][1]
                for scene, hist, same, again, before in _scenes(bc, rng, base, m, metric):
                    key = f"{case_id}#{h}:{metric}:{scene}"
                    write("messy", key + ":unchanged", _judged(bc, config, same, hist, before))
                    write("messy", key + ":relanded", _judged(bc, config, again, hist, before))
    rng = random.Random(seed + 2)
    for case_id, pairs in cases.items():
        for h in range(series):
            drawn: list = []
            while len(drawn) < 150:
                drawn += [m for _, m in rng.sample(pairs, len(pairs))]
            drawn = drawn[:150]
            for metric in metrics.NAMES:
                values = [metrics.value(m, metric) for m in drawn]
                if any(v is None for v in values):
                    continue
                fit = _series_fit(bc, [float(v or 0) for v in values], metric, config, drawn)
                row = {
                    "source": "series",
                    "key": f"{case_id}#{h}",
                    "metric": metric,
                    "kind": f"{len(fit.starts)} steps"
                    + (", creep" if fit.creep is not None and fit.creep.flagged else ""),
                    "blocking": bool(fit.creep is not None and fit.creep.flagged),
                    "baseline": None,
                    "room": fit.room,
                }
                out.write(json.dumps(row) + "\n")
                n += 1
    return n


def _series_fit(bc: Any, values: list[float], metric: str, config: Any, drawn: list) -> Any:
    """A 150-commit series judged, its anchor 50 commits back, by either version's
    `judge_series` (iterations as `samples`, or before as `within`)."""
    samples = [m.allocated_samples for m in drawn]
    if hasattr(bc, "within_runs"):
        within = bc.within_runs(samples) if metric == "allocated" else 0.0
        return bc.judge_series(values, metric, config, anchor_index=99, within=within)
    return bc.judge_series(values, metric, config, anchor_index=99, samples=samples)


def _scenes(bc: Any, rng: random.Random, base: list, m: Any, metric: str) -> list:
    """The messy histories of bench_check around one growth of the case."""
    n = len(base)
    delta = bc._growth(m, metric)
    grown = bc._inject(m, metric, delta)

    def up(pair: tuple, d: int = delta) -> tuple:
        return (pair[0], bc._inject(pair[1], metric, d))

    at = rng.randrange(3, n - 1)
    second = rng.randrange(at + 2, n - 1) if at + 2 < n - 1 else None
    out = [
        ("revert", [*base[:at], up(base[at]), *base[at + 1 :]], m, grown, None),
        (
            "second cycle",
            [up(p) if i in (at, second) else p for i, p in enumerate(base)],
            m,
            grown,
            None,
        ),
        (
            "accepted step",
            [*base[:at], *(up(p) for p in base[at:])],
            grown,
            bc._inject(grown, metric, delta),
            None,
        ),
    ]
    moved = min(3, max(1, n - at))
    if metric in ("host", "load_host"):
        shift = 6 * MiB
        new_env = [up(p, shift) for p in base[-moved:]]
        same, again = bc._inject(m, metric, shift), bc._inject(grown, metric, shift)
    else:
        new_env, same, again = base[-moved:], m, grown
    out.append(("environment change", new_env, same, again, base[:-moved]))
    return out


def tests(tree: Path, out: Path, pytest_args: list[str]) -> int:
    """The test suite of `tree` run with the hook; returns pytest's exit status."""
    out.unlink(missing_ok=True)
    hook = HERE / "scripts" / "oracle_hook"
    env = {
        **os.environ,
        "MEMTRACK_ORACLE": str(out.resolve()),
        "PYTHONPATH": os.pathsep.join([str(hook), str(tree)]),
    }
    return subprocess.call(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "oracle_plugin",
            *pytest_args,
        ],
        cwd=tree,
        env=env,
    )


def _load(path: Path) -> dict[tuple, dict]:
    """Rows by (source, key, metric); the tests' checks numbered in their test's order."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows: dict[tuple, dict] = {}
    calls: dict[str, dict[str, int]] = defaultdict(dict)
    with opener(path, "rt", encoding="utf-8") as f:
        found = [json.loads(line) for line in f]
    # a test's checks in the order they were made (processes of one test run one by one)
    for r in sorted((r for r in found if r["source"] == "tests"), key=lambda r: r["t"]):
        calls[r["test"]].setdefault(r["call"], len(calls[r["test"]]))
    for r in found:
        if r["source"] == "tests":
            r["key"] = f"{r['test']}#{calls[r['test']][r['call']]}#{r['case']}"
        rows[(r["source"], r["key"], r["metric"])] = r
    return rows


def diff(old_path: Path, new_path: Path, shown: int) -> int:
    old, new = _load(old_path), _load(new_path)
    print(f"old: {old_path} ({len(old):,} verdicts); new: {new_path} ({len(new):,})")
    by_source: dict[str, Counter] = defaultdict(Counter)
    changes: dict[tuple, Counter] = defaultdict(Counter)
    rooms: dict[tuple, list[float]] = defaultdict(list)
    examples: dict[tuple, list[str]] = defaultdict(list)
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        source, key, metric = k
        by_source[source]["compared"] += 1
        if a is None or b is None:
            by_source[source]["only old" if b is None else "only new"] += 1
            continue
        case = key.split("#")[0] if source != "tests" else key.split("#")[0].split("::")[-1]
        if a["room"] and b["room"] is not None and a["room"] > 0:
            rooms[(source, metric)].append(b["room"] / a["room"])
        was = (a["kind"], a["blocking"])
        now = (b["kind"], b["blocking"])
        if was != now:
            by_source[source]["changed"] += 1
            mark = ("!" if a["blocking"] else "", "!" if b["blocking"] else "")
            label = f"{a['kind']}{mark[0]} -> {b['kind']}{mark[1]}"
            changes[(source, case, metric)][label] += 1
            if len(examples[(source, case, metric, label)]) < shown:
                examples[(source, case, metric, label)].append(key)
    for source, c in sorted(by_source.items()):
        print(
            f"{source}: {c['compared']:,} compared, {c['changed']:,} changed, "
            f"{c['only old']} only old, {c['only new']} only new"
        )
    from memtrack.workload.registry import short_case_labels

    short = short_case_labels(sorted({case for _, case, _ in changes}))
    for (source, case, metric), c in sorted(changes.items()):
        for label, count in c.most_common():
            eg = ", ".join(k.replace(case, "") for k in examples[(source, case, metric, label)])
            print(
                f"  {source:6} {short.get(case, case)[:40]:40} {metric:10} {label:30} "
                f"{count:6}  e.g. {eg}"
            )
    print("headroom, new / old (median, 10th and 90th percentile):")
    for (source, metric), xs in sorted(rooms.items()):
        xs.sort()
        q = [xs[int(p * (len(xs) - 1))] for p in (0.1, 0.9)]
        print(
            f"  {source:6} {metric:10} {statistics.median(xs):6.3f} "
            f"[{q[0]:6.3f}, {q[1]:6.3f}] over {len(xs):,}"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("draws", help="judge the resampled histories of the recorded reruns")
    d.add_argument("--tree", type=Path, default=HERE)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--plain", type=int, default=1000)
    d.add_argument("--grown", type=int, default=10)
    d.add_argument("--messy", type=int, default=100)
    d.add_argument("--series", type=int, default=10)
    t = sub.add_parser("tests", help="run the test suite, writing down every check")
    t.add_argument("--tree", type=Path, default=HERE)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("pytest_args", nargs="*")
    f = sub.add_parser("diff", help="compare two oracle files")
    f.add_argument("old", type=Path)
    f.add_argument("new", type=Path)
    f.add_argument("--examples", type=int, default=3)
    args = ap.parse_args()
    if args.what == "diff":
        return diff(args.old, args.new, args.examples)
    if args.what == "tests":
        return tests(args.tree.resolve(), args.out, args.pytest_args)
    bc = _use_tree(args.tree.resolve())
    with open(args.out, "w", encoding="utf-8") as out:
        n = draws(bc, out, args.seed, args.plain, args.grown, args.messy, args.series)
    print(f"{n:,} verdicts written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
