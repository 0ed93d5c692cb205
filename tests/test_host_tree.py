"""The host memory of a case's whole process tree (`host_tree`), on a real repository whose
case feeds itself through a real DataLoader with two worker processes: memory that lives only
in the workers is measured, gated and named by the worker that holds it, and the figure agrees
with an independent reference, the case's own exact peak plus what each worker wrote down
of its private memory."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
from pathlib import Path

import pytest
from factories import fed_by_workers, make_measurement, memtrack_cli

from memtrack.records import metrics
from memtrack.store.database import Store

MiB = 2**20
BASE_MIB = 16
"""What each worker's own copy of the corpus holds on main: enough that the tree's peak is
sampled once the workers have built it (a worker's figure while it is still starting is
smaller, and a composition sampled then would not be the one its growth is read against)."""
CORPUS_MIB = 32
"""What the pull request adds to each worker's copy of the corpus."""
WORK_S = 0.02
"""The CPU time a worker spends on each of the 8 items of an iteration."""


@dataclasses.dataclass
class Story:
    db: Path
    references: dict[str, dict[str, int]]
    """Each commit's workers' private memory as they wrote it down, by branch."""
    check: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def story(tmp_path_factory) -> Story:
    """main records the case; a pull request makes each worker's own copy of the corpus 32 MiB
    larger, and is recorded and checked."""
    root = tmp_path_factory.mktemp("tree")
    repo, db, references = fed_by_workers(
        root, {"main": BASE_MIB, "pr": BASE_MIB + CORPUS_MIB}, WORK_S
    )
    report = ("--markdown", str(root / "summary.md"), "--json", str(root / "check.json"))
    return Story(db, references, memtrack_cli(repo, "check", "--db", str(db), *report))


def _measurements(db: Path) -> dict[str, object]:
    """The case's measurement of each commit, by branch."""
    with Store.open(db, readonly=True) as store:
        runs = [store.get_run(r) for r in store.run_ids()]
    return {r.git.branch: r.measurements[0] for r in runs}


def test_memory_only_in_the_workers_blocks_as_a_tree_regression_naming_each_worker(story):
    done = story.check
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "· host_tree:" in x)
    assert line.startswith("BLOCK regression · feed · host_tree")
    assert "in process `pt_data_worker 1`" in line and "in process `pt_data_worker 2`" in line
    # the case's own process did not move: its `host` figure is no improvement, nor a block
    host = next(x for x in done.stdout.splitlines() if "· feed · host:" in x)
    assert host.startswith("ok"), host
    summary = (story.db.parent / "summary.md").read_text()
    assert "process `pt_data_worker 1`" in summary
    verdict = next(
        v
        for v in json.loads((story.db.parent / "check.json").read_text())["verdicts"]
        if v["metric"] == "host_tree"
    )
    named = {c["key"]: c["after"] - c["before"] for c in verdict["where"]["named"]}
    assert set(named) == {"pt_data_worker 1", "pt_data_worker 2"}
    for grew in named.values():  # each worker grew by its corpus, within 10 %
        assert abs(grew - CORPUS_MIB * MiB) <= 0.1 * CORPUS_MIB * MiB, named


def test_the_tree_figure_agrees_with_the_case_and_its_workers_own_figures(story):
    """The tree's figure against an independent reference: the case's own exact peak (the
    `host` metric) plus the private memory each worker read of itself, within 10 %; and its
    growth against the corpora the pull request added, within 10 %."""
    found = _measurements(story.db)
    for branch, m in found.items():
        assert m.host_tree_source == "sampled", m.host_tree_source
        tree = metrics.value(m, "host_tree")
        reference = metrics.value(m, "host") + sum(story.references[branch].values())
        assert len(story.references[branch]) == 2
        assert abs(tree - reference) <= 0.1 * reference, (branch, tree, reference)
        processes = {s.key: s.size_bytes for s in m.sites if s.grouping == "process"}
        assert set(processes) == {"main", "pt_data_worker 1", "pt_data_worker 2"}
        assert sum(processes.values()) <= tree
    grew = metrics.value(found["pr"], "host_tree") - metrics.value(found["main"], "host_tree")
    assert abs(grew - 2 * CORPUS_MIB * MiB) <= 0.1 * 2 * CORPUS_MIB * MiB, grew


def test_a_tree_figure_recorded_as_summed_rss_is_no_baseline(tmp_path):
    """Runs recorded before the tree was counted page by page summed their processes' RSS:
    the `host_tree` metric reads none of them, so no baseline is that other figure."""
    old = make_measurement(
        host_tree_peak_rss_bytes=900 * MiB, host_tree_source="process-group samples (lower bound)"
    )
    new = dataclasses.replace(old, host_tree_peak_rss_bytes=300 * MiB, host_tree_source="sampled")
    assert metrics.value(old, "host_tree") is None
    cgroup = dataclasses.replace(old, host_tree_source="cgroup")  # memory.peak: page cache too
    assert metrics.value(cgroup, "host_tree") is None
    assert metrics.value(new, "host_tree") == 300 * MiB
    assert "host_tree" in metrics.GATED


def test_the_cpu_time_spent_in_the_workers_is_the_case_s(story):
    """Each iteration's tree CPU time holds the workers' work (8 items of 20 ms of their own
    CPU time each) beside the case's own, which does not."""
    m = _measurements(story.db)["main"]
    assert len(m.iteration_tree_cpu_times_s) == len(m.iteration_cpu_times_s) == 3
    for tree, own in zip(m.iteration_tree_cpu_times_s, m.iteration_cpu_times_s, strict=True):
        assert tree - own >= 0.8 * 8 * WORK_S, (tree, own)
    assert (
        statistics.median(m.iteration_cpu_times_s) < 8 * WORK_S
    )  # the workers' work is not its own


def test_show_says_the_tree_s_peak_and_each_process_s_part(story):
    with Store.open(story.db, readonly=True) as store:
        (run_id,) = [r for r in store.run_ids() if store.get_run(r).git.branch == "pr"]
    shown = memtrack_cli(story.db.parent, "show", run_id, "--db", str(story.db))
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if "process tree" in x)
    assert "(sampled), gated as `host_tree`" in line and "pt_data_worker 1" in line, line
