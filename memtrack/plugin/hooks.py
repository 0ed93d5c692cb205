"""pytest's hooks: read the budgets at collection, measure a test's body (in pytest's process,
or in a process forked for it), fail it over its budget, and, with `--memtrack`, record every
measured test as a case of one run for the commit.

Who does what: the process that runs a test measures it and puts the figures on the test's
reports (plain data, so that pytest-xdist carries them from its workers); the controlling
process (pytest's own, or xdist's controller) gathers the reports and records one run at the
session's end. torch is imported only when a test is measured.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Generator
from typing import Any

import pytest

from memtrack.errors import MemtrackError
from memtrack.plugin import budget as budgets
from memtrack.plugin.record import FIGURES
from memtrack.probes.span import SpanFigures, SpanProbe

SITES = 5
"""Sites shown per grouping in a failing budget's message (and one line for the rest)."""
_budget_key = pytest.StashKey[budgets.MemoryBudget | None]()
_figures_key = pytest.StashKey[SpanFigures]()
_over_key = pytest.StashKey[str]()
_auto_key = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memtrack", "memory budgets and history (memtrack)")
    group.addoption(
        "--memtrack",
        action="store_true",
        help="Measure every test and record it as a case of one run for this commit, into "
        "the configured memtrack database (`memtrack check` gates it).",
    )
    group.addoption(
        "--memtrack-marked",
        action="store_true",
        help="With --memtrack: measure and record only the tests with a memory_budget mark.",
    )
    group.addoption(
        "--memtrack-forked",
        action="store_true",
        help="Run each measured test in its own process, forked from pytest's before it: "
        "figures of the test alone (fixtures are set up in that process again).",
    )
    group.addoption(
        "--memtrack-device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="Where a test without a device in its budget is measured: cuda where torch sees "
        "a GPU, else cpu (auto, the default).",
    )
    group.addoption(
        "--memtrack-config",
        metavar="PATH",
        help="memtrack.toml or pyproject.toml (default: found from the current directory).",
    )
    group.addoption(
        "--memtrack-db",
        metavar="PATH",
        default=os.environ.get("MEMTRACK_DB") or os.environ.get("MEMTRACK_DATABASE_URL"),
        help="SQLite file or postgresql:// URL (default: $MEMTRACK_DB, "
        "$MEMTRACK_DATABASE_URL, else the config's `database`).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", budgets.MARK_HELP)
    if config.option.memtrack_forked and not hasattr(os, "fork"):
        raise pytest.UsageError("--memtrack-forked: this platform cannot fork a process")
    if config.option.memtrack:
        from memtrack.measure.launcher import pin_this_process

        # the runner's allocator setting: the tests' figures, and the environment they are
        # recorded with (its fingerprint, the baseline's key), are then the workloads'
        pin_this_process()
    if config.option.memtrack and not hasattr(config, "workerinput"):
        from memtrack.plugin.session import Recorder

        config.pluginmanager.register(Recorder(config), "memtrack-recorder")


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(
    collector: pytest.Collector, name: str, obj: object
) -> Generator[None, Any, Any]:
    """A budget that cannot be read is this module's collection error, naming the test and
    the value."""
    made = yield
    items = made if isinstance(made, list) else [made]
    for item in items:
        if isinstance(item, pytest.Item):
            _read_budget(item)
    return made


def _read_budget(item: pytest.Item) -> None:
    marks = list(item.iter_markers(budgets.MARK))
    if not marks:
        item.stash[_budget_key] = None
        return
    mark = marks[0]  # the closest: a test's own mark overrides its class's and module's
    try:
        item.stash[_budget_key] = budgets.read_mark(tuple(mark.args), dict(mark.kwargs))
    except MemtrackError as exc:
        raise pytest.Collector.CollectError(
            f"{item.nodeid}: @pytest.mark.{budgets.MARK}: {exc}"
        ) from None


def _budget(item: pytest.Item) -> budgets.MemoryBudget | None:
    if _budget_key not in item.stash:  # an item no Python collector made (a plugin's)
        _read_budget(item)
    return item.stash[_budget_key]


def measured(item: pytest.Item) -> bool:
    """A test with a budget, and with --memtrack every test (or the marked ones)."""
    option = item.config.option
    if _budget(item) is not None:
        return True
    return bool(option.memtrack) and not option.memtrack_marked


def _device(item: pytest.Item) -> str:
    b = _budget(item)
    if b is not None and b.device is not None:
        return b.device
    chosen = item.config.option.memtrack_device
    if chosen != "auto":
        return str(chosen)
    if _auto_key not in item.config.stash:  # asked once a session: the answer stands
        import torch

        item.config.stash[_auto_key] = "cuda" if torch.cuda.is_available() else "cpu"
    return item.config.stash[_auto_key]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if not measured(item):
        return (yield)
    probe = SpanProbe(_device(item))
    try:
        with probe.span():
            result = yield
    finally:
        if probe.figures is not None:
            item.stash[_figures_key] = probe.figures
    b = _budget(item)
    if b is not None and probe.figures is not None:
        verdict = budgets.judge(b, probe.figures)
        if verdict.over:
            item.stash[_over_key] = verdict.headline()
            pytest.fail(_failure_message(item, verdict), pytrace=False)
    return result


def _failure_message(item: pytest.Item, verdict: budgets.BudgetVerdict) -> str:
    lines = [verdict.headline(), *budgets.views_lines(verdict.figures)]
    if verdict.value is not None and verdict.figures.device == "cpu":
        lines += _sites(item, verdict.figures.allocated_bytes)
    return "\n".join(lines)


def _sites(item: pytest.Item, peak: int | None) -> list[str]:
    """The sites of the peak, from the test's body run once more with them recorded: the
    Python stack read for every tensor an op makes slows a test several times over, so
    only a test over its budget pays for them (probes.sites)."""
    import torch

    from memtrack.probes.framework import pushed
    from memtrack.probes.sites import recording, sites

    try:
        cpu = torch.device("cpu")
        with recording(cpu, (), item.config.rootpath, setup=False) as mode, pushed(mode):
            item.runtest()
    except Exception as exc:  # the test's own failure, the second time: no sites, said so
        return [f"no sites: the test's body failed when run again to find them ({exc!r:.200})"]
    found = sites(mode, peak, top=SITES, upto=SITES)  # shown, not kept
    return budgets.sites_lines(found, max(peak or 0, mode.peak))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    # the call's report, and a setup's or teardown's that did not pass: the rest tell nothing
    if measured(item) and (call.when == "call" or not report.passed):
        figures = item.stash.get(_figures_key, None) if call.when == "call" else None
        setattr(
            report,
            FIGURES,
            {
                "figures": None if figures is None else figures.to_dict(),
                "over": item.stash.get(_over_key, None) if call.when == "call" else None,
                "forked": bool(item.config.option.memtrack_forked),
                "budget": _budget_data(_budget(item)) if call.when == "call" else None,
            },
        )
    return report


def _budget_data(b: budgets.MemoryBudget | None) -> dict[str, Any] | None:
    """The mark as plain data for the test's record (`memtrack check` holds the test to it)."""
    if b is None:
        return None
    return {"limit_bytes": b.limit_bytes, "metric": b.metric, "device": b.device}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """--memtrack-forked: a measured test runs in a child forked for it; its reports come
    back through a pipe, and the parent logs them as its own."""
    if not item.config.option.memtrack_forked or not measured(item):
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run_forked(item):
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_forked(item: pytest.Item) -> list[pytest.TestReport]:
    from _pytest.runner import runtestprotocol

    config = item.config
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run the test, send its reports, and end without cleanup
        code = 0
        try:
            os.close(read)
            reports = runtestprotocol(item, log=False)
            hook = config.hook.pytest_report_to_serializable
            data = [hook(config=config, report=r) for r in reports]
            payload = json.dumps(data).encode()
            view = memoryview(payload)
            while view:
                view = view[os.write(write, view) :]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        while chunk := pipe.read(1 << 16):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if chunks and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return [
            config.hook.pytest_report_from_serializable(config=config, data=d)
            for d in json.loads(b"".join(chunks))
        ]
    return [_crashed(item, status)]


def _crashed(item: pytest.Item, status: int) -> pytest.TestReport:
    if os.WIFSIGNALED(status):
        why = f"the test's process was ended by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        why = f"the test's process exited with status {os.WEXITSTATUS(status)} before reporting"
    report = pytest.TestReport(
        item.nodeid, item.location, {}, "failed", why, "call", user_properties=[]
    )
    setattr(report, FIGURES, {"figures": None, "over": None, "forked": True, "crashed": True})
    return report


__all__ = ["measured"]
