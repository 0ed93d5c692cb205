from __future__ import annotations

import ast
import functools
import gc
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# One intra-op thread in every process the tests start (pytest-xdist's workers, `memtrack
# run`, its fork server and cases): the workers already keep every core busy, and torch's
# OpenMP threads, spinning while they wait for work, took a sixth of the suite's CPU time.
# Set before anything imports torch; a value set by whoever runs the tests is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Runs a test's database could not take are kept in a spool of the test session's own, never
# in the user's cache (memtrack.store.spool), and a server is waited for a few seconds only.
os.environ.setdefault(
    "MEMTRACK_SPOOL", str(Path(tempfile.gettempdir()) / f"memtrack-spool-{os.getpid()}")
)
os.environ.setdefault("MEMTRACK_SERVER_RETRY_S", "3")

from memtrack.worker.server import YOUNG_ONLY  # noqa: E402

# No full collection while collection imports (torch, Streamlit, every test module): each one
# walks the whole heap again. The young generations are collected as ever, as the fork server
# collects them; what was imported is frozen, and the thresholds given back, once collection
# ends (pytest_collection_finish).
THRESHOLDS = gc.get_threshold()
gc.set_threshold(*YOUNG_ONLY)

import machine_share  # noqa: E402
from factories import GIT_ENV  # noqa: E402

pytest_plugins = ["timeouts"]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef, scope: str | None = None) -> bool:
    for d in fn.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        target = call.func if call else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name != "fixture":
            continue
        if scope is None:
            return True
        return any(
            k.arg == "scope" and isinstance(k.value, ast.Constant) and k.value.value == scope
            for k in (call.keywords if call else [])
        )
    return False


@functools.cache
def tests_sharing_a_module_fixture(path: Path) -> frozenset[str]:
    """The names of the tests in the file at `path` that use a module-scoped fixture of
    that file (a recorded run, a built wheel: seconds to make), directly or through
    another of its fixtures. Read from the source: pytest-xdist's controller collects
    nothing."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    functions = [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    requests = {fn.name: {a.arg for a in fn.args.args + fn.args.kwonlyargs} for fn in functions}
    shared = {fn.name for fn in functions if _is_fixture(fn, "module")}
    fixtures = [fn.name for fn in functions if _is_fixture(fn)]
    grew = True
    while grew:  # a fixture that requests a shared one is shared too
        grew = False
        for name in fixtures:
            if name not in shared and requests[name] & shared:
                shared.add(name)
                grew = True
    return frozenset(
        fn.name
        for fn in functions
        if fn.name.startswith("test") and not _is_fixture(fn) and requests[fn.name] & shared
    )


# `pytest -n N` (pytest-xdist) hands out the tests that share a module's fixture as one unit,
# to one worker, so that the fixture is made once, not once on each worker that runs one of
# them; every other test is a unit of its own, the largest units first. This is what
# `--dist loadgroup` did with a marker, until pytest 9.2 stopped reading the group xdist
# appends to a test's id: then every such fixture was made on each worker (a seventh of the
# suite's CPU time). `--dist` named on the command line is obeyed. Without pytest-xdist (a
# GPU machine's image) none of this applies.


def _group_of(rootpath: Path, nodeid: str) -> str:
    path, _, rest = nodeid.partition("::")
    test = rest.rsplit("::", 1)[-1].split("[", 1)[0]
    if path.endswith(".py") and test in tests_sharing_a_module_fixture(rootpath / path):
        return path
    return nodeid


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist picks its default, `load`
def pytest_cmdline_main(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadscope"
        config.option.memtrack_units = True


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if not getattr(config.option, "memtrack_units", False):
        return None  # the `--dist` the command line named
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(config.rootpath, nodeid)

    return SharedFixtureUnits(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the cores this process may run on. The tests wait a
    sixth of their time (on the processes they start, a browser, a server), and the extra
    worker fills it: on 2 cores the suite took 397 s with 2 workers, 376 s with 3.
    PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own reading of it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 1


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, Streamlit, every test module: some 290,000 objects)
    lives as long as the process: frozen, no collection of the oldest generation walks it
    again. The in-process tests spent half as long in the garbage collector (2.3 to 1.1 s on
    the records, dashboard and config modules)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _machine_share(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A `quiet` test has the machine to itself; any other shares it (tests.machine_share)."""
    quiet = request.node.get_closest_marker("quiet") is not None
    with machine_share.share(machine_share.session_folder(tmp_path_factory), quiet):
        yield


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in GIT_ENV.items():
        monkeypatch.setenv(k, v)
    # GitHub Actions variables from the outer CI must not leak into what tests record.
    for k in list(os.environ):
        if k.startswith("GITHUB_"):
            monkeypatch.delenv(k)


@pytest.fixture(autouse=True, scope="session")
def _streamlit_scans_the_installed_packages_once() -> None:
    """Streamlit's AppTest, at each new AppTest's first run, reads the metadata of every
    installed distribution for components to register: a tenth of a second, as long as a
    dashboard page takes, and a dashboard test makes an AppTest per page. The installed
    packages do not change while the tests run, so the real scan runs once per process and
    its answer is reused (where Streamlit has no such scan, nothing is changed)."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:
        return
    scan = getattr(manifest_scanner, "scan_component_manifests", None)
    if callable(scan) and not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)


FAKE_NVML_DIR = Path(__file__).parent / "fakenvml"


@pytest.fixture
def nvml_with_a_failing_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's stand-in (this machine has no GPU), for this process and its children: two
    H200s; the second refuses memory info (a MIG GPU in a container, unprivileged)."""
    gib = 2**30
    scenario = {
        "devices": [
            {"uuid": "GPU-a", "name": "NVIDIA H200", "total": 141 * gib, "used": gib},
            {
                "uuid": "GPU-b",
                "name": "NVIDIA H200",
                "total": 141 * gib,
                "used": gib,
                "mig": "enabled",
                "fail": ["memory"],
            },
        ]
    }
    (tmp_path / "nvml.json").write_text(json.dumps(scenario))
    monkeypatch.setenv("FAKE_NVML", str(tmp_path / "nvml.json"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_NVML_DIR), *sys.path]))


@pytest.fixture(scope="session")
def pg_cluster() -> Any:
    """A PostgreSQL server of this test session's own (tests/pgcluster.py). Skipped, with
    the reason, where none can be started; in CI (`CI=true`, as `.ci/run` runs) a missing
    server fails instead, so the server tests always run there."""
    import pgcluster

    why = pgcluster.unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no PostgreSQL for the server tests: {why}")
        pytest.skip(f"no PostgreSQL for the server tests: {why}")
    cluster = pgcluster.Cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """The URL (password included) of a new, empty PostgreSQL database."""
    return str(pg_cluster.database())
