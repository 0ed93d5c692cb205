"""The contract between the parent (memtrack.measure) and a worker process: what the worker is
asked to do (`Spec`, written by the parent as JSON) and what it leaves (`Result`, written by the
worker after every phase, read by the parent once the worker has ended).

Both are frozen, typed records that both sides import: a misspelt field fails where it is
written, not inside a subprocess. The result's figures are the Measurement's own fields
(`FIGURES`), declared once, in records.model. The parent treats a result file as untrusted
(the workload runs in that process and can overwrite it): `read_result` checks every value's
type (the typed-JSON decoder of records.codec, in the dialect `PROTOCOL`) and turns a damaged
file into a crashed case, never a crash of the tool. `Channel` is the
socket between the runner and its fork server (memtrack.worker.server). This module does not
import torch.
"""

from __future__ import annotations

import array
import dataclasses
import json
import os
import pickle
import select
import socket
import struct
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memtrack.probes.quality import QualitySpec
from memtrack.records.codec import Dialect, decode, required
from memtrack.records.model import Measurement

if TYPE_CHECKING:
    from memtrack.config import Config

T = TypeVar("T")

RESULT_LIMIT_BYTES = 64 * 2**20
"""A result file larger than this is not read (a workload that filled it): the case crashed."""


class ProtocolError(Exception):
    """A spec or result that does not match its record: a field unknown, missing or mistyped."""


PROTOCOL = Dialect(ProtocolError)
"""How the spec, the result and the NVML sampler's answer are read (records.codec): typed,
without the limits of a record from elsewhere, in terse words."""


def read_typed(cls: type[T], data: Any, where: str) -> T:
    """`data` (parsed JSON) as a `cls`, every value checked; ProtocolError where one is not.
    `where` names it in the message ('spec', 'result')."""
    typed: T = decode(cls, data, PROTOCOL, where)
    return typed


@dataclass(frozen=True)
class Spec:
    """One case for one worker process."""

    module: str
    """The workload module (a dotted name or a path, as the config names it)."""
    root: str
    """The repository root the module is imported from."""
    workload: str
    params: dict[str, Any]
    seed: int
    device: str
    """'cpu' or 'cuda'."""
    warmup: int
    repeats: int
    data_dir: str
    """The repository's data/ folder (`ctx.data_file`)."""
    result_path: str
    """Where the worker writes its `Result`."""
    scratch_dir: str | None = None
    """`ctx.scratch_dir`: the case's own folder, removed with the case."""
    case_id: str | None = None
    quality: QualitySpec | None = None
    ranks: int | None = None
    """The `ranks` param of a multi-rank case: each rank is a worker of its own."""
    snapshot_path: str | None = None
    """`memtrack snapshot`: one more step under the recorder, written here."""
    timing_only: bool = False
    """One side of a paired timing (`memtrack run --against`): setup, warm-up and the timing
    pass, no memory pass."""
    sampler_clock: str | None = None
    """The NVML sampler's clock file, where one samples the case: after the memory pass the
    worker holds its level until two samples were taken after it (probes.nvml)."""
    turns: str | None = None
    """One side of a paired timing in one live process (worker.turns): the folder of the
    pair's two turn pipes; its passes and setup wait for their turns."""
    side: int = 0
    """Which side of the pair this worker is (0: the reference, 1: the candidate)."""
    schedule: tuple[int, ...] = ()
    """The pair's turns, in order: the side each goes to (each side's setup, then its
    timing passes: A B, A B, ...)."""
    stop_after: int = 0
    """The rounds in which the candidate was not slower after which the pair stops: its
    time verdict can no longer find it slower (judge.timing.futile_after); 0: never."""

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def read(cls, path: Path) -> Spec:
        return read_typed(cls, json.loads(path.read_text()), "spec")


FIGURES = tuple(
    """
    framework allocator_backend peak_allocated_bytes peak_reserved_bytes peak_requested_bytes
    persistent_bytes allocated_samples num_alloc_retries num_ooms
    host_peak_rss_bytes host_step_peak_rss_bytes host_peak_source host_setup_rss_bytes
    host_file_rss_bytes largest_cache_bytes categories
    iteration_times_s time_median_s time_p95_s time_min_s
    load_duration_s load_host_peak_rss_bytes load_file_rss_bytes load_rchar_bytes
    load_wchar_bytes load_read_bytes load_write_bytes disk_bytes
    quality_status quality_message quality_reference quality_reference_sha256 quality_max_abs
    quality_max_rel quality_cosine quality_value quality_tolerance
    retained_samples iteration_cpu_times_s iteration_tree_cpu_times_s iteration_device_times_s
    timing_cpu_pressure timing_runnable timing_steal timing_cores timing_wait_cores
    timing_others_cores iteration_instructions instructions_note
    session_peak_bytes sessions_sum_bytes sites
    """.split()
)
"""The figures a worker may report: each a `records.Measurement` field, and a field of the
`Result` of the same name, type and default (the Measurement says what each one is)."""


def _with_figures(names: Sequence[str]) -> Callable[[type[T]], type[T]]:
    """Adds the Measurement's fields `names` to a class before @dataclass reads it, with the
    Measurement's types and defaults: they are declared once, there. (A type checker sees
    only the class's own fields: the figures are written and read by name.)"""

    def add(cls: type[T]) -> type[T]:
        hints = typing.get_type_hints(Measurement)
        fields = {f.name: f for f in dataclasses.fields(Measurement)}
        for name in names:
            f = fields[name]
            cls.__annotations__[name] = hints[name]
            setattr(
                cls,
                name,
                dataclasses.field(default=f.default, default_factory=f.default_factory),
            )
        return cls

    return add


@dataclass(frozen=True)
@_with_figures(FIGURES)
class Result:
    """What a worker leaves: how far it got, how it ended (the fields below), and its figures
    so far: a field per name of FIGURES, as the Measurement declares it; None where not
    measured."""

    status: str = "running"
    """'running' until the worker says how it ended: ok, oom, error."""
    phase: str = "start"
    notes: tuple[str, ...] = ()
    message: str | None = None
    traceback: str | None = None
    written_at: float | None = None
    """time.monotonic() of the last write: which rank of a multi-rank case failed first."""
    memory_window: tuple[float, ...] | None = None
    """[start, end] of the memory pass (time.monotonic(), the NVML sampler's clock too), or
    [start, last synchronised iteration, end of the hold for the sampler]."""
    cuda_devices: tuple[dict[str, Any], ...] = ()
    """The allocator's view per CUDA device: index, uuid, name, total and peak bytes."""
    snapshot_kind: str | None = None
    snapshot_events: int | None = None
    snapshot_modules: int | None = None
    tensor_dtype: str | None = None
    """The floating dtype that holds most of the persistent set's bytes ('bfloat16'); None
    where nothing was marked: the record's dtype where the case names none."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "result") -> Result:
        return read_typed(cls, data, where)


WORKER_STATUSES = ("running", "ok", "oom", "error")
"""What a worker may say of its case; `crashed` and `timeout` are the parent's to say."""
RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(Result))
OWN_FIELDS = tuple(f.name for f in dataclasses.fields(Result) if f.name not in FIGURES)
"""How the worker ended and what only the parent reads: not figures of the Measurement."""


class ResultFile:
    """The worker's side: its Result so far, rewritten atomically after every phase, so that
    a crash or a kill still leaves the partial figures for the parent."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"status": "running", "phase": "start", "notes": []}

    @property
    def notes(self) -> list[str]:
        notes: list[str] = self.data["notes"]
        return notes

    def update(self, **fields: Any) -> None:
        unknown = sorted(set(fields) - RESULT_FIELDS)
        if unknown:
            raise ProtocolError(f"result: no field {', '.join(unknown)}")
        self.data.update(fields)
        self.data["written_at"] = time.monotonic()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)


def read_result(path: Path) -> Result:
    """The worker's result; one that says where the worker stopped when it left none. A file
    that is not a result (a workload overwrote it) is a crashed case, its reason the message."""
    try:
        if os.path.getsize(path) > RESULT_LIMIT_BYTES:
            return _damaged(f"its result file is over {RESULT_LIMIT_BYTES // 2**20} MiB")
        raw = path.read_bytes()
    except FileNotFoundError:
        return Result()
    except OSError as exc:
        return _damaged(f"its result file cannot be read ({exc.strerror})")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return _damaged("its result file is not UTF-8")
    except ValueError:
        return Result()  # cut short by a kill mid-write: nothing was written yet
    try:
        result = Result.from_dict(data)
    except ProtocolError as exc:
        return _damaged(f"its result file is damaged ({exc})")
    if result.status not in WORKER_STATUSES:
        return _damaged(f"its result file is damaged (result.status: {result.status[:40]!r})")
    return result


def _damaged(why: str) -> Result:
    return Result(status="crashed", message=f"the worker's result was lost: {why}")


# -- the fork server's messages ----------------------------------------------------------------
#
# One frozen record per kind of message, on both sides of the channel. On the wire each is
# {"op": its class's name, **its fields} (pickled: a config and a suite's data travel as they
# are); `decode_message` refuses an unknown op, or a field unknown or missing.


@dataclass(frozen=True)
class Discover:
    """runner -> server: import the suite's modules (registry.discover) and list its
    workloads; `Importing` comes first for each module, then `Discovered` or `Failed`."""

    config: Config


@dataclass(frozen=True)
class Importing:
    """server -> runner: the module being imported now (named if its import ends the server)."""

    ref: str


@dataclass(frozen=True)
class Discovered:
    """server -> runner: the suite's workloads, as registry.workload_data gives each."""

    workloads: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Failed:
    """server -> runner: a request that failed, or was refused as malformed."""

    kind: str
    """The MemtrackError subclass that says why (WorkloadError, ConfigError, ProtocolError)."""
    message: str


@dataclass(frozen=True)
class AskEnvironment:
    """runner -> server: the fingerprint of the environment probe forked at the start."""


@dataclass(frozen=True)
class EnvironmentProbed:
    """server -> runner: the probe's environment.collect() data, or why there is none."""

    data: dict[str, Any] | None = None
    error: str | None = None


MEASURE_WORKER = "memtrack.worker"
"""`python -m memtrack.worker`: the worker that measures a case."""
ESTIMATE_WORKER = "memtrack.worker.estimate"
"""`python -m memtrack.worker.estimate`: the worker that estimates a case under fake tensors."""


@dataclass(frozen=True)
class Fork:
    """runner -> server: fork a worker that runs `python -m WORKER ARGV` in effect, WORKER
    one of `FORKED_WORKERS` (a measured case's, or an estimated one's). Two descriptors
    travel with it: the case's stderr, and the read end of its `go` pipe."""

    argv: tuple[str, ...]
    worker: str = MEASURE_WORKER


@dataclass(frozen=True)
class Forked:
    """server -> runner: the forked worker, waiting for its `go`."""

    pid: int


@dataclass(frozen=True)
class Refused:
    """server -> runner: why this server must not fork (CUDA or a thread in it)."""

    reason: str


@dataclass(frozen=True)
class Reap:
    """runner -> server: reap a forked worker whose whole tree has ended."""

    pid: int


@dataclass(frozen=True)
class Reaped:
    """server -> runner: the reaped worker's exit status (negative: the signal)."""

    returncode: int


@dataclass(frozen=True)
class AskStatus:
    """runner -> server: its own view (tests ask it)."""


@dataclass(frozen=True)
class ServerStatus:
    """server -> runner: why it would refuse a fork now, whether CUDA is initialised in it,
    its pid."""

    unsafe: str | None
    cuda_initialized: bool
    pid: int


Message = (
    Discover
    | Importing
    | Discovered
    | Failed
    | AskEnvironment
    | EnvironmentProbed
    | Fork
    | Forked
    | Refused
    | Reap
    | Reaped
    | AskStatus
    | ServerStatus
)
MESSAGES: dict[str, type[Message]] = {cls.__name__: cls for cls in typing.get_args(Message)}
"""Each kind of message by its op."""


def encode_message(message: Message) -> dict[str, Any]:
    """A message as it travels: its op and its fields (each as it is: the channel pickles)."""
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    return {"op": type(message).__name__, **fields}


def decode_message(data: Any) -> Message:
    """A message from what travelled; ProtocolError for an unknown op, a field unknown or
    missing."""
    op = data.get("op") if isinstance(data, dict) else None
    cls = MESSAGES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ProtocolError(f"no op {op!r}")
    fields = {k: v for k, v in data.items() if k != "op"}
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = set(fields) - set(names)
    if unknown:
        raise ProtocolError(f"{op}: {PROTOCOL.unknown(unknown)}")
    for f in dataclasses.fields(cls):
        if f.name not in fields and required(f):
            raise ProtocolError(f"{op}: {PROTOCOL.missing(f.name)}")
    return cls(**fields)


# -- the fork server's channel -----------------------------------------------------------------


class ChannelClosed(Exception):
    """The other end of a channel has gone (its process exited) or did not answer in time."""


class Channel:
    """One end of the socket between the runner and its fork server (memtrack.worker.server):
    length-prefixed pickled messages, each with the file descriptors that travel with it
    (SCM_RIGHTS). Pickle is safe here: both ends are memtrack's own processes, started
    together, and nothing else holds the socket."""

    MAX_FDS = 4

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        data = pickle.dumps(encode_message(message))
        head = struct.pack("!I", len(data))
        try:
            if fds:
                socket.send_fds(self.sock, [head], list(fds))
            else:
                self.sock.sendall(head)
            self.sock.sendall(data)
        except OSError as exc:  # EPIPE, ECONNRESET: the other side has exited
            raise ChannelClosed(str(exc)) from None

    def receive(self, timeout_s: float | None = None) -> tuple[Message, list[int]]:
        """The next message and its descriptors; ChannelClosed at end of file or timeout,
        ProtocolError (its descriptors closed) for a malformed message."""
        head, fds = self._read(4, timeout_s, with_fds=True)
        (size,) = struct.unpack("!I", head)
        try:
            body, _ = self._read(size, timeout_s)
            return decode_message(pickle.loads(body)), fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def _read(
        self, n: int, timeout_s: float | None, *, with_fds: bool = False
    ) -> tuple[bytes, list[int]]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        chunks: list[bytes] = []
        fds: list[int] = []
        got = 0
        while got < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                raise ChannelClosed(f"no answer within {timeout_s:g} s")
            try:
                if with_fds and not chunks:
                    room = socket.CMSG_SPACE(self.MAX_FDS * array.array("i").itemsize)
                    chunk, ancillary, _flags, _addr = self.sock.recvmsg(n - got, room)
                    for level, kind, data in ancillary:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            arr = array.array("i")
                            arr.frombytes(data[: len(data) - len(data) % arr.itemsize])
                            fds.extend(arr)
                else:
                    chunk = self.sock.recv(n - got)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            if not chunk:
                for fd in fds:
                    os.close(fd)
                raise ChannelClosed("the other end has exited")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), fds

    def close(self) -> None:
        self.sock.close()


__all__ = [
    "FIGURES",
    "ESTIMATE_WORKER",
    "MEASURE_WORKER",
    "MESSAGES",
    "OWN_FIELDS",
    "PROTOCOL",
    "RESULT_FIELDS",
    "AskEnvironment",
    "AskStatus",
    "Channel",
    "ChannelClosed",
    "Discover",
    "Discovered",
    "EnvironmentProbed",
    "Failed",
    "Fork",
    "Forked",
    "Importing",
    "Message",
    "ProtocolError",
    "QualitySpec",
    "Reap",
    "Reaped",
    "Refused",
    "Result",
    "ResultFile",
    "ServerStatus",
    "Spec",
    "decode_message",
    "encode_message",
    "read_result",
    "read_typed",
]
