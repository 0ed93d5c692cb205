from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from factories import GIT_ENV  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
