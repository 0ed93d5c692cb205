"""Device view: NVML sampled from a separate process, per visible device, matched by UUID.

A thread inside the measured process would fight its GIL, so the runner starts this module
as its own process (`python -m memtrack.probes.nvml --interval S UUID...`), naming the
devices torch sees: NVML ignores CUDA_VISIBLE_DEVICES and numbers devices its own way, so
only those UUIDs are watched, numbered as torch numbers them. Protocol over stdin/stdout,
one line each way:
  sampler -> runner: a `SamplerResult` as JSON, without figures: ready, or the `reason` why
                     it cannot sample
  runner -> sampler: a PID to watch (a worker, a rank, or one of their descendants), at any
                     time; "window T0 T1 [T2]" (the memory pass, in time.monotonic, which is
                     system-wide on Linux: T1 its last synchronised iteration, T2 the end of
                     the hold after it); then "stop" (or EOF)
  sampler -> runner: the `SamplerResult` as JSON: a `SampledDevice` per device, the notes,
                     the period achieved (the runner reads it with worker.protocol.read_typed)
With `--clock PATH` the sampler also writes "ROUNDS STAMP" to PATH (atomically) after each
round over the devices, so that a worker can hold its level until two rounds have begun
after its memory pass (`wait_for_rounds`): a pass shorter than the interval then still has
samples. Sampling is sampling: a spike shorter than the interval can be missed; the runner
compares the sampled peak with the allocator's exact reserved peak and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memtrack.probes.tree import die_with_parent

Sample = tuple[float, "int | None", "int | None"]
"""(monotonic time, device-wide used, the watched processes' used: 0 when absent)."""


@dataclass(frozen=True)
class SampledDevice:
    """One watched device's figures over a case: the NVML side of a DeviceMeasurement."""

    index: int
    """As torch numbers the visible devices."""
    uuid: str
    """NVML's UUID for the device (a MIG instance's MIG-..., which torch spells GPU-...)."""
    name: str | None
    total_bytes: int | None
    """Memory a process can use (v2's total less what the driver keeps for itself)."""
    used_before_bytes: int | None = None
    """Device-wide used memory at the sampler's start."""
    peak_device_used_bytes: int | None = None
    peak_process_bytes: int | None = None
    """The watched processes' peak (`process_view` says how it was taken)."""
    memory_pass_peak_bytes: int | None = None
    """The same within the memory pass; None where no sample fell inside it."""
    quiet_process_bytes: int | None = None
    """The last sample of the hold after the memory pass: the level at a quiet moment."""
    process_view: str | None = None
    """'pid', or 'device-delta' where no watched PID was found on any device."""
    samples: int = 0


@dataclass(frozen=True)
class SamplerResult:
    """The sampler's answer: each watched device's figures and its notes, or why it gives
    none (`reason`: NVML unavailable, a GPU in MIG mode, a sampler that did not start)."""

    devices: tuple[SampledDevice, ...] = ()
    notes: tuple[str, ...] = ()
    achieved_interval_s: float | None = None
    """The sampling period achieved, first to last round; None with fewer than two."""
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


@dataclass
class _Watched:
    """A device while it is sampled: what it is, and its samples so far."""

    index: int
    uuid: str
    name: str | None
    total_bytes: int | None
    used_before_bytes: int | None
    samples: list[Sample] = field(default_factory=list)


def guarded(notes: list[str], what: str, query: Callable[..., Any], *args: Any) -> Any:
    """query(*args), or None and a note: one failing query (memory info of a MIG GPU in a
    container needs privileges) must not take the other figures with it."""
    try:
        return query(*args)
    except Exception as exc:
        note = f"{what} unavailable ({type(exc).__name__}: {exc})"
        if note not in notes:
            notes.append(note)
        return None


def memory_info(nvml: Any, handle: Any, notes: list[str], what: str, v2: bool | None = None) -> Any:
    """Memory info, v2 where the driver has it: v2 reports driver-reserved memory apart from
    `used`, v1 folds it in. `v2` decided already (a sampler decides once: see Sampler), or
    None for a one-off reading that falls back to v1."""
    if v2 is None:
        try:
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        except Exception:
            return guarded(notes, f"{what} memory info", nvml.nvmlDeviceGetMemoryInfo, handle)
    if v2:
        return guarded(
            notes, f"{what} memory info", nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2
        )
    return guarded(notes, f"{what} memory info", nvml.nvmlDeviceGetMemoryInfo, handle)


def bare_uuid(uuid: str | None) -> str | None:
    """A device's UUID without its GPU- or MIG- prefix: torch spells a MIG instance GPU-...,
    NVML MIG-..., for the same hex."""
    if uuid is None:
        return None
    return uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid


def usable_total(info: Any) -> int | None:
    """Memory a process can use: v2's total includes what the driver keeps for itself."""
    if info is None:
        return None
    return int(info.total) - int(getattr(info, "reserved", 0) or 0)


def resolve(nvml: Any, uuid: str) -> Any:
    """NVML's handle for a device torch names by UUID: a GPU or a MIG instance (torch may
    spell a MIG instance's UUID with a GPU- prefix)."""
    bare = bare_uuid(uuid)
    for form in (f"GPU-{bare}", f"MIG-{bare}"):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(form)
        except Exception:
            continue
    raise RuntimeError(f"NVML does not know device {uuid}")


def is_mig_parent(nvml: Any, handle: Any) -> bool:
    """A GPU split into MIG instances: its device-wide figures span all of them."""
    try:
        if nvml.nvmlDeviceIsMigDeviceHandle(handle):
            return False
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        return bool(current)
    except Exception:  # not supported on this GPU: it has no MIG mode
        return False


def decide_v2(nvml: Any, handle: Any, notes: list[str], what: str) -> tuple[bool, Any]:
    """Whether this device's memory info is read as v2 for the whole case, and the first
    reading. Decided once: v1's `used` includes driver-reserved memory, so a case whose
    readings switched version on a transient failure would mix two figures."""
    try:
        return True, nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    except Exception as exc:
        notes.append(
            f"{what} memory info v2 unavailable ({type(exc).__name__}: {exc}): "
            "v1 is read, whose used memory includes what the driver reserves"
        )
    return False, memory_info(nvml, handle, notes, what, v2=False)


def mps_running() -> bool:
    """Whether an MPS control daemon serves this machine's CUDA clients: its control pipe is
    in CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps), as the clients find it."""
    folder = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return os.path.exists(os.path.join(folder, "control"))


class Sampler:
    """Peaks of device-wide and per-process used memory on the given devices. `nvml` is
    `pynvml` (or, in tests that run without a GPU, a stand-in with the same functions);
    `uuids` are the devices torch sees, in torch's order. Each device is recorded under the
    UUID NVML gives for its handle (a MIG instance's MIG-..., which torch spells GPU-...).

    Under MPS the list of compute processes holds the MPS server, not its clients: where
    MPS runs and the case's process is not in that list, NVML's list of MPS clients is
    asked too (only then: each list costs milliseconds)."""

    def __init__(self, nvml: Any, uuids: list[str]):
        if not uuids:
            raise RuntimeError("torch sees no CUDA device: nothing to sample")
        self.nvml = nvml
        self.notes: list[str] = []
        mps_list = getattr(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        self.mps_list = mps_list if mps_list is not None and mps_running() else None
        """NVML's list of MPS clients, where MPS runs; else None."""
        self.handles = [resolve(nvml, u) for u in uuids]
        self.v2: list[bool] = []
        self.rounds: list[float] = []
        """When each round over the devices ended (the achieved period is read from it)."""
        self.devices: list[_Watched] = []
        for index, (uuid, handle) in enumerate(zip(uuids, self.handles, strict=True)):
            if is_mig_parent(nvml, handle):
                raise RuntimeError(
                    f"device {index} ({uuid}) is a GPU in MIG mode: NVML's figures for it "
                    "span all its instances"
                )
            v2, info = decide_v2(nvml, handle, self.notes, f"GPU {index}")
            self.v2.append(v2)
            name = guarded(self.notes, f"GPU {index} name", nvml.nvmlDeviceGetName, handle)
            own = guarded(self.notes, f"GPU {index} UUID", nvml.nvmlDeviceGetUUID, handle)
            self.devices.append(
                _Watched(
                    index,
                    uuid if own is None else _text(own),
                    None if name is None else _text(name),
                    usable_total(info),
                    None if info is None else int(info.used),
                )
            )

    def sample(self, pids: set[int], clock: Callable[[], float] = time.monotonic) -> float:
        """One round over the devices; returns when it ended (clock())."""
        for dev, handle, v2 in zip(self.devices, self.handles, self.v2, strict=True):
            info = memory_info(self.nvml, handle, self.notes, f"GPU {dev.index}", v2)
            # Stamped after the reading: a figure read inside a window is stamped inside it.
            now = clock()
            used = None if info is None else int(info.used)
            dev.samples.append((now, used, self._process_bytes(dev.index, handle, pids)))
        end = clock()
        self.rounds.append(end)
        return end

    def achieved_interval_s(self) -> float | None:
        """The period achieved, first to last round: it grows with the number of devices (and
        the process lists' cost) and under gVisor, beyond the interval asked for."""
        if len(self.rounds) < 2:
            return None
        return (self.rounds[-1] - self.rounds[0]) / (len(self.rounds) - 1)

    def _process_bytes(self, index: int, handle: Any, pids: set[int]) -> int | None:
        """The watched processes' memory on this device: 0 when absent, None when unknown."""
        if not pids:
            return None
        procs = guarded(
            self.notes,
            f"GPU {index} process list",
            self.nvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
        )
        if procs is None:
            return None
        mine = [p.usedGpuMemory for p in procs if p.pid in pids]
        if not mine and self.mps_list is not None:
            clients = guarded(self.notes, f"GPU {index} MPS client list", self.mps_list, handle)
            mine = [p.usedGpuMemory for p in clients or () if p.pid in pids]
            note = f"GPU {index}: the case ran as an MPS client, read from NVML's MPS client list"
            if mine and note not in self.notes:
                self.notes.append(note)
        if any(b is None for b in mine):  # listed, but its memory is not reported
            return None
        return sum(int(b) for b in mine)

    def result(self, window: tuple[float, ...] | None = None) -> SamplerResult:
        """Per-device peaks, over the whole case and within `window`: the memory pass [T0,
        T1], or [T0, T1, T2] with the hold after it (T1 its last synchronised iteration);
        and, from the hold, each device's quiet level (the last sample after T1)."""
        # All or nothing: if the process was found on any device, the per-process view
        # holds everywhere (a device it never appeared on, it did not use). Found nowhere
        # (a container's PID namespace), every device falls back to its device-wide delta.
        by_pid = any(p for dev in self.devices for _, _, p in dev.samples)
        shared = (
            "MPS runs on this machine and NVML did not list the case's process: the "
            "device-wide deltas count every MPS client's memory"
        )
        if not by_pid and self.mps_list is not None and shared not in self.notes:
            self.notes.append(shared)
        devices = []
        first, last = (window[0], window[-1]) if window else (0.0, 0.0)
        hold = window[1] if window and len(window) == 3 else None
        for dev in self.devices:
            samples = dev.samples
            inside = [s for s in samples if window and first <= s[0] <= last]
            quiet = [s for s in inside if hold is not None and s[0] > hold]
            if window and not inside:
                self.notes.append(
                    f"GPU {dev.index}: no sample fell inside the memory pass "
                    f"({(last - first) * 1e3:.1f} ms): no device figure for it"
                )
            used = [u for _, u, _ in samples if u is not None]
            before = dev.used_before_bytes
            devices.append(
                SampledDevice(
                    index=dev.index,
                    uuid=dev.uuid,
                    name=dev.name,
                    total_bytes=dev.total_bytes,
                    used_before_bytes=before,
                    peak_device_used_bytes=max([*used, before or 0]) if used else before,
                    peak_process_bytes=_peak(samples, by_pid, before),
                    memory_pass_peak_bytes=_peak(inside, by_pid, before),
                    quiet_process_bytes=_peak(quiet[-1:], by_pid, before),
                    process_view="pid" if by_pid else "device-delta",
                    samples=len(samples),
                )
            )
        return SamplerResult(tuple(devices), tuple(self.notes), self.achieved_interval_s())


def _peak(samples: list[Sample], by_pid: bool, before: int | None) -> int | None:
    if by_pid:
        values = [p for _, _, p in samples if p is not None]
    else:
        values = [max(0, u - before) for _, u, _ in samples if u is not None and before is not None]
    return max(values) if values else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def write_clock(path: str, rounds: int, stamp: float) -> None:
    """'ROUNDS STAMP' into `path`, atomically: a reader sees one whole line or the last."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{rounds} {stamp!r}\n")
    os.replace(tmp, path)


def read_clock(path: str) -> tuple[int, float] | None:
    """(rounds, when the last ended) from a sampler's clock file; None before its first."""
    try:
        with open(path) as f:
            rounds, stamp = f.read().split()
        return int(rounds), float(stamp)
    except (OSError, ValueError):
        return None


def wait_for_rounds(
    path: str,
    after: float,
    limit_s: float,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> float | None:
    """Wait until the sampler writing `path` has completed a round that began after `after`
    (two ends after it: the second round began after the first ended), at most `limit_s`.
    Returns when the wait ended (clock()), or None when the rounds did not come in time."""
    deadline = after + limit_s
    first: int | None = None
    while True:
        seen = read_clock(path)
        if seen is not None and seen[1] > after:
            if first is None:
                first = seen[0]
            elif seen[0] > first:
                return clock()
        if clock() > deadline:
            return None
        pause(0.001)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NVML sampler (started by memtrack's runner)")
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--clock", help="write 'ROUNDS STAMP' here after every round")
    parser.add_argument("--parent", type=int, help="the runner's pid: die with it")
    parser.add_argument("uuids", nargs="*", help="the devices torch sees, in its order")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent(args.parent)
    # A terminal's ^C, ^\ and hangup are the runner's to handle: it stops this sampler.
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        print(SamplerResult(reason=f"NVML unavailable: {exc}").to_json(), flush=True)
        return 0
    try:
        sampler = Sampler(pynvml, args.uuids)
    except Exception as exc:  # no device torch sees, or one NVML cannot attribute (MIG)
        print(SamplerResult(reason=f"no device view: {exc}").to_json(), flush=True)
        pynvml.nvmlShutdown()
        return 0
    pids: set[int] = set()
    window: list[float] = []
    stop = threading.Event()

    def read_commands() -> None:
        for line in sys.stdin:
            words = line.split()
            if words == ["stop"]:
                break
            if len(words) == 1 and words[0].isdigit():
                pids.add(int(words[0]))
            elif len(words) in (3, 4) and words[0] == "window":
                try:
                    window[:] = [float(w) for w in words[1:]]
                except ValueError:
                    pass  # no window: the memory pass's figures stay absent
        stop.set()

    threading.Thread(target=read_commands, daemon=True).start()
    print(SamplerResult().to_json(), flush=True)  # ready
    while not stop.is_set():
        stamp = sampler.sample(set(pids))
        if args.clock:
            write_clock(args.clock, len(sampler.rounds), stamp)
        time.sleep(args.interval)
    sampler.sample(set(pids))
    result = sampler.result(tuple(window) if window else None)
    print(result.to_json(), flush=True)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
