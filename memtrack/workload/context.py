"""The object a workload function receives: what to build, where, and how to mark it."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtrack.errors import WorkloadError
from memtrack.workload.sessions import concurrency

if TYPE_CHECKING:
    import torch

DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
    "float8_e4m3fn": "float8_e4m3fn",
    "int8": "int8",
}

PRECISIONS = ("64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")
"""What the reserved `precision` param may declare, in Lightning's names: `*-true` keeps the
weights and the compute in that type; `*-mixed` computes under autocast in 16 bits over
float32 weights (their master copy), which `dtype` cannot say (it names the weights')."""


def precision(params: dict[str, Any]) -> str | None:
    """The case's declared precision (the `precision` param), None without one; a value
    memtrack does not know is refused."""
    value = params.get("precision")
    if value is not None and value not in PRECISIONS:
        raise WorkloadError(f"param precision={value!r} is not one of {', '.join(PRECISIONS)}")
    return value


class Context:
    """Given to a workload: params, device, dtype, seeded inputs, and marks.

    A case with the `ranks` param runs one process per rank in a torch.distributed process
    group (`ctx.rank`, `ctx.world_size`; `ctx.device` is that rank's own device).

    `ctx.mark(model, optimizer)` ends setup: memory at that point is the persistent set
    (weights). `ctx.tag_cache(tensor, ...)` names request-sized state (a KV cache) so that
    the breakdown can show it apart from other intermediates. `with ctx.loading(): ...`
    marks the loading step (reading a checkpoint, building the model), measured apart.
    """

    def __init__(
        self,
        params: dict[str, Any],
        seed: int,
        device: str,
        data_dir: Path,
        scratch_dir: Path | None = None,
        *,
        fake: bool = False,
    ):
        import torch

        self.params = dict(params)
        self.seed = seed
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # an explicit index: stats and trackers key devices as cuda:N
            self.device = torch.device("cuda", torch.cuda.current_device())
        dtype_name = str(params.get("dtype", "float32"))
        if dtype_name not in DTYPES:
            raise WorkloadError(f"param dtype={dtype_name!r} is not one of {', '.join(DTYPES)}")
        self.dtype: torch.dtype = getattr(torch, DTYPES[dtype_name])
        self.precision = precision(params)
        """The declared precision (the `precision` param, e.g. 'bf16-mixed'), else None."""
        self.notes: list[str] = []
        """Lines the case's record keeps in its notes (`note()`)."""
        self.concurrency = concurrency(params)
        """Sessions of the step that run at once (the `concurrency` param; 1 without it)."""
        self.data_dir = data_dir
        self.fake = fake
        """Under fake tensors (`memtrack estimate`): no values, so no device generator."""
        self.marked_objects: tuple[Any, ...] | None = None
        self._cache_storages: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._cache_lock = threading.Lock()  # concurrent sessions tag from their threads
        self.cache_peak_bytes = 0
        self.tag_hook: Callable[[tuple[torch.Tensor, ...]], Any] | None = None
        """Set by memtrack while a tracker measures: it is given every tag as well."""
        self.loading_probe: Any = None
        """Set by memtrack's worker: measures `loading()` phases (probes.loading)."""
        self._scratch_dir = scratch_dir
        self.rank = 0
        """This process's rank in a multi-rank case (the `ranks` param), else 0. The process
        group is torch.distributed's default group, ready when the workload is called."""
        self.world_size = 1
        """How many ranks the case runs (the `ranks` param), else 1."""

    def __getitem__(self, name: str) -> Any:
        return self.params[name]

    def mark(self, *objects: Any) -> None:
        """End of setup. Pass the modules and optimizers that make the persistent set."""
        self.marked_objects = objects

    def note(self, line: str) -> None:
        """A line for the case's record's notes (what setup found worth saying)."""
        self.notes.append(line)

    def tag_cache(self, *tensors: torch.Tensor) -> None:
        """Count these tensors as request-sized caches (a KV cache, ...): the breakdown
        shows the tagged storages alive at the step's peak, each once, and the largest total
        of tagged storages alive at any tag (`cache_peak_bytes`, the request's largest
        cache). Tag a cache where it is made, and again as it grows by concatenation; a
        superseded storage stops counting once it is freed."""
        if self.tag_hook is not None:
            self.tag_hook(tensors)
        if self.fake:  # fake storages have no data pointer to tell them apart by
            return
        # The tagged storages still alive, at the largest moment seen: the same figure
        # inside memtrack's runner and outside it.
        with self._cache_lock:
            for t in tensors:
                storage = t.untyped_storage()
                self._cache_storages[storage.data_ptr()] = (weakref.ref(storage), storage.nbytes())
            alive = {k: v for k, v in self._cache_storages.items() if v[0]() is not None}
            self._cache_storages = alive
            self.cache_peak_bytes = max(self.cache_peak_bytes, sum(n for _, n in alive.values()))

    @property
    def scratch_dir(self) -> Path:
        """An empty directory of this case's own, removed after the case: write what the
        workload saves (a checkpoint) here, never into the repository."""
        if self._scratch_dir is None:  # outside memtrack's runner: a temporary one
            self._scratch_dir = Path(tempfile.mkdtemp(prefix="memtrack-scratch-"))
            weakref.finalize(self, shutil.rmtree, self._scratch_dir, ignore_errors=True)
        return self._scratch_dir

    @contextlib.contextmanager
    def loading(self, *paths: str | Path) -> Iterator[None]:
        """Mark the loading step: `with ctx.loading(): model.load_state_dict(...)`.

        memtrack records, apart from the step: the host peak RSS during loading, the disk
        bytes read and written (from /proc/self/io), its wall time, and the disk space of
        the files the loading reads: the `paths` given (files or directories), by default
        everything under `ctx.scratch_dir`, measured when the loading ends. Several loading
        phases add up."""
        probe = self.loading_probe
        if probe is None:  # not run by memtrack's worker: nothing to measure
            yield
            return
        with probe.phase(tuple(Path(p) for p in paths) or (self.scratch_dir,)):
            yield

    def new_iteration(self) -> None:
        with self._cache_lock:
            self._cache_storages.clear()

    def generator(self, offset: int = 0) -> torch.Generator:
        """A generator seeded from the case's seed (plus `offset`), on the case's device.

        Under fake tensors it is a CPU generator: fake tensors hold no values to draw, fake
        ops accept it for any device, and a CUDA generator needs a driver, which an estimate
        for CUDA on a machine without a GPU does not have."""
        import torch

        g = torch.Generator(device="cpu" if self.fake else self.device)
        g.manual_seed(self.seed + offset)
        return g

    def randn(self, *shape: int, dtype: torch.dtype | None = None, offset: int = 0) -> torch.Tensor:
        """Pinned random input: the same values for the same seed, shape and device."""
        import torch

        return torch.randn(
            *shape, generator=self.generator(offset), device=self.device, dtype=dtype or self.dtype
        )

    def randint(self, high: int, *shape: int, offset: int = 0) -> torch.Tensor:
        """Pinned random integers in [0, high), e.g. token ids."""
        import torch

        return torch.randint(high, shape, generator=self.generator(offset), device=self.device)

    def data_file(self, name: str, sha256: str) -> Path:
        """A pinned input under data/, refused when its checksum differs."""
        path = self.data_dir / name
        if not path.is_file():
            raise WorkloadError(f"{path}: pinned input not found")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sha256:
            raise WorkloadError(f"{path}: sha256 {digest} differs from the pinned {sha256}")
        return path
