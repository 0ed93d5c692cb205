"""`memtrack snapshot`: one case's measured step, captured in a fresh worker into a private
file that never enters the database, the data folder or the repository.

On CUDA the file is the allocator's history (a pickle that https://pytorch.org/memory_viz
renders in the browser); on the CPU it is MemTracker's peak per module and category (JSON).
Both show the model's structure, so they stay on this machine: nothing here uploads,
stores or posts them. torch is imported only by the worker (memtrack.probes.snapshot).
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from memtrack.config import Config
from memtrack.errors import ConfigError, WorkloadError
from memtrack.machine.provenance import git_output
from memtrack.measure.case import run_case
from memtrack.measure.forkserver import ForkServer
from memtrack.measure.ranks import snapshot_paths
from memtrack.measure.suite import resolve_device, start_run
from memtrack.records import Environment
from memtrack.store.url import Database
from memtrack.workload.registry import Case, Workload, ranks_of, select_cases

SUFFIX = {"cuda": ".pickle", "cpu": ".json"}
MEMORY_VIZ = "https://pytorch.org/memory_viz"


@dataclass(frozen=True)
class Snapshot:
    """A snapshot written by `take`."""

    case_id: str
    device: str
    path: Path
    """Rank 0's file, for a case of several ranks."""
    size_bytes: int
    rank_paths: tuple[Path, ...] = ()
    """The other ranks' files, rank 1 first (each rank's own device, or process)."""

    def how_to_open(self) -> str:
        if self.device == "cuda":
            how = (
                f"drag it onto {MEMORY_VIZ} (the page reads it in your browser; nothing "
                "is uploaded)"
            )
        else:
            how = (
                "a JSON file: the step's peak by category, then every module's peak, largest "
                f"first (e.g. `python -m json.tool {self.path}`)"
            )
        if self.rank_paths:
            others = ", ".join(f"rank {r} {p}" for r, p in enumerate(self.rank_paths, 1))
            how += f"; one file per rank, that one rank 0's, and {others}"
        return how


def default_dir() -> Path:
    """The user's cache folder ($XDG_CACHE_HOME, else ~/.cache)/memtrack/snapshots, or a
    folder of this user's under $TMPDIR where that cannot be made."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    for folder in (
        Path(cache) / "memtrack" / "snapshots",
        Path(tempfile.gettempdir()) / f"memtrack-snapshots-{os.getuid()}",
    ):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            return folder
        except OSError:
            continue
    raise ConfigError(
        f"{cache}: cannot create a folder for snapshots there or under "
        f"{tempfile.gettempdir()}; pass --out PATH"
    )


def default_path(case_id: str, device: str, folder: Path | None = None) -> Path:
    """'<case>-<UTC time>.pickle' (CUDA) or '.json' (CPU) in `default_dir()`."""
    name = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", case_id).strip("_")[:120] or "case"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return (folder or default_dir()) / f"{name}-{stamp}{SUFFIX[device]}"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _work_tree(root: Path) -> Path | None:
    top = git_output(root, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else None


def check_out(out: Path, config: Config, db: Database) -> Path:
    """The resolved `--out` path, or ConfigError (one line) where a snapshot must not go:
    inside data/, the database's folder or the repository's work tree (where it could be
    committed, uploaded as an artifact or read by the dashboard), or over an existing file."""
    path = out.expanduser().resolve()
    tree = _work_tree(config.root)
    for folder, what in (
        (config.root / "data", "the data folder"),
        (
            db.expanduser().resolve().parent if isinstance(db, Path) else None,
            "the database's folder",
        ),
        (tree, "the repository's work tree"),
    ):
        if folder is not None and _inside(path, folder.resolve()):
            raise ConfigError(
                f"--out {out}: inside {what} ({folder.resolve()}); a snapshot "
                "shows the model's structure: write it outside the repository, "
                "e.g. the default under ~/.cache/memtrack/snapshots"
            )
    if path.exists() or path.is_symlink():
        raise ConfigError(f"--out {out}: already exists; memtrack never overwrites a file")
    if not path.parent.is_dir():
        raise ConfigError(f"--out {out}: no such folder {path.parent}")
    return path


def find_case(workloads: list[Workload], name: str) -> Case:
    """The case with this id, or the only case of the workload with this name."""
    cases = select_cases(workloads)
    exact = [c for c in cases if c.case_id == name]
    if exact:
        return exact[0]
    of_workload = [c for c in cases if c.workload == name]
    if len(of_workload) == 1:
        return of_workload[0]
    if of_workload:
        ids = ", ".join(c.case_id for c in of_workload[:5])
        raise WorkloadError(f"{name!r} has {len(of_workload)} cases; name one: {ids}")
    close = [c.case_id for c in cases if name in c.case_id][:5] or difflib.get_close_matches(
        name, sorted({x for c in cases for x in (c.workload, c.case_id)}), n=3, cutoff=0.5
    )
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise WorkloadError(f"no case or workload {name!r} in the suite{hint}")


def take(config: Config, name: str, db: Database, out: Path | None = None) -> Snapshot:
    """Run the case `name` (see find_case) in a fresh worker, forked by a fork server that
    imported torch and the suite (as `memtrack run`'s cases are): setup, warm-up, then one
    step under the recorder; the worker writes the snapshot. `db` is only kept clear of: it
    is never opened."""
    if out is not None:
        out = check_out(out, config, db)
    with start_run(config) as start:
        case = find_case(start.workloads(), name)
        env = start.environment()
        return _take(config, case, env, out, db, start.server)


def _take(
    config: Config,
    case: Case,
    env: Environment,
    out: Path | None,
    db: Database,
    server: ForkServer,
) -> Snapshot:
    device = resolve_device(config, env)
    if device == "cuda" and env.allocator_backend == "cudaMallocAsync":
        raise ConfigError(
            "memtrack snapshot needs PyTorch's caching allocator: "
            "PYTORCH_ALLOC_CONF (or PYTORCH_CUDA_ALLOC_CONF) selects "
            "backend:cudaMallocAsync, which keeps no allocation history; "
            "unset that backend for the snapshot"
        )
    path = out or check_out(default_path(case.case_id, device), config, db)
    paths = snapshot_paths(path, ranks_of(case.params) or 1)
    for other in paths[1:]:  # beside `path`: checked by check_out but for their own names
        if other.exists() or other.is_symlink():
            raise ConfigError(f"{other}: already exists; memtrack never overwrites a file")
    m = run_case(config, case, device, env.visible_uuids, snapshot_path=path, server=server)
    if m.status != "ok" or not all(p.is_file() for p in paths):
        for p in paths:  # none existed before: each was made by this case's workers
            p.unlink(missing_ok=True)  # a worker killed while writing leaves no half file
        raise WorkloadError(
            f"{case.case_id}: no snapshot: {m.status}: "
            f"{m.message or 'the worker wrote no snapshot'}"
        )
    return Snapshot(case.case_id, device, path, path.stat().st_size, tuple(paths[1:]))


__all__ = ["Snapshot", "check_out", "default_dir", "default_path", "find_case", "take"]
