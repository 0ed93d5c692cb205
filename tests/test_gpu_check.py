"""scripts/gpu-check.sh, the one script a GPU session runs: its exit status must say whether
every step ended as it should. Run here with stand-ins for `python3` and `nvidia-smi` (this
machine has no GPU), with real bash and git."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check.sh"

# Succeeds at everything but the GPU tests.
PYTHON = """#!/bin/sh
case "$*" in *"-m pytest"*) echo "1 failed"; exit 1;; esac
exit 0
"""


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", PYTHON), ("nvidia-smi", "#!/bin/sh\necho 'NVIDIA H200'\n")):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "WHEELS")}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "OUT": str(tmp_path / "out")}


def test_gpu_check_exits_1_when_the_gpu_tests_fail_and_still_runs_every_step(tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT)], env=_stand_ins(tmp_path), capture_output=True, text=True
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: gpu-tests: exit 1, should be 0" in out.stdout
    steps = (tmp_path / "out" / "steps.log").read_text()
    for name in ("doctor", "gpu-tests", "run-1", "check-2", "check-grow", "run-probe", "summary"):
        assert f"== {name}\n" in steps
    # the step that must block (64 MiB more) is held to exit 1: a stand-in that says 0 fails it
    assert "FAILED: check-grow: exit 0, should be 1" in out.stdout
