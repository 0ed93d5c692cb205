"""Device view: NVML sampled from a separate process, per GPU, matched by UUID.

A thread inside the measured process would fight its GIL, so the runner starts this module
as its own process (`python -m memtrack.probes.nvml`). Protocol over stdin/stdout, one JSON
line each way:
  sampler -> runner: {"ok": true, "interval_s": ...}  or  {"ok": false, "reason": "..."}
  runner -> sampler: the PID to watch, then "stop" (or EOF)
  sampler -> runner: {"devices": [...]}
Sampling is sampling: a spike shorter than the interval can be missed; the runner compares
the sampled peak with the allocator's exact reserved peak and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any


class Sampler:
    """Peaks of device-wide and per-process used memory, per device. `nvml` is `pynvml`
    (or, in tests that run without a GPU, a stand-in with the same functions)."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self.devices: list[dict[str, Any]] = []
        for i, h in enumerate(self.handles):
            info = self._memory(h)
            self.devices.append(
                {
                    "index": i,
                    "uuid": _text(nvml.nvmlDeviceGetUUID(h)),
                    "name": _text(nvml.nvmlDeviceGetName(h)),
                    "total_bytes": int(info.total),
                    "used_before_bytes": int(info.used),
                    "peak_device_used_bytes": int(info.used),
                    "peak_process_bytes": None,
                    "samples": 0,
                }
            )

    def _memory(self, handle: Any) -> Any:
        # v2 reports driver-reserved memory apart from `used`; v1 folds it in.
        try:
            return self.nvml.nvmlDeviceGetMemoryInfo(handle, version=self.nvml.nvmlMemory_v2)
        except Exception:
            return self.nvml.nvmlDeviceGetMemoryInfo(handle)

    def sample(self, pids: set[int]) -> None:
        for dev, h in zip(self.devices, self.handles, strict=True):
            used = int(self._memory(h).used)
            dev["peak_device_used_bytes"] = max(dev["peak_device_used_bytes"], used)
            dev["samples"] += 1
            if not pids:
                continue
            try:
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                continue
            mine = [
                int(p.usedGpuMemory) for p in procs if p.pid in pids and p.usedGpuMemory is not None
            ]
            if mine:
                dev["peak_process_bytes"] = max(dev["peak_process_bytes"] or 0, sum(mine))

    def result(self) -> list[dict[str, Any]]:
        out = []
        for dev in self.devices:
            d = dict(dev)
            if d["peak_process_bytes"] is not None:
                d["process_view"] = "pid"
            else:
                # Inside containers NVML reports host PIDs: fall back to the device delta.
                d["peak_process_bytes"] = d["peak_device_used_bytes"] - d["used_before_bytes"]
                d["process_view"] = "device-delta"
            out.append(d)
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NVML sampler (started by memtrack's runner)")
    parser.add_argument("--interval", type=float, default=0.01)
    args = parser.parse_args(argv)
    try:
        import pynvml

        pynvml.nvmlInit()
        sampler = Sampler(pynvml)
        if not sampler.devices:
            raise RuntimeError("NVML sees no GPU")
    except Exception as exc:
        print(json.dumps({"ok": False, "reason": f"NVML unavailable: {exc}"}), flush=True)
        return 0
    pids: set[int] = set()
    stop = threading.Event()

    def read_commands() -> None:
        for line in sys.stdin:
            line = line.strip()
            if line == "stop":
                break
            if line.isdigit():
                pids.add(int(line))
        stop.set()

    threading.Thread(target=read_commands, daemon=True).start()
    print(json.dumps({"ok": True, "interval_s": args.interval}), flush=True)
    while not stop.is_set():
        sampler.sample(set(pids))
        time.sleep(args.interval)
    sampler.sample(set(pids))
    print(json.dumps({"devices": sampler.result()}), flush=True)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
