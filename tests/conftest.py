from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# One intra-op thread in every process the tests start (pytest-xdist's workers, `memtrack
# run`, its fork server and cases): the workers already keep every core busy, and torch's
# OpenMP threads, spinning while they wait for work, took a sixth of the suite's CPU time.
# Set before anything imports torch; a value set by whoever runs the tests is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from factories import GIT_ENV  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture of its own module (a recorded run, a
    built wheel: seconds to make)."""
    module = getattr(item, "module", None)
    info = getattr(item, "_fixtureinfo", None)
    if module is None or info is None:
        return False
    return any(
        d.scope == "module" and getattr(d.func, "__module__", None) == module.__name__
        for defs in info.name2fixturedefs.values()
        for d in defs
    )


# `pytest -n N` (pytest-xdist) distributes the tests by group unless told otherwise: the tests
# that share a module's fixture run on one worker, so that the fixture is made once, not once
# on each worker. Without pytest-xdist (a GPU machine's image) none of this applies.


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist picks its default, `load`
def pytest_cmdline_main(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadgroup"


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


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(the controller) A worker parses the command line anew, without the choice above."""
    node.workerinput["memtrack_loadgroup"] = node.config.option.dist == "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config, "workerinput", {}).get("memtrack_loadgroup"):
        config.option.loadgroup = True  # the worker names each test's group (xdist_group)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if _shares_a_module_fixture(item):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
