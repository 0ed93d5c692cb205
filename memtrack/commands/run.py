from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from memtrack.commands.options import (
    check_json_folder,
    config_option,
    db_option,
    fail_on,
    json_path_option,
    no_db_option,
    patterns_option,
    plain_output,
    progress_echo,
    resolve,
    rich_console,
)
from memtrack.config import MAX_COUNT, Config, is_revision
from memtrack.errors import ConfigError
from memtrack.measure.forkserver import ForkServer
from memtrack.measure.launcher import worker_env
from memtrack.store.opening import open_store
from memtrack.store.url import ServerUrl, present
from memtrack.workload.registry import Case, no_match, select_cases

if TYPE_CHECKING:
    from memtrack.measure.pairs import Pairing, Reference
    from memtrack.measure.suite import RunStart
    from memtrack.records import Measurement, RunRecord
    from memtrack.store.save import Recorded


def _parse_shard(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    if not re.fullmatch(r"[1-9][0-9]{0,6}/[1-9][0-9]{0,6}", value):
        raise ConfigError(
            f"--shard: {value!r} is not of the form i/n (e.g. 1/4), each a "
            f"whole number from 1 to {MAX_COUNT:,}"
        )
    i, n = (int(x) for x in value.split("/"))
    if not 1 <= i <= n <= MAX_COUNT:
        raise ConfigError(f"--shard: {value!r}: i must be between 1 and n, n at most {MAX_COUNT:,}")
    return i, n


@click.command()
@config_option
@db_option
@patterns_option("Run")
@json_path_option("the run as a JSON record")
@click.option("--shard", help="Run shard i of n of the suite (e.g. 2/4), for several runners.")
@click.option(
    "--against",
    metavar="REF",
    help="Time each case against REF in the same job, passes alternating (paired timing): "
    "'merge-base' (the merge-base with the base branch) or a git revision. REF's passes are "
    "recorded as a run of REF. Default: the config's `against`.",
)
@click.option("--unpaired", is_flag=True, help="No paired timing, whatever the config says.")
@no_db_option
def run(
    config_path: Path | None,
    db_path: Path | None,
    patterns: tuple[str, ...],
    json_path: Path | None,
    shard: str | None,
    against: str | None,
    unpaired: bool,
    no_db: bool,
) -> None:
    """Measure the suite, one fresh process per case, and record the run."""
    if no_db and not json_path:
        raise click.UsageError(
            "--no-db without --json would measure the suite and keep "
            "nothing: give --json FILE, or drop --no-db"
        )
    shard_t = _parse_shard(shard)
    # The fork server first: it imports torch and MemTracker (seconds) while this process
    # imports what measuring and recording need (here, not at the top, so that it starts
    # 0.05 s sooner), reads the config and takes the git facts.
    with ForkServer.start(worker_env()) as server:
        from memtrack.measure.suite import RunStart
        from memtrack.measure.timeout import RECENT_RUNS
        from memtrack.records.redact import redact_run
        from memtrack.report.run import run_table
        from memtrack.store.save import record_run, record_to, save_run

        config, db = resolve(config_path, db_path, writes=not no_db)
        # The outputs are checked first, not after an hour of measuring, nor after the
        # suite's discovery (which waits on the server's imports).
        if json_path:
            check_json_folder(json_path)
        if against is not None and not is_revision(against):
            raise ConfigError(f"--against: {against!r} is not a git revision or 'merge-base'")
        explicit = against is not None
        against = None if unpaired else (against or config.against)
        start = RunStart(config, server)
        # A server's database is connected to only to be read before measuring and to be
        # written after it: a restart, a failover or an idle-session reaper while the suite
        # is discovered or measured changes nothing.
        server_db = isinstance(db, ServerUrl) and not no_db
        with contextlib.ExitStack() as stack:
            # An existing database is opened (and so checked) now; a new one is made only
            # once there is a case to measure.
            store = None
            if not no_db and present(db):
                store = stack.enter_context(open_store(db))
                store.check_writable()
                if server_db:
                    store.close()
            ref, unpaired_why = _paired_ref(config, against, explicit, start)
            reference = None
            if ref is not None:  # its server imports while this run's server does
                from memtrack.measure.pairs import reference as made_ready

                reference = stack.enter_context(made_ready(config, *ref))
            cases = _cases(config, start, patterns, shard_t)
            # the environment first (it waits on the probe): a server's connection is opened
            # only for the query, never left idle meanwhile (an idle-session timeout ends it)
            fingerprint = start.environment().fingerprint
            if (store is None or server_db) and not no_db:
                store = stack.enter_context(open_store(db))
            durations = (
                store.durations(fingerprint, [c.case_id for c in cases], RECENT_RUNS)
                if store is not None
                else {}
            )
            if server_db and store is not None:
                store.close()
            pairing: list[Pairing] = []

            def measure() -> RunRecord:
                run = _measure(config, cases, shard, start, reference, pairing, durations)
                return replace(run, selection=patterns)

            if server_db:
                done = record_to(redact_run(measure()), db, json_path)
            else:
                done = record_run(measure, store, json_path)
            saved_ref = None
            if pairing and pairing[0].ref_record is not None:
                ref_run = redact_run(pairing[0].ref_record)
                if server_db:
                    again = record_to(ref_run, db, _ref_json(json_path))
                    saved_ref = (list(again.saved), list(again.failures))
                else:
                    saved_ref = save_run(ref_run, store, _ref_json(json_path))
    rich_console().print(run_table(done.record))
    if against and config.time_regression == "off":
        click.echo("no paired timing: time_regression is off, so time is not judged")
    if unpaired_why:
        click.echo(unpaired_why)
    fail_on(_said(done, pairing[0] if pairing else None, saved_ref))


def _cases(
    config: Config, start: RunStart, patterns: tuple[str, ...], shard: tuple[int, int] | None
) -> list[Case]:
    """The cases to measure, discovered in the fork server; refused before anything runs:
    a budget naming no workload or case (it would guard nothing; a budget on a test, a node
    id 'file.py::test', is the plugin's to record), a selection of nothing, no commit."""
    from memtrack.judge.budgets import check_budget_targets

    workloads = start.workloads()
    tests = {b.workload for b in config.budgets if "::" in b.workload}
    check_budget_targets(
        config, {x for w in workloads for c in w.cases() for x in (w.name, c.case_id)} | tests
    )
    cases = select_cases(workloads, patterns, shard)
    if not cases:
        raise no_match(workloads, patterns)
    if start.git.commit is None:
        raise ConfigError(
            f"{config.root}: not inside a git repository with a commit: memtrack "
            "records every run against its commit (`git init` and a first commit)"
        )
    return cases


def _paired_ref(
    config: Config, against: str | None, explicit: bool, start: RunStart
) -> tuple[tuple[str, str] | None, str | None]:
    """REF of a paired timing (its commit and how it was chosen), resolved before an hour of
    measuring, or why the config's default measures unpaired."""
    if not against or config.time_regression == "off":
        return None, None
    from memtrack.measure.pairs import resolve_ref

    try:
        return resolve_ref(config, against, start.git), None
    except ConfigError as exc:
        if explicit:
            raise
        # the config's default pairs where it can: the base branch's first commit, a
        # shallow clone, a run of `against` itself measure unpaired
        return None, f"no paired timing (the config's against): {exc}"


def _said(
    done: Recorded, pairing: Pairing | None, saved_ref: tuple[list[str], list[str]] | None
) -> tuple[str, ...]:
    """Print where the run (and REF's timing passes) went; the failures to save them."""
    for line in pairing.lines if pairing else ():
        click.echo(line)
    commit = (done.record.git.commit or "no commit")[:12]
    click.echo(
        f"run {done.record.run_id} of {commit} recorded in {', '.join(done.saved) or 'nothing'}"
    )
    for line in done.said:
        click.echo(line)
    failures = list(done.failures)
    if saved_ref is not None and pairing is not None and pairing.ref_record is not None:
        ref_run = pairing.ref_record
        where, failed = saved_ref
        click.echo(
            f"run {ref_run.run_id} of {(ref_run.git.commit or '')[:12]} (its timing passes) "
            f"recorded in {', '.join(where) or 'nothing'}"
        )
        failures += failed
    return tuple(failures)


def _ref_json(json_path: Path | None) -> Path | None:
    """Where REF's run of a paired timing goes beside the run's JSON record: RUN.ref.json."""
    return json_path.with_name(f"{json_path.stem}.ref{json_path.suffix}") if json_path else None


def _measure(
    config: Config,
    cases: list[Case],
    shard: str | None,
    start: RunStart,
    against: Reference | None,
    pairing: list[Pairing],
    durations: Mapping[str, Sequence[float]],
) -> RunRecord:
    """The run's cases (`durations`: each one's recorded durations here, for its timeout),
    then (`against`: REF made ready, measure.pairs.reference) their paired timing, which goes into
    `pairing`."""
    from memtrack.measure.suite import run_suite  # imported once the server started (above)

    plain = plain_output()
    progress = progress_echo("running", plain)
    if plain:
        record = run_suite(
            config, cases, shard=shard, progress=progress, start=start, durations=durations
        )
    else:
        with rich_console(stderr=True).status("measuring ...") as status:

            def live(event: str, case: Case, m: Measurement | None) -> None:
                if event == "start":
                    status.update(f"measuring {case.case_id} ...")
                progress(event, case, m)

            record = run_suite(
                config, cases, shard=shard, progress=live, start=start, durations=durations
            )
    if against is None:
        return record
    from memtrack.measure.pairs import pair_cases
    from memtrack.measure.suite import resolve_device

    device = resolve_device(config, record.environment)
    done = pair_cases(
        config,
        cases,
        record,
        device,
        against,
        say=lambda line: click.echo(line, err=True),
    )
    pairing.append(done)
    return done.record
