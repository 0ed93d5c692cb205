"""The runner's side of the fork server (memtrack.worker.server): one per run, started before
anything else so that it imports torch and the suite while the runner reads its config and
takes the git facts. It discovers the suite's workloads (the runner itself never imports a
workload module), probes the environment from a fork, and forks each case's worker.

Where the server cannot fork (no Linux pidfd, MEMTRACK_SPAWN=1, CUDA or a thread started in
it by a workload module, a server that exited), the case is started as a fresh interpreter
instead, as every case once was, and `note` says why: the launcher puts it on the case.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TypeVar

from memtrack import errors
from memtrack.config import Config
from memtrack.errors import MemtrackError, WorkloadError
from memtrack.machine import environment
from memtrack.measure.guard import runner_guard
from memtrack.records import Environment
from memtrack.worker.protocol import (
    AskEnvironment,
    AskStatus,
    Channel,
    ChannelClosed,
    Discover,
    Discovered,
    EnvironmentProbed,
    Failed,
    Fork,
    Forked,
    Importing,
    Message,
    ProtocolError,
    Reap,
    Reaped,
    Refused,
    ServerStatus,
)
from memtrack.workload.registry import Workload, discover, from_data, modules_where

SERVER = "memtrack.worker.server"
SPAWN_VARIABLE = "MEMTRACK_SPAWN"
"""Set to 1: every case starts as a fresh interpreter (the fork server only discovers)."""
REPLY_TIMEOUT_S = 60.0
"""How long a fork or a reap may take the server (a fork of a large process is a few ms)."""
STARTUP_TIMEOUT_S = 600.0
"""How long the server may take to import torch and the suite, and the environment probe."""
CLOSE_TIMEOUT_S = 10.0

M = TypeVar("M", bound=Message)


def fork_unavailable() -> str | None:
    """Why cases cannot be forked on this machine at all, or None."""
    if os.environ.get(SPAWN_VARIABLE, "") not in ("", "0"):
        return f"{SPAWN_VARIABLE}={os.environ[SPAWN_VARIABLE]}"
    if not sys.platform.startswith("linux"):
        return f"no fork server on {sys.platform}"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # the runner waits on a forked case through its pidfd
        return "no pidfd here (Linux before 5.3)"
    return None


class ForkedWorker:
    """A case's worker forked by the server: not the runner's child, so it is waited on
    through its pidfd (probes.tree) and reaped by the server, once its tree has ended."""

    def __init__(self, server: ForkServer, pid: int, go: int):
        self.server = server
        self.pid = pid
        self.go: int | None = go
        self.returncode: int | None = None

    def start(self) -> None:
        """Let it run its case: it is in the case's cgroup and watched by now."""
        if self.go is not None:
            with contextlib.suppress(OSError):
                os.write(self.go, b"g")
            os.close(self.go)
            self.go = None

    def wait(self) -> int:
        """Its exit status (negative: the signal), once it has ended."""
        if self.go is not None:  # never started: closing its pipe makes it exit
            os.close(self.go)
            self.go = None
        if self.returncode is None:
            self.returncode = self.server.reap(self.pid)
        return self.returncode


class ForkServer:
    """One run's fork server. `note` is None while it forks cases, else why it does not."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes] | None,
        chan: Channel | None,
        stderr: IO[bytes] | None,
        env: Mapping[str, str],
        note: str | None,
    ):
        self.proc = proc
        self.chan = chan
        self.stderr = stderr
        self.env = dict(env)
        self.note = note
        self.discovered: list[Workload] | None = None
        self.discovery_error: str | None = None
        self.forked = False
        """Whether the server forked a case: until then it has nothing to reap at its end."""
        self.twin: ForkServer | None = None
        """REF's side of a pair, served by a process this server started (`start`'s `twin`)."""

    @classmethod
    def start(
        cls,
        env: Mapping[str, str],
        cwd: Path | None = None,
        *,
        pairs: bool = False,
        twin: Path | None = None,
    ) -> ForkServer:
        """Start the server in `env` (the workers' environment), in `cwd` (by default this
        process's); it begins importing at once. The runner's guard first: what a workload
        module starts at its import is guarded too. The server of a paired timing's side
        (`pairs`) imports what every case imports at once, and forks no environment probe; with
        `twin` (REF's tree), it also serves REF's side, its `twin` (worker.server.start_twin)."""
        runner_guard()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stderr = tempfile.TemporaryFile()
        twin_ours, twin_theirs, twin_stderr = (
            (*socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM), tempfile.TemporaryFile())
            if twin is not None
            else (None, None, None)
        )
        passed = [theirs.fileno()]
        argv = [sys.executable, "-m", SERVER, str(theirs.fileno()), str(os.getpid())]
        if pairs or twin is not None:  # a twin is a pair's
            argv.append("pairs")
        if twin_theirs is not None and twin_stderr is not None:
            passed += [twin_theirs.fileno(), twin_stderr.fileno()]
            argv += [str(twin_theirs.fileno()), str(twin_stderr.fileno()), str(twin)]
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=passed,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=dict(env),
                cwd=cwd,
            )
        except OSError as exc:
            for end in (ours, twin_ours, twin_stderr):
                if end is not None:
                    end.close()
            stderr.close()
            server = cls(None, None, None, env, f"the fork server did not start ({exc})")
            if twin is not None:
                server.twin = cls(None, None, None, env, server.note)
            return server
        finally:
            theirs.close()
            if twin_theirs is not None:
                twin_theirs.close()
        server = cls(proc, Channel(ours), stderr, env, fork_unavailable())
        if twin_ours is not None:
            server.twin = cls(None, Channel(twin_ours), twin_stderr, env, fork_unavailable())
        return server

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the suite -------------------------------------------------------------------------

    def discover(self, config: Config) -> list[Workload]:
        """The suite's workloads, imported and checked in the server (registry.discover):
        its WorkloadError (or ConfigError) where that fails, naming the module, also when
        the module's import ends the server's process (`os._exit`)."""
        if self.discovered is not None:
            return self.discovered
        if self.discovery_error is not None:
            raise WorkloadError(self.discovery_error)
        if self.chan is None:  # no server to import it: here, then
            self.discovered = discover(config)
            return self.discovered
        importing: str | None = None
        try:
            self.chan.send(Discover(config))
            while True:
                reply, _ = self.chan.receive(STARTUP_TIMEOUT_S)
                if isinstance(reply, Importing):
                    importing = reply.ref
                    continue
                break
        except ChannelClosed:
            code = self._ended()
            where = modules_where(config)
            if importing is None:
                why = f"the fork server exited ({code}) before importing the suite"
                self.discovery_error = f"{where}: {why}{self._stderr_line()}"
            else:
                self.discovery_error = (
                    f"{where}: cannot import {importing!r}: it ended the "
                    f"process ({code}){self._stderr_line()}"
                )
            raise WorkloadError(self.discovery_error) from None
        if isinstance(reply, Failed):
            self.discovery_error = reply.message
            raise _error_class(reply.kind)(self.discovery_error)
        self.discovered = [from_data(d) for d in _expect(reply, Discovered).workloads]
        return self.discovered

    def ready(self, config: Config) -> bool:
        """Whether the server has the suite imported, discovering it now if not yet (for a
        caller that discovered the suite itself); where that fails, `note` says why."""
        try:
            self.discover(config)
        except MemtrackError as exc:
            self.stop(f"the fork server could not import the suite ({exc})")
            return False
        return True

    def environment(self) -> Environment | None:
        """The environment fingerprint from the probe the server forked at its start; None
        where it could not (the caller probes in a fresh interpreter then)."""
        if self.chan is None or self.note is not None:
            return None
        try:
            reply = self._ask(AskEnvironment(), EnvironmentProbed, STARTUP_TIMEOUT_S)
        except ChannelClosed:
            self.stop(f"the fork server exited ({self._ended()})")
            return None
        if reply.data is None:
            return None
        return environment.from_dict(reply.data)

    # -- cases -----------------------------------------------------------------------------

    def fork(
        self, argv: list[str], stderr: int, env: Mapping[str, str], worker: str
    ) -> ForkedWorker | str:
        """A forked worker running `python -m WORKER ARGV` in effect (the measuring worker, or
        the estimating one), held until `start()`; or why the server does not fork it (the
        caller spawns it then)."""
        if self.chan is None or self.note is not None:
            return self.note or "the fork server has ended"
        if dict(env) != self.env:
            # A forked case inherits the server's environment: this one needs another.
            return "the case's environment is not the fork server's"
        go_read, go_write = os.pipe()
        try:
            self.chan.send(Fork(tuple(argv), worker), fds=[stderr, go_read])
            reply, _ = self.chan.receive(REPLY_TIMEOUT_S)
        except ChannelClosed:
            os.close(go_write)
            return self.stop(f"the fork server exited ({self._ended()})")
        finally:
            os.close(go_read)
        if isinstance(reply, Forked):
            self.forked = True
            return ForkedWorker(self, reply.pid, go_write)
        os.close(go_write)
        if isinstance(reply, Refused):
            return self.stop(reply.reason)
        return self.stop(_expect(reply, Failed).message)

    def reap(self, pid: int) -> int:
        """The exit status of a forked worker whose tree has ended, reaped by the server."""
        if self.chan is not None:
            try:
                return self._ask(Reap(pid), Reaped, REPLY_TIMEOUT_S).returncode
            except ChannelClosed:
                self.stop(f"the fork server exited ({self._ended()})")
        # The server has gone, and its parent-death signal took the worker with it.
        return -signal.SIGKILL

    def status(self) -> ServerStatus:
        """The server's own view: why it would refuse a fork now, whether CUDA is initialised
        in it, its pid."""
        return self._ask(AskStatus(), ServerStatus, REPLY_TIMEOUT_S)

    def _ask(self, request: Message, kind: type[M], timeout_s: float) -> M:
        """The server's reply to `request`, of the kind asked for; ChannelClosed where the
        server has gone or does not answer in time."""
        assert self.chan is not None
        self.chan.send(request)
        reply, _ = self.chan.receive(timeout_s)
        return _expect(reply, kind)

    # -- its end ---------------------------------------------------------------------------

    def stop(self, why: str) -> str:
        """No more forks from this server: every later case is spawned, saying `why`."""
        if self.note is None:
            self.note = why
        return self.note

    def close(self) -> None:
        """End the server: it exits at the end of its channel (or is killed after a wait);
        its twin first."""
        if self.twin is not None:
            self.twin.close()
        if self.chan is not None:
            self.chan.close()
            self.chan = None
        if self.proc is not None:
            if not self.forked and self.proc.poll() is None:
                # No case forked (the run ended before its first case: refused, an
                # interrupt): nothing of the server's is worth waiting for.
                self.proc.kill()
            try:
                self.proc.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    def _ended(self) -> str:
        """How the server ended ('exit status 0', 'SIGKILL'), once its channel closed."""
        if self.chan is not None:
            self.chan.close()
            self.chan = None
        if self.proc is None:  # a twin: its status is its parent server's to read
            return "never started" if self.stderr is None else "its status unknown"
        try:
            code = self.proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if code < 0:
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return f"exit status {code}"

    def _stderr_line(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        lines = self.stderr.read()[-4000:].decode(errors="replace").strip().splitlines()
        return f": {lines[-1][:300]}" if lines else ""


def _expect(reply: Message, kind: type[M]) -> M:
    """`reply` if it is of `kind`; another reply is a bug of the server's (ProtocolError)."""
    if not isinstance(reply, kind):
        raise ProtocolError(f"the fork server answered {type(reply).__name__}, not {kind.__name__}")
    return reply


def _error_class(kind: str) -> type[MemtrackError]:
    found = getattr(errors, kind, None)
    if isinstance(found, type) and issubclass(found, MemtrackError):
        return found
    return WorkloadError


__all__ = ["SPAWN_VARIABLE", "ForkServer", "ForkedWorker", "fork_unavailable"]
