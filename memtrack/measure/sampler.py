"""The parent's client of the NVML sampler: a separate process (`python -m memtrack.probes.nvml`)
that polls the device view while a case runs, so that polling never competes with the
measured process for its GIL. Told each worker's PID as it starts, each descendant's as the
launcher finds it, and the memory pass's window at the end. Its clock file (`clock_path`)
tells the workers when it has sampled: a worker holds its level after the memory pass until
two samples were taken (probes.nvml.wait_for_rounds)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from memtrack.probes.nvml import SamplerResult
from memtrack.worker.protocol import ProtocolError, read_typed

START_TIMEOUT_S = 60.0
"""NVML's first initialisation can take seconds per GPU when persistence mode is off."""
STOP_TIMEOUT_S = 60.0


class NvmlSampler:
    """One sampler process for one case. `start()` returns whether it runs; where it does
    not, `stop()` returns why, as the device view's note."""

    def __init__(
        self, interval_s: float, uuids: tuple[str, ...], timeout_s: float = START_TIMEOUT_S
    ):
        self.interval_s = interval_s
        self.uuids = uuids
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.first = SamplerResult(reason="the NVML sampler was not started")
        self.watched: set[int] = set()
        self.folder: Path | None = None

    @property
    def clock_path(self) -> Path | None:
        """The running sampler's clock file, which the workers read; None when not running."""
        return self.folder / "clock" if self.proc is not None and self.folder else None

    def start(self) -> bool:
        self.folder = Path(tempfile.mkdtemp(prefix="memtrack-nvml-"))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memtrack.probes.nvml",
                "--interval",
                str(self.interval_s),
                "--clock",
                str(self.folder / "clock"),
                "--parent",
                str(os.getpid()),
                *self.uuids,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        if not select.select([proc.stdout], [], [], self.timeout_s)[0]:  # a hung nvmlInit
            proc.kill()
            proc.wait()
            self.first = SamplerResult(
                reason=f"the NVML sampler did not start within {self.timeout_s:g} s"
            )
            self._remove_folder()
            return False
        line = proc.stdout.readline()
        if not line:
            self.first = SamplerResult(reason="the NVML sampler died at start")
        else:
            self.first = _read(line) or _said(line)
        if not self.first.ok:
            proc.kill()
            proc.wait()
            self._remove_folder()
            return False
        self.proc = proc
        return True

    def watch(self, pid: int) -> None:
        """A process of the case (a worker, a rank, a descendant of one: a compile worker)
        whose own device memory counts. Each is told once."""
        if self.proc is None or pid in self.watched:
            return
        self.watched.add(pid)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{pid}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # the sampler died: stop() says so
            pass

    def stop(self, window: tuple[float, ...] | None = None) -> SamplerResult:
        """The sampler's result; `window` is the memory pass [start, end] or [start, last
        iteration, end of the hold] (time.monotonic())."""
        proc, first = self.proc, self.first
        if proc is None:
            return first
        self.proc = None
        commands = "stop\n"
        if window is not None and len(window) in (2, 3):
            commands = f"window {' '.join(repr(float(t)) for t in window)}\n" + commands
        try:
            out, _ = proc.communicate(commands, timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return SamplerResult(
                reason=f"the NVML sampler did not stop within {STOP_TIMEOUT_S:g} s"
            )
        finally:
            self._remove_folder()
        lines = out.strip().splitlines()
        result = _read(lines[-1]) if lines else None
        if result is None:
            return SamplerResult(reason=f"the NVML sampler exited with {proc.returncode}")
        return result

    def _remove_folder(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _read(line: str) -> SamplerResult | None:
    """The sampler's line as its typed answer; None where it is not one."""
    try:
        return read_typed(SamplerResult, json.loads(line), "sampler")
    except (ValueError, ProtocolError):  # JSONDecodeError is a ValueError
        return None


def _said(line: str) -> SamplerResult:
    return SamplerResult(reason=f"the NVML sampler said {line.strip()[:200]!r}")


def start_sampler(device: str, interval_s: float, uuids: tuple[str, ...]) -> NvmlSampler | None:
    """The case's sampler on CUDA (started; one that failed to start still says why), none on
    the CPU."""
    if device != "cuda":
        return None
    sampler = NvmlSampler(interval_s, uuids)
    sampler.start()
    return sampler


__all__ = ["START_TIMEOUT_S", "NvmlSampler", "start_sampler"]
