"""Schema changes, one function per change, applied through sqlite-utils' Migrations.

Append a new function to STEPS for every change; never edit an applied one. sqlite-utils
is imported only when migrations are applied, so read paths stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite_utils

SET_NAME = "memtrack"


def _columns(spec: str) -> dict[str, type]:
    """'name type, ...' (type: str, int or float) as sqlite-utils' columns, in order."""
    types = {"str": str, "int": int, "float": float}
    pairs = (c.split() for c in spec.split(",") if c.strip())
    return {name: types[kind] for name, kind in pairs}


def m001_initial(db: sqlite_utils.Database) -> None:
    db.table("environments").create(
        _columns(
            """
            env_id str, fingerprint str, gpus str, driver str, cuda_runtime str, cudnn str,
            nccl str, torch str, torch_cuda_arch_list str, python str, os str, cpu str,
            cpu_count int, host_ram_bytes int, packages str, env_vars str
            """
        ),
        pk="env_id",
    )
    db.table("runs").create(
        _columns(
            """
            run_id str, started_at str, finished_at str, recorded_at str, suite_hash str,
            config_path str, shard str, schema_version int, env_id str, fingerprint str,
            git_commit str, git_branch str, git_parent str, git_subject str,
            git_committed_at str, git_dirty int, git_base_branch str, git_merge_base str,
            git_shallow int, git_notes str, ci_provider str, ci_event str, ci_ref str,
            ci_sha str, ci_pr_number int, ci_base_ref str, ci_head_ref str, ci_run_url str,
            ci_runner_name str
            """
        ),
        pk="run_id",
        foreign_keys=[("env_id", "environments", "env_id")],
    )
    db.table("measurements").create(
        _columns(
            """
            id int, run_id str, workload str, case_id str, params str, seed int, device str,
            dtype str, warmup int, repeats int, status str, message str, traceback str,
            framework str, peak_allocated_bytes int, peak_reserved_bytes int,
            peak_requested_bytes int, persistent_bytes int, allocated_samples str,
            num_alloc_retries int, num_ooms int, host_peak_rss_bytes int,
            host_step_peak_rss_bytes int, host_peak_source str, device_view str,
            device_view_note str, sample_interval_s float, device_peak_bytes int,
            weights_bytes int, intermediates_bytes int, caches_bytes int,
            training_state_bytes int, workspace_bytes int, categories str,
            iteration_times_s str, time_median_s float, time_p95_s float, time_min_s float,
            duration_s float, notes str
            """
        ),
        pk="id",
        foreign_keys=[("run_id", "runs", "run_id")],
    )
    db.table("device_measurements").create(
        _columns(
            """
            id int, measurement_id int, index int, uuid str, name str, total_bytes int,
            used_before_bytes int, peak_device_used_bytes int, peak_process_bytes int,
            process_view str, peak_allocated_bytes int, peak_reserved_bytes int, samples int
            """
        ),
        pk="id",
        foreign_keys=[("measurement_id", "measurements", "id")],
    )
    db.table("measurements").create_index(["case_id", "run_id"])
    db.table("measurements").create_index(["run_id"])
    db.table("device_measurements").create_index(["measurement_id"])
    db.table("runs").create_index(["git_commit"])
    db.table("runs").create_index(["started_at"])
    db.table("runs").create_index(["git_branch", "started_at"])


def m002_verdicts(db: sqlite_utils.Database) -> None:
    """Verdicts of `memtrack check`, one row per candidate run, case and metric."""
    # Plain SQL: the dashboard reads these exact columns, and the check writes them with
    # sqlite3 alone (no sqlite-utils on its path).
    db.execute(
        """
        create table verdicts (
            id integer primary key,
            run_id text references runs(run_id),
            case_id text,
            workload text,
            metric text,
            kind text,
            blocking integer,
            provisional integer,
            baseline_value real,
            spread real,
            factor real,
            floor real,
            threshold real,
            candidate_value real,
            delta real,
            delta_pct real,
            budget_bytes integer,
            budget_reason text,
            baseline_runs integer,
            message text,
            checked_at text
        )
        """
    )
    db.execute("create index idx_verdicts_run_id on verdicts (run_id)")
    db.execute("create index idx_verdicts_case_id on verdicts (case_id)")


def m003_gate(db: sqlite_utils.Database) -> None:
    """The gate's figures: a breakdown that adds up, host metrics that follow the code, and
    verdicts that say their context, what grew, and what was accepted."""
    measurements = db.table("measurements")
    for column in (
        "gradients_bytes",
        "optimizer_state_bytes",
        "unattributed_bytes",
        "host_setup_rss_bytes",
        "host_file_rss_bytes",
        # the `host` and `host_step` metrics, derived when written (as is
        # device_peak_bytes) so that baselines read them with plain SQL
        "host_bytes",
        "host_step_bytes",
    ):
        measurements.add_column(column, int)
    db.execute("alter table verdicts add column context text")
    db.execute("alter table verdicts add column accepted_reason text")
    db.execute("alter table verdicts add column component text")
    db.execute("alter table verdicts add column component_delta real")
    db.execute("alter table verdicts add column level_commit text")
    db.execute("create index idx_verdicts_context on verdicts (context, case_id)")


def m004_environment_cuda(db: sqlite_utils.Database) -> None:
    """What torch says about CUDA on the machine, and queries that failed."""
    for name, kind in (
        ("cuda_available", "integer"),
        ("cuda_device_count", "integer"),
        ("visible_uuids", "text"),
        ("cuda_unavailable_reason", "text"),
        ("notes", "text"),
    ):
        db.execute(f"alter table environments add column {name} {kind}")


def m005_host_tree(db: sqlite_utils.Database) -> None:
    """The host peak of a case's whole process tree, and how it was measured."""
    db.execute("alter table measurements add column host_tree_peak_rss_bytes integer")
    db.execute("alter table measurements add column host_tree_source text")


def m006_device_memory_pass(db: sqlite_utils.Database) -> None:
    """Each device's sampled peak within the memory pass (workspace is measured from it)."""
    db.execute("alter table device_measurements add column memory_pass_peak_bytes integer")


def m007_estimates(db: sqlite_utils.Database) -> None:
    """Estimates (`memtrack estimate`, fake tensors) beside measured figures, told apart."""
    db.execute("alter table measurements add column kind text not null default 'measured'")


def m008_ranks(db: sqlite_utils.Database) -> None:
    """Each rank's own figures of a multi-rank case, one row per rank."""
    db.execute(
        """
        create table rank_measurements (
            id integer primary key,
            measurement_id integer references measurements(id),
            rank integer,
            device text,
            status text,
            message text,
            peak_allocated_bytes integer,
            peak_reserved_bytes integer,
            peak_requested_bytes integer,
            persistent_bytes integer,
            host_peak_rss_bytes integer,
            host_step_peak_rss_bytes integer,
            host_setup_rss_bytes integer,
            host_file_rss_bytes integer,
            time_median_s real
        )
        """
    )
    db.execute(
        "create index idx_rank_measurements_measurement_id on rank_measurements (measurement_id)"
    )


def m009_quality(db: sqlite_utils.Database) -> None:
    """A case's output against its reference after a precision or format change."""
    for name, kind in (
        ("quality_status", "text"),
        ("quality_message", "text"),
        ("quality_reference", "text"),
        ("quality_reference_sha256", "text"),
        ("quality_max_abs", "real"),
        ("quality_max_rel", "real"),
        ("quality_cosine", "real"),
        ("quality_value", "real"),
        ("quality_tolerance", "text"),
    ):
        db.execute(f"alter table measurements add column {name} {kind}")


def m010_loading(db: sqlite_utils.Database) -> None:
    """The loading step's figures (host peak, disk I/O, disk space) and the derived
    `load_host` metric, stored beside them as host_bytes is."""
    for name, kind in (
        ("load_duration_s", "real"),
        ("load_host_peak_rss_bytes", "integer"),
        ("load_file_rss_bytes", "integer"),
        ("load_rchar_bytes", "integer"),
        ("load_wchar_bytes", "integer"),
        ("load_read_bytes", "integer"),
        ("load_write_bytes", "integer"),
        ("disk_bytes", "integer"),
        ("load_host_bytes", "integer"),
    ):
        db.execute(f"alter table measurements add column {name} {kind}")


def m011_allocator_backend(db: sqlite_utils.Database) -> None:
    """The CUDA allocator's backend: of each measurement (torch's answer in the worker) and
    of the machine (where torch starts CUDA). cudaMallocAsync keeps fewer counters."""
    db.execute("alter table measurements add column allocator_backend text")
    db.execute("alter table environments add column allocator_backend text")


def m012_estimate_index(db: sqlite_utils.Database) -> None:
    """Estimates by an index of their own: `check` and `show` put each case's latest beside
    its measured figure, and without it the lookup read every measured row of the case (2 s
    of `check` at a million rows). Partial, so measured rows (nearly all) cost nothing more
    to write; it holds what the lookup tests, so no measurement row is read to find one."""
    db.execute(
        "create index idx_measurements_estimates on measurements "
        "(case_id, status, peak_allocated_bytes, run_id) where kind = 'estimate'"
    )


def m013_iteration_figures(db: sqlite_utils.Database) -> None:
    """What each measured iteration retained, the timing pass's CPU and device times and
    the machine's load during it, and a concurrent case's one session alone and the sum of
    its sessions. Lists are JSON text, as allocated_samples."""
    for name, kind in (
        ("retained_samples", "text"),
        ("iteration_cpu_times_s", "text"),
        ("iteration_device_times_s", "text"),
        ("timing_cpu_pressure", "real"),
        ("timing_runnable", "real"),
        ("timing_steal", "real"),
        ("timing_cores", "integer"),
        ("session_peak_bytes", "integer"),
        ("sessions_sum_bytes", "integer"),
    ):
        db.execute(f"alter table measurements add column {name} {kind}")


def m014_allocator_figures(db: sqlite_utils.Database) -> None:
    """Two figures of the allocator's view on a GPU, derived and stored as the other derived
    metrics are: device memory outside the allocator (the process peak less reserved) and
    fragmentation (reserved less allocated); runs recorded before them get theirs."""
    db.execute("alter table measurements add column outside_allocator_bytes integer")
    db.execute("alter table measurements add column fragmentation_bytes integer")
    db.execute(
        "update measurements set outside_allocator_bytes = max(0, device_peak_bytes - "
        "peak_reserved_bytes) where device_peak_bytes is not null and peak_reserved_bytes "
        "is not null"
    )
    db.execute(
        "update measurements set fragmentation_bytes = max(0, peak_reserved_bytes - "
        "peak_allocated_bytes) where peak_reserved_bytes is not null and peak_allocated_bytes "
        "is not null"
    )


def m015_inputs_and_largest_cache(db: sqlite_utils.Database) -> None:
    """Tensors held from setup (inputs) as a part of the breakdown, and the largest cache a
    measured iteration tagged beside the caches alive at its peak."""
    db.execute("alter table measurements add column inputs_bytes integer")
    db.execute("alter table measurements add column largest_cache_bytes integer")


def m016_sites(db: sqlite_utils.Database) -> None:
    """Where the memory alive at each case's peak was allocated (its top sites by module
    and by source site), as JSON text."""
    db.execute("alter table measurements add column sites text")


def m017_estimate_scratch(db: sqlite_utils.Database) -> None:
    """An estimate's kernel scratch, added from a measured run of its case (and which run):
    its peak less the scratch is the fake tensors' figure alone."""
    db.execute("alter table measurements add column scratch_bytes integer")
    db.execute("alter table measurements add column scratch_run_id text")


def m018_test_budgets(db: sqlite_utils.Database) -> None:
    """A test's own memory budget (its mark), held by `memtrack check`."""
    db.execute("alter table measurements add column budget_bytes integer")
    db.execute("alter table measurements add column budget_metric text")


def m019_repository(db: sqlite_utils.Database) -> None:
    """Each run's repository: one database holds the history of many, and a baseline is
    read from the candidate's own (runs recorded before hold NULL: the one repository's)."""
    db.execute("alter table runs add column git_repository text")
    db.execute("create index idx_runs_repository on runs (git_repository, git_branch, started_at)")


def m020_verdicts_newest(db: sqlite_utils.Database) -> None:
    """A case's verdicts newest first by an index: SQLite's case_id index ends in the rowid,
    so it has that order already; a server's sorts every verdict of the case without it."""
    db.execute("create index idx_verdicts_case_newest on verdicts (case_id, id)")


def m021_time_evidence(db: sqlite_utils.Database) -> None:
    """The timing pass's demand over the whole pass (the case's wait for a CPU, other
    processes' CPU time on its CPUs), its instruction counts (or why none), and a paired
    timing's passes of both sides."""
    for name, kind in (
        ("timing_wait_cores", "real"),
        ("timing_others_cores", "real"),
        ("iteration_instructions", "text"),
        ("instructions_note", "text"),
        ("pair_ref", "text"),
        ("pair_figure", "text"),
        ("pair_times_s", "text"),
        ("pair_ref_times_s", "text"),
    ):
        db.execute(f"alter table measurements add column {name} {kind}")


def m022_selection(db: sqlite_utils.Database) -> None:
    """What a run was limited to (-k, a pytest selection): a case it left out is not
    measured there, never removed."""
    db.execute("alter table runs add column selection text")


def m023_process_tree(db: sqlite_utils.Database) -> None:
    """The case's whole process tree: the `host_tree` metric, derived and stored as the other
    derived metrics are (runs recorded before it summed their processes' RSS, a forked
    worker's shared pages counted in each process: they get none, so that no baseline is read
    from that other figure), and the tree's CPU time of each timed iteration."""
    db.execute("alter table measurements add column host_tree_bytes integer")
    db.execute("alter table measurements add column iteration_tree_cpu_times_s text")


STEPS = (
    m001_initial,
    m002_verdicts,
    m003_gate,
    m004_environment_cuda,
    m005_host_tree,
    m006_device_memory_pass,
    m007_estimates,
    m008_ranks,
    m009_quality,
    m010_loading,
    m011_allocator_backend,
    m012_estimate_index,
    m013_iteration_figures,
    m014_allocator_figures,
    m015_inputs_and_largest_cache,
    m016_sites,
    m017_estimate_scratch,
    m018_test_budgets,
    m019_repository,
    m020_verdicts_newest,
    m021_time_evidence,
    m022_selection,
    m023_process_tree,
)


def names() -> list[str]:
    return [f.__name__ for f in STEPS]


def migrations() -> Any:
    from sqlite_utils.migrations import Migrations

    m = Migrations(SET_NAME)
    for step in STEPS:
        m()(step)
    return m
