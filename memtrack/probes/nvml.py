"""Device view: NVML sampled from a separate process, per visible device, matched by UUID.

A thread inside the measured process would fight its GIL, so the runner starts this module
as its own process (`python -m memtrack.probes.nvml --interval S UUID...`), naming the
devices torch sees: NVML ignores CUDA_VISIBLE_DEVICES and numbers devices its own way, so
only those UUIDs are watched, numbered as torch numbers them. Protocol over stdin/stdout,
one JSON line each way:
  sampler -> runner: {"ok": true, "interval_s": ...}  or  {"ok": false, "reason": "..."}
  runner -> sampler: the PID to watch; "window T0 T1" (the memory pass, in time.monotonic,
                     which is system-wide on Linux); then "stop" (or EOF)
  sampler -> runner: {"devices": [...], "notes": [...]}
Sampling is sampling: a spike shorter than the interval can be missed; the runner compares
the sampled peak with the allocator's exact reserved peak and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

Sample = tuple[float, "int | None", "int | None"]
"""(monotonic time, device-wide used, the watched processes' used: 0 when absent)."""


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


def memory_info(nvml: Any, handle: Any, notes: list[str], what: str) -> Any:
    # v2 reports driver-reserved memory apart from `used`; v1 folds it in.
    try:
        return nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    except Exception:
        return guarded(notes, f"{what} memory info", nvml.nvmlDeviceGetMemoryInfo, handle)


def usable_total(info: Any) -> int | None:
    """Memory a process can use: v2's total includes what the driver keeps for itself."""
    if info is None:
        return None
    return int(info.total) - int(getattr(info, "reserved", 0) or 0)


def resolve(nvml: Any, uuid: str) -> Any:
    """NVML's handle for a device torch names by UUID: a GPU or a MIG instance (torch may
    spell a MIG instance's UUID with a GPU- prefix)."""
    bare = uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid
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


class Sampler:
    """Peaks of device-wide and per-process used memory on the given devices. `nvml` is
    `pynvml` (or, in tests that run without a GPU, a stand-in with the same functions);
    `uuids` are the devices torch sees, in torch's order."""

    def __init__(self, nvml: Any, uuids: list[str]):
        if not uuids:
            raise RuntimeError("torch sees no CUDA device: nothing to sample")
        self.nvml = nvml
        self.notes: list[str] = []
        self.handles = [resolve(nvml, u) for u in uuids]
        self.devices: list[dict[str, Any]] = []
        for index, (uuid, handle) in enumerate(zip(uuids, self.handles, strict=True)):
            if is_mig_parent(nvml, handle):
                raise RuntimeError(
                    f"device {index} ({uuid}) is a GPU in MIG mode: NVML's figures for it "
                    "span all its instances"
                )
            info = memory_info(nvml, handle, self.notes, f"GPU {index}")
            name = guarded(self.notes, f"GPU {index} name", nvml.nvmlDeviceGetName, handle)
            self.devices.append(
                {
                    "index": index,
                    "uuid": uuid,
                    "name": None if name is None else _text(name),
                    "total_bytes": usable_total(info),
                    "used_before_bytes": None if info is None else int(info.used),
                    "samples": [],
                }
            )

    def sample(self, pids: set[int], clock: Callable[[], float] = time.monotonic) -> None:
        for dev, handle in zip(self.devices, self.handles, strict=True):
            info = memory_info(self.nvml, handle, self.notes, f"GPU {dev['index']}")
            # Stamped after the reading: a figure read inside a window is stamped inside it.
            now = clock()
            used = None if info is None else int(info.used)
            dev["samples"].append((now, used, self._process_bytes(dev["index"], handle, pids)))

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
        if any(b is None for b in mine):  # listed, but its memory is not reported
            return None
        return sum(int(b) for b in mine)

    def result(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """Per-device peaks, over the whole case and within `window` (the memory pass)."""
        # All or nothing: if the process was found on any device, the per-process view
        # holds everywhere (a device it never appeared on, it did not use). Found nowhere
        # (a container's PID namespace), every device falls back to its device-wide delta.
        by_pid = any(p for dev in self.devices for _, _, p in dev["samples"])
        devices = []
        for dev in self.devices:
            samples: list[Sample] = dev["samples"]
            inside = [s for s in samples if window and window[0] <= s[0] <= window[1]]
            if window and not inside:
                self.notes.append(
                    f"GPU {dev['index']}: no sample fell inside the memory pass "
                    f"({(window[1] - window[0]) * 1e3:.1f} ms): no device figure for it"
                )
            used = [u for _, u, _ in samples if u is not None]
            before = dev["used_before_bytes"]
            devices.append(
                {
                    **{k: v for k, v in dev.items() if k != "samples"},
                    "peak_device_used_bytes": max([*used, before or 0]) if used else before,
                    "peak_process_bytes": _peak(samples, by_pid, before),
                    "memory_pass_peak_bytes": _peak(inside, by_pid, before),
                    "process_view": "pid" if by_pid else "device-delta",
                    "samples": len(samples),
                }
            )
        return {"devices": devices, "notes": self.notes}


def _peak(samples: list[Sample], by_pid: bool, before: int | None) -> int | None:
    if by_pid:
        values = [p for _, _, p in samples if p is not None]
    else:
        values = [max(0, u - before) for _, u, _ in samples if u is not None and before is not None]
    return max(values) if values else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NVML sampler (started by memtrack's runner)")
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("uuids", nargs="*", help="the devices torch sees, in its order")
    args = parser.parse_args(argv)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        print(json.dumps({"ok": False, "reason": f"NVML unavailable: {exc}"}), flush=True)
        return 0
    try:
        sampler = Sampler(pynvml, args.uuids)
    except Exception as exc:  # no device torch sees, or one NVML cannot attribute (MIG)
        print(json.dumps({"ok": False, "reason": f"no device view: {exc}"}), flush=True)
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
            elif len(words) == 3 and words[0] == "window":
                try:
                    window[:] = [float(words[1]), float(words[2])]
                except ValueError:
                    pass  # no window: the memory pass's figures stay absent
        stop.set()

    threading.Thread(target=read_commands, daemon=True).start()
    print(json.dumps({"ok": True, "interval_s": args.interval}), flush=True)
    while not stop.is_set():
        sampler.sample(set(pids))
        time.sleep(args.interval)
    sampler.sample(set(pids))
    result = sampler.result((window[0], window[1]) if window else None)
    print(json.dumps(result), flush=True)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
