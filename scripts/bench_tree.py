"""The host memory and CPU time of a case's whole process tree, against independent figures.

A real repository whose case `feed` iterates a DataLoader with two persistent worker
processes (tests/factories.fed_by_workers): one commit where the workers hold nothing of
their own, one where each builds its own copy of a corpus of `--corpus` MiB, each recorded by
`memtrack run`. Printed, for each commit:

- the `host_tree` figure and how it was measured, beside an independent reference: the case
  process's own exact peak (the `host` metric, VmHWM less file-backed pages) plus the private
  memory (`Private_Dirty`) each worker read of itself once its corpus was built;
- each process's part at the tree's peak (what a growth names);
- the tree's CPU time per iteration beside the process's own, and the workers' share against
  what they were made to spend (8 items of `--work` seconds of their own CPU time each);

and the tree's growth between the commits against the corpora added (2 x `--corpus` MiB).

    python scripts/bench_tree.py [--corpus 32] [--work 0.02]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from factories import fed_by_workers  # noqa: E402

from memtrack.records import metrics  # noqa: E402
from memtrack.store.database import Store  # noqa: E402

MiB = 2**20
ITEMS = 8
"""Items per iteration (the factory's dataset)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=int, default=32, help="MiB per worker (default 32)")
    parser.add_argument("--work", type=float, default=0.02, help="CPU s per item (0.02)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpora = {"main": 0, "corpus": args.corpus}
        _, db, references = fed_by_workers(Path(tmp), corpora, args.work)
        with Store.open(db, readonly=True) as store:
            runs = [store.get_run(r) for r in store.run_ids()]
        found = {r.git.branch: r.measurements[0] for r in runs}
    trees = {}
    for branch, corpus in corpora.items():
        m = found[branch]
        tree, host = metrics.value(m, "host_tree"), metrics.value(m, "host")
        assert tree is not None and host is not None, f"{branch}: no tree or host figure"
        trees[branch] = tree
        reference = host + sum(references[branch].values())
        print(f"{branch} ({corpus} MiB per worker), host_tree measured as {m.host_tree_source!r}")
        print(
            f"  host_tree {tree / MiB:.2f} MiB; reference {reference / MiB:.2f} MiB "
            f"(host {host / MiB:.2f} MiB + workers' private "
            f"{sum(references[branch].values()) / MiB:.2f} MiB): "
            f"{100 * (tree - reference) / reference:+.1f} %"
        )
        parts = ", ".join(
            f"{s.key} {s.size_bytes / MiB:.2f} MiB" for s in m.sites if s.grouping == "process"
        )
        print(f"  at the tree's peak: {parts}")
        tree_cpu = statistics.median(m.iteration_tree_cpu_times_s)
        own_cpu = statistics.median(m.iteration_cpu_times_s)
        made = ITEMS * args.work
        print(
            f"  CPU time per iteration (median): tree {tree_cpu:.3f} s, the case's own "
            f"{own_cpu:.3f} s; the workers' {tree_cpu - own_cpu:.3f} s of {made:.3f} s made"
        )
    grew, added = trees["corpus"] - trees["main"], 2 * args.corpus * MiB
    print(
        f"growth of host_tree {grew / MiB:.2f} MiB for {added / MiB:.2f} MiB added: "
        f"{100 * (grew - added) / added:+.1f} %"
    )


if __name__ == "__main__":
    main()
