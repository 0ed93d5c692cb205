"""`--memtrack` in the controlling process: the config and database resolved and the git facts
taken at the session's start (a problem ends the session before any test runs, exit status
2); the measured tests' reports gathered; the environment taken and one run recorded at the
end, through the store's `record_run`, as `memtrack run` records one. Imported only where
--memtrack is given: what recording needs is loaded before the tests, not after them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memtrack.commands.options import resolve
from memtrack.errors import MemtrackError, StoreError
from memtrack.machine import environment, provenance
from memtrack.plugin.record import FIGURES, make_run, outcome_of, selection_of, test_id
from memtrack.records import now
from memtrack.store.opening import open_store
from memtrack.store.save import record_run
from memtrack.store.url import parse_database


class Recorder:
    """Registered as a plugin where --memtrack is given, in the controlling process only."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.reports: dict[str, list[pytest.TestReport]] = {}
        self.ready = False
        self.lines: list[str] = []
        self.failed = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        option = self.config.option
        config_path = Path(option.memtrack_config) if option.memtrack_config else None
        try:
            db_path = (
                parse_database(option.memtrack_db, "--memtrack-db") if option.memtrack_db else None
            )
            self.mt_config, self.db = resolve(config_path, db_path, writes=True)
            self.git = provenance.git_info(
                self.mt_config.root,
                self.mt_config.base_branch,
                repository=self.mt_config.repository,
            )
            if self.git.commit is None:
                raise MemtrackError(
                    f"{self.mt_config.root}: not inside a git repository with a commit: "
                    "memtrack records every run against its commit"
                )
            with open_store(self.db) as store:  # refused now, not after the suite ran
                store.check_writable()
        except MemtrackError as exc:
            pytest.exit(f"memtrack: {exc}", returncode=2)
        top = provenance.git_output(self.mt_config.root, "rev-parse", "--show-toplevel")
        self.top = Path(top) if top else None
        self.started_at = now()
        self.ready = True

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if getattr(report, FIGURES, None) is not None:
            self.reports.setdefault(report.nodeid, []).append(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.ready:
            return
        self.ready = False
        try:
            self._record()
        except (MemtrackError, OSError) as exc:
            self.lines.append(f"memtrack: no run recorded: {exc}")
            self.failed = True
        if self.failed:
            session.exitstatus = 2

    def _record(self) -> None:
        rootdir = self.config.rootpath
        outcomes = [
            o
            for n, rs in self.reports.items()
            if (o := outcome_of(test_id(n, rootdir, self.top), rs)) is not None
        ]
        # Here, at the end: pytest's process ran the tests (torch imported, CUDA started
        # where they used it), and a probe beside them would take their CPUs.
        # as plain JSON data, as a probe's process hands it over (torch's version is a str
        # subclass, which a record refuses)
        env = environment.from_dict(json.loads(json.dumps(environment.collect())))
        if not outcomes:
            self.lines.append("memtrack: no test was measured: no run recorded")
            return
        run = make_run(
            outcomes,
            started_at=self.started_at,
            finished_at=now(),
            git=self.git,
            ci=provenance.ci_info(),
            environment=env,
            config_path=str(self.mt_config.path) if self.mt_config.path else None,
            selection=selection_of(self.config.option, self.config.args),
        )
        with open_store(self.db) as store:
            done = record_run(lambda: run, store, None)
        commit = (done.record.git.commit or "no commit")[:12]
        where = ", ".join(done.saved) or "nothing"
        self.lines.append(
            f"memtrack: run {done.record.run_id} of {commit}: "
            f"{len(done.record.measurements)} tests recorded in {where}"
        )
        if done.failures:
            self.lines.append(f"memtrack: {StoreError('; '.join(done.failures))}")
            self.failed = True

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.lines:
            terminalreporter.write_line(line)


__all__ = ["Recorder"]
