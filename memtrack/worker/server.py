"""`python -m memtrack.worker.server FD PARENT_PID [pairs [TWIN_FD TWIN_STDERR TWIN_ROOT]]`: the
fork server of one run, which dies with its parent (the runner).

Started once per run by the runner (memtrack.measure.forkserver), it imports torch, the
suite's workload modules (when the runner asks it to discover the suite) and then the
worker's modules, once, and forks one fresh process per case: the case's worker, which
runs `memtrack.worker.measure` as `python -m memtrack.worker` would, without paying for the
imports again. It also forks the environment probe; the server of a paired timing's side
(`pairs`: measure.pairs) imports what every case imports at once instead, beside the run's own
server, and then waits while the run's own cases are measured.

`... pairs TWIN_FD TWIN_STDERR TWIN_ROOT`: the candidate's side of a pair also serves REF's, on
a channel of its own, as a twin forked once its imports are done (`serve_twin`): one server's
imports for both sides, not two. Where the server holds a module of either tree (the
repository's own code: memtrack measuring itself), a twin would time the candidate's code on
REF's side; REF's side is then a server of its own, started at once from a fresh interpreter
in REF's tree, as without a twin (`start_twin`).

CUDA is initialised only after a fork, in the child. The server itself never calls into CUDA
(nothing here does; torch initialises CUDA lazily, at first use), and before every fork it
checks that nothing else did either: `torch.cuda.is_initialized()` is False, the CUDA driver
is not initialised (`cuCtxGetCurrent` answers CUDA_ERROR_NOT_INITIALIZED where libcuda is
loaded at all) and no other Python thread runs (a workload module's import may have started
one). Otherwise it refuses, with the reason, and the runner starts its cases as fresh
interpreters instead.

Each forked case is still a process of its own: a new session and process group, a parent
death signal, its own stderr, its host peak reset at its start (probes.host), its allocator
and counters untouched by any earlier case. It waits for the runner's word (its `go` pipe)
before it starts, so that the runner has it in the case's cgroup and under the NVML sampler
first. The server reaps a case only when the runner asks, after the case's whole tree has
ended: until then its pid, the case's process group id, cannot be reused.

The server's garbage collector follows the advice of `gc.freeze`'s documentation for a
process that forks without exec, its young generations still collected: it never makes a
full collection (each walks everything torch made, some 290,000 objects, about 0.2 s apiece,
and five of them were a quarter of the server's start), and what it holds is frozen before
each fork, so that no child's collector walks or copies it. The child collects as Python
does by default.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrack.probes.tree import die_with_parent
from memtrack.worker import protocol

CUDA_ERROR_NOT_INITIALIZED = 3
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
"""What a terminal sends its foreground group (^C, ^\\, hangup): the server ignores them."""
COLLECTING = gc.get_threshold()
"""The collector's thresholds as Python starts: a forked child's."""
YOUNG_ONLY = (*COLLECTING[:2], 2**30)
"""The server's: its young generations collected as a child's, a full collection never."""
FORKED_WORKERS = {
    protocol.MEASURE_WORKER: (
        "memtrack.worker.measure",
        str(Path(__file__).with_name("__main__.py")),
    ),
    protocol.ESTIMATE_WORKER: (
        protocol.ESTIMATE_WORKER,
        str(Path(__file__).with_name("estimate.py")),
    ),
}
"""What a Fork may name, `python -m WORKER`: the module whose `main` the forked worker runs,
and what sys.argv[0] is in a spawned one (a forked one says the same)."""


def cuda_driver_initialised() -> bool:
    """Whether this process has initialised the CUDA driver (cuInit), asked without
    initialising it: libcuda is looked up only if it is loaded already (RTLD_NOLOAD)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:  # not loaded: cuInit cannot have been called
        return False
    ctx = ctypes.c_void_p()
    return int(lib.cuCtxGetCurrent(ctypes.byref(ctx))) != CUDA_ERROR_NOT_INITIALIZED


def fork_unsafe() -> str | None:
    """Why this process must not fork a case, or None: CUDA or another Python thread."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the fork server (a workload module used the GPU at import)"
    if cuda_driver_initialised():
        return (
            "the CUDA driver is initialised in the fork server (a workload module called "
            "into CUDA at import)"
        )
    threads = threading.active_count()
    if threads > 1:
        # Native threads of libraries that handle fork themselves (OpenBLAS's pool) are
        # not counted; a Python thread may hold a lock the child would then wait on forever.
        return (
            f"{threads - 1} Python thread(s) run in the fork server (started by a workload "
            "module at import)"
        )
    return None


class Server:
    """The server's state: its channel, the environment probe it forked, its children."""

    def __init__(self, chan: protocol.Channel):
        self.chan = chan
        self.environment: tuple[int, int] | None = None
        """(pid, read end of its pipe) of the forked environment probe, until collected."""
        self.children: set[int] = set()
        self.warm = False
        """Whether what every case imports is imported (`warm_imports`)."""
        self.spawned: list[subprocess.Popen[bytes]] = []
        """REF's server of a pair, where it was started afresh (`start_twin`)."""

    def warm_up(self) -> None:
        """What every case imports, once: after the suite's discovery, so that a suite that
        cannot be imported, or selects nothing, is said without waiting for it."""
        if not self.warm:
            warm_imports()
            self.warm = True

    def fork(self, body: Callable[[], int]) -> int:
        """Fork a child that runs `body()` and exits with its status; returns its pid. The
        child never comes back into the server's loop, whatever it raises."""
        parent = os.getpid()
        with warnings.catch_warnings():  # the child leaves it too: its filters as they were
            # Python warns of fork in a process with threads: those are checked above.
            warnings.simplefilter("ignore", DeprecationWarning)
            gc.freeze()  # what the server holds, out of every later collection
            pid = os.fork()
        if pid:
            self.children.add(pid)
            return pid
        code = 1
        try:
            gc.set_threshold(*COLLECTING)
            os.setsid()  # its own session and process group, as a spawned worker's
            self.chan.close()
            if self.environment is not None:
                os.close(self.environment[1])
            die_with_parent(parent)
            # A worker's signals as a spawned one's: the server's own ignores are not its.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for sig in TERMINAL_SIGNALS[1:]:
                signal.signal(sig, signal.SIG_DFL)
            code = body()
        except SystemExit as exc:  # as the interpreter of a spawned worker would exit
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                with contextlib.suppress(Exception):
                    print(exc.code, file=sys.stderr)
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def start_environment_probe(self) -> None:
        """Fork the environment probe (memtrack.machine.environment.collect) now, so that it
        runs while the server imports the rest: its JSON comes back through a pipe."""
        if fork_unsafe() is not None:
            return
        read, write = os.pipe()

        def probe() -> int:
            os.close(read)
            from memtrack.machine import environment

            data = json.dumps(environment.collect()).encode()
            with os.fdopen(write, "wb") as out:
                out.write(data)
            return 0

        pid = self.fork(probe)
        os.close(write)
        self.environment = (pid, read)

    def collect_environment(self) -> protocol.EnvironmentProbed:
        if self.environment is None:
            return protocol.EnvironmentProbed(error="no environment probe was forked")
        pid, read = self.environment
        self.environment = None
        with os.fdopen(read, "rb") as f:
            data = f.read()
        code = self.reap(pid)
        try:
            return protocol.EnvironmentProbed(data=json.loads(data))
        except ValueError:
            return protocol.EnvironmentProbed(
                error=f"the forked environment probe exited with {code}"
            )

    def reap(self, pid: int) -> int:
        self.children.discard(pid)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return -signal.SIGKILL
        return os.waitstatus_to_exitcode(status)

    def discover(self, config: Any) -> protocol.Discovered | protocol.Failed:
        from memtrack.errors import MemtrackError
        from memtrack.workload.registry import (
            discover,
            import_failure,
            modules_where,
            repository_first,
            workload_data,
        )

        current: list[str] = []

        def importing(ref: str) -> None:
            current[:] = [ref]
            self.chan.send(protocol.Importing(ref))

        repository_first(config.root)  # this server serves one repository
        try:
            found = discover(config, importing)
        except KeyboardInterrupt as exc:
            # SIGINT is ignored here (the runner handles a terminal's ^C): this one was
            # raised by the module's own code, and is that module's failure.
            error: BaseException = import_failure(modules_where(config), current[0], exc)
            return protocol.Failed(type(error).__name__, str(error))
        except MemtrackError as exc:
            return protocol.Failed(type(exc).__name__, str(exc))
        except Exception as exc:  # a bug of memtrack's: still one line for the runner
            return protocol.Failed(
                "WorkloadError", f"discovery failed: {type(exc).__name__}: {exc}"
            )
        return protocol.Discovered(tuple(workload_data(w) for w in found))

    def fork_case(
        self, argv: list[str], fds: list[int], worker: str
    ) -> protocol.Forked | protocol.Refused | protocol.Failed:
        if len(fds) != 2:
            return protocol.Failed(
                "ProtocolError", f"Fork: {len(fds)} descriptors, not its stderr and go"
            )
        if worker not in FORKED_WORKERS:
            return protocol.Failed(
                "ProtocolError", f"Fork: no worker {worker!r} (one of {', '.join(FORKED_WORKERS)})"
            )
        module, argv0 = FORKED_WORKERS[worker]
        self.warm_up()
        stderr, go = fds
        reason = fork_unsafe()
        if reason is not None:
            return protocol.Refused(reason)
        server_pid = os.getpid()

        def case() -> int:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.dup2(stderr, 2)
            for fd in (devnull, stderr):
                os.close(fd)
            # The runner says when: the case is in its cgroup and watched by then.
            started = os.read(go, 1)
            os.close(go)
            if started != b"g":  # the runner has gone
                return 1
            main = importlib.import_module(module).main
            sys.argv = [argv0, *argv, str(server_pid)]
            return int(main([*argv, str(server_pid)]))

        return protocol.Forked(self.fork(case))

    def answer(self, message: protocol.Message, fds: list[int]) -> protocol.Message:
        """The reply to one request (the descriptors that came with it are the caller's)."""
        if isinstance(message, protocol.Discover):
            return self.discover(message.config)
        if isinstance(message, protocol.AskEnvironment):
            return self.collect_environment()
        if isinstance(message, protocol.Fork):
            return self.fork_case(list(message.argv), fds, message.worker)
        if isinstance(message, protocol.Reap):
            return protocol.Reaped(self.reap(message.pid))
        if isinstance(message, protocol.AskStatus):
            return protocol.ServerStatus(fork_unsafe(), _cuda_initialized(), os.getpid())
        return protocol.Failed(
            "ProtocolError", f"no op {type(message).__name__!r}"
        )  # a reply's kind

    def loop(self) -> None:
        while True:
            try:
                message, fds = self.chan.receive()
            except protocol.ChannelClosed:  # the runner is done (or gone)
                return
            except protocol.ProtocolError as exc:  # malformed: refused, its descriptors closed
                reply: protocol.Message = protocol.Failed("ProtocolError", str(exc))
            else:
                try:
                    reply = self.answer(message, fds)
                finally:
                    for fd in fds:
                        with contextlib.suppress(OSError):
                            os.close(fd)
            try:
                self.chan.send(reply)
            except protocol.ChannelClosed:
                return
            if isinstance(reply, protocol.Discovered):
                self.warm_up()  # while the runner selects its cases and opens its outputs

    def serve(self) -> int:
        """Answer the runner until it is done, then end what is left of the children (none
        runs: the runner ended each case) and the twin, if any."""
        self.loop()
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.reap(pid)
        return 0


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def warm_imports() -> None:
    """What every case imports, imported once here: the worker, its probes, MemTracker (which
    pulls in much of torch.distributed and torch._dynamo, as long again as torch itself), the
    context. A paired timing's sides measure time alone, yet their servers import MemTracker
    too: torch._dynamo is what any optimizer imports at its first construction (through
    `torch._disable_dynamo`), so a training case's side would pay for it in its setup
    (0.9-1.0 s, each side of the shipped train_step), where a server pays it once, beside the
    run's own."""
    import memtrack.probes.framework
    import memtrack.probes.host
    import memtrack.probes.loading
    import memtrack.worker.distributed
    import memtrack.worker.measure
    import memtrack.workload.context
    import memtrack.workload.sessions  # noqa: F401

    with contextlib.suppress(ImportError):  # torch < 2.5: the CPU probe says why, per case
        import torch.distributed._tools.mem_tracker  # noqa: F401


def of_a_tree(roots: list[Path]) -> str | None:
    """The first module this process imported from one of `roots` (a repository's own code,
    not a package installed in an environment that lives there, nor the standard library),
    or None. By real paths: a tree reached through a link is the tree."""
    trees = tuple(os.path.join(os.path.realpath(r), "") for r in roots)
    installed = tuple(
        os.path.join(os.path.realpath(p), "")
        for p in {
            *site.getsitepackages(),
            *(sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")),
        }
    )
    real: dict[str, str] = {}  # a module's folder, really
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not os.path.isabs(file):  # torch.ops's is "_ops.py"
            continue
        folder = os.path.dirname(file)
        if folder not in real:
            real[folder] = os.path.join(os.path.realpath(folder), "")
        where = real[folder]
        if where.startswith(trees) and not where.startswith(installed):
            return name
    return None


def serve_twin(fd: int, stderr: int, root: Path, started_in: str) -> int:
    """REF's side, in a child forked from the candidate's side once its imports are done: a
    server on its own channel, in REF's tree as a server started there (its working folder, on
    its import path where the candidate's was) would be."""
    os.dup2(stderr, 2)
    os.close(stderr)
    for sig in TERMINAL_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    gc.set_threshold(*YOUNG_ONLY)
    os.chdir(root)
    sys.path[:] = [str(root) if p == started_in else p for p in sys.path]
    importlib.invalidate_caches()
    twin = Server(protocol.Channel(socket.socket(fileno=fd)))
    twin.warm = True
    return twin.serve()


def start_twin(server: Server, twin: list[str], started_in: str) -> None:
    """REF's side of a pair (`twin`: its channel's descriptor, its stderr's, its tree): forked
    from this server, with what it imported; or, where this server holds a module of either
    tree or must not fork, a server of its own, started afresh in REF's tree (it dies with
    this one, as this one dies with the runner)."""
    fd, stderr, root = int(twin[0]), int(twin[1]), Path(twin[2])
    forks = sys.platform.startswith("linux") and fork_unsafe() is None
    if forks and of_a_tree([Path(started_in), root]) is None:
        server.fork(lambda: serve_twin(fd, stderr, root, started_in))
    else:
        argv = [sys.executable, "-m", "memtrack.worker.server", str(fd), str(os.getpid()), "pairs"]
        spawned = subprocess.Popen(
            argv, pass_fds=[fd], stdin=subprocess.DEVNULL, stderr=stderr, cwd=root
        )
        # held, so that subprocess never reaps it behind the server, which reaps it at its
        # end as it reaps every child
        server.spawned.append(spawned)
        server.children.add(spawned.pid)
    os.close(fd)
    os.close(stderr)


def main(argv: list[str]) -> int:
    fd, runner_pid = int(argv[0]), int(argv[1])
    die_with_parent(runner_pid)
    # A terminal's ^C, ^\ and hangup reach the whole foreground group: they are the runner's
    # to handle, and it ends this server when it is done.
    for sig in TERMINAL_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    gc.set_threshold(*YOUNG_ONLY)
    server = Server(protocol.Channel(socket.socket(fileno=fd)))
    pairs, twin, started_in = argv[2:3] == ["pairs"], argv[3:6], os.getcwd()
    if twin and of_a_tree([Path(started_in), Path(twin[2])]) is not None:
        start_twin(server, twin, started_in)  # memtrack itself from a tree: spawned, at once
        twin = []
    import torch  # noqa: F401

    if pairs:  # a paired timing's side: its cases are known to import
        server.warm_up()
    else:
        server.start_environment_probe()
    if twin:  # the candidate's side of a pair, imports done: REF's side from it
        start_twin(server, twin, started_in)
    return server.serve()  # the rest of what cases import, once the suite is discovered


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
