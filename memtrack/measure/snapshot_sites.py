"""The sites at the peak of a snapshot file (`memtrack snapshot`), for `memtrack diff`.

A CPU snapshot (JSON) holds its sites. A CUDA snapshot (the allocator's history, a pickle of
plain dicts and lists) holds every allocation and free of the step with its Python frames:
replayed in order, the live blocks at the largest total are grouped by source site (the
innermost frame in the workload's own file); it has no module paths. The pickle is read
with an unpickler that makes no object but dicts, lists and scalars: a file is never
trusted to run code. Nothing here imports torch.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

from memtrack.errors import ConfigError
from memtrack.records import Site
from memtrack.records.validate import SITE_GROUPINGS
from memtrack.workload.frames import NO_SOURCE, named, own

MAX_FILE_BYTES = 2**30
"""A snapshot file larger than this is refused (a snapshot keeps 100,000 events at most)."""


class _PlainData(pickle.Unpickler):
    """Unpickles builtin containers and scalars only: any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {module}.{name}")


def read_sites(path: Path) -> tuple[str, tuple[Site, ...]]:
    """The snapshot's case (or file name) and its sites at the peak. A file that is not a
    memtrack snapshot is a ConfigError naming it."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: over {MAX_FILE_BYTES // 2**20} MiB: not a snapshot")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from exc
    if raw[:1] == b"{":
        return _cpu(path, raw)
    try:
        data = _PlainData(io.BytesIO(raw)).load()
    except Exception as exc:  # any damage: the file is refused, never half-read
        raise ConfigError(f"{path}: not a memtrack snapshot ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("device_traces"), list):
        raise ConfigError(f"{path}: not a memtrack snapshot (no device_traces)")
    return path.name, _cuda_sites(path, data["device_traces"])


def _cpu(path: Path, raw: bytes) -> tuple[str, tuple[Site, ...]]:
    try:
        data = json.loads(raw)
        rows = data["sites"]
        sites = tuple(
            Site(str(r["grouping"]), str(r["key"]), int(r["size_bytes"]), _line(r.get("line")))
            for r in rows
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a memtrack snapshot with sites ({exc})") from exc
    bad = [s for s in sites if s.grouping not in SITE_GROUPINGS or s.size_bytes < 0]
    if bad:
        raise ConfigError(f"{path}: site {bad[0].key!r} is not a site memtrack writes")
    return str(data.get("case") or path.name), sites


def _line(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value > 0 else None


def _cuda_sites(path: Path, traces: list[Any]) -> tuple[Site, ...]:
    """The live blocks at the largest total of any device, by source site."""
    best: dict[str, int] = {}
    best_total = -1
    for trace in traces:
        if not isinstance(trace, list):
            raise ConfigError(f"{path}: not a memtrack snapshot (a trace is not a list)")
        live: dict[Any, tuple[int, str]] = {}
        groups: dict[str, int] = {}
        total = 0
        for event in trace:
            if not isinstance(event, dict):
                continue
            action, addr, size = event.get("action"), event.get("addr"), event.get("size")
            if not isinstance(size, int) or size < 0:
                continue
            if action == "alloc":
                site = _site(event.get("frames"))
                live[addr] = (size, site)
                groups[site] = groups.get(site, 0) + size
                total += size
                if total > best_total:
                    best_total, best = total, dict(groups)
            elif action in ("free_completed", "free_requested") and addr in live:
                freed, site = live.pop(addr)
                groups[site] -= freed
                total -= freed
    ranked = sorted(((k, v) for k, v in best.items() if v > 0), key=lambda kv: -kv[1])
    return tuple(Site("source", k, v) for k, v in ranked)


def _site(frames: Any) -> str:
    """'file:function' of the innermost frame in the workload's own file."""
    for frame in frames if isinstance(frames, list) else ():
        if isinstance(frame, dict) and own(str(frame.get("filename", "<>"))):
            return f"{named(str(frame['filename']), None)}:{frame.get('name', '?')}"
    return NO_SOURCE


__all__ = ["read_sites"]
