"""The fork server: each case is still a process of its own (its own pid, session and process
group, its own peaks), forked from a server that imported torch and the suite once, with the
same figures as a case started as a fresh interpreter; where the server must not fork (CUDA or
a thread started in it), cases are spawned and say why. Real subprocess workloads on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memtrack.config import load_config
from memtrack.measure.forkserver import SPAWN_VARIABLE, ForkServer
from memtrack.measure.launcher import worker_env
from memtrack.measure.suite import probe_environment, run_suite
from memtrack.records import metrics
from memtrack.workload.registry import discover, select_cases

WORKLOADS = textwrap.dedent(
    """
    import gc, json, os, pathlib
    import torch
    import memtrack

    SEEN = pathlib.Path(__file__).parent / "seen"

    def where(name):
        SEEN.mkdir(exist_ok=True)
        parent = pathlib.Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\\0")
        (SEEN / f"{name}.json").write_text(json.dumps({
            "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
            "pgid": os.getpgid(0), "parent": [a.decode() for a in parent if a],
            "collector": [gc.isenabled(), *gc.get_threshold()],
        }))

    @memtrack.workload
    def big(ctx):
        where("big")
        def step():
            held = b"\\1" * (384 * 2**20)  # touched: resident while it lives
            return len(held)
        return step

    @memtrack.workload(params={"i": [0, 1]})
    def small(ctx):
        where(f"small-{ctx['i']}")
        w = torch.nn.Linear(64, 64)
        ctx.mark(w)
        x = ctx.randn(8, 64)
        return lambda: torch.relu(w(x)).sum()

    @memtrack.workload
    def exits(ctx):
        where("exits")
        def step():
            raise SystemExit(3)
        return step
    """
)


def _suite(root: Path, source: str = WORKLOADS):
    (root / "wl.py").write_text(source)
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\nwarmup = 1\nrepeats = 2\n')
    config = load_config(root / "memtrack.toml")
    return config, select_cases(discover(config))


def _seen(root: Path) -> dict[str, dict]:
    seen = {p.stem: json.loads(p.read_text()) for p in (root / "seen").glob("*.json")}
    for p in (root / "seen").glob("*.json"):
        p.unlink()
    return seen


def _spawn_notes(run) -> list[str]:
    return [n for m in run.measurements for n in m.notes if "fresh interpreter" in n]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
    """The suite run twice: forked by the fork server, then with every case spawned (each a
    fresh interpreter, so one case of `small` stands for both)."""
    root = tmp_path_factory.mktemp("suite")
    config, cases = _suite(root)
    forked = run_suite(config, cases)
    forked_seen = _seen(root)
    mp = pytest.MonkeyPatch()
    mp.setenv(SPAWN_VARIABLE, "1")
    try:
        spawned = run_suite(config, [c for c in cases if c.case_id != "small[i=1]"])
    finally:
        mp.undo()
    return root, (forked, forked_seen), (spawned, _seen(root))


def test_each_case_is_a_process_of_its_own_forked_by_the_server(both_ways):
    _, (run, seen), _ = both_ways
    assert [m.status for m in run.measurements] == ["ok", "ok", "ok", "crashed"]
    assert _spawn_notes(run) == []
    pids = {s["pid"] for s in seen.values()}
    assert len(pids) == 4 and os.getpid() not in pids
    for s in seen.values():
        # its own session and process group, as a spawned worker has
        assert s["sid"] == s["pgid"] == s["pid"]
        # a child of the fork server, not of the runner
        assert s["ppid"] != os.getpid()
        assert "memtrack.worker.server" in s["parent"]
    assert len({s["ppid"] for s in seen.values()}) == 1  # one server for the run


def test_a_case_after_a_large_one_has_its_own_host_peak(both_ways):
    _, (run, _), _ = both_ways
    by_id = {m.case_id: m for m in run.measurements}
    big, small = by_id["big"], by_id["small[i=0]"]
    assert big.host_peak_source == small.host_peak_source == "vmhwm"
    # each case starts from the server, not from the case before it, its peak reset
    assert big.host_peak_rss_bytes - small.host_peak_rss_bytes > 300 * 2**20


def test_spawned_cases_are_fresh_interpreters_and_say_so(both_ways):
    _, _, (run, seen) = both_ways
    assert [m.status for m in run.measurements] == ["ok", "ok", "crashed"]
    assert len(seen) == 3
    for s in seen.values():
        assert s["ppid"] == os.getpid() and s["sid"] == s["pid"]
    assert len(_spawn_notes(run)) == 3
    assert all(n.endswith(f"{SPAWN_VARIABLE}=1") for n in _spawn_notes(run))


def test_a_forked_case_collects_garbage_as_a_fresh_interpreter_does(both_ways):
    """The server never makes a full collection; its cases, forked or spawned, run under
    the collector as Python starts it."""
    _, (_, forked), (_, spawned) = both_ways
    python = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.isenabled(), *gc.get_threshold())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    default = [python[0] == "True", *map(int, python[1:])]
    assert default[0] and default[3] < 2**30
    for seen in (forked, spawned):
        assert {name: s["collector"] for name, s in seen.items()} == dict.fromkeys(seen, default)


def test_figures_are_the_same_forked_or_spawned(both_ways):
    _, (forked, _), (spawned, _) = both_ways
    alike = [m for m in forked.measurements if m.case_id != "small[i=1]"]
    for f, s in zip(alike, spawned.measurements, strict=True):
        assert (f.case_id, f.status, f.message) == (s.case_id, s.status, s.message)
        if f.status != "ok":  # `exits`: its step's SystemExit(3), as an interpreter exits
            assert f.message == "exited with status 3 in phase 'warmup'"
            continue
        for field in ("peak_allocated_bytes", "persistent_bytes", "weights_bytes"):
            assert getattr(f, field) == getattr(s, field), (f.case_id, field)
        host_f, host_s = metrics.value(f, "host"), metrics.value(s, "host")
        assert host_f is not None and host_s is not None
        assert abs(host_f - host_s) <= metrics.floor("host", host_s), (f.case_id, host_f, host_s)


# A stand-in for a workload module that used the GPU at import (this machine has none): torch
# says CUDA is initialised in the process that imported it.
CUDA_AT_IMPORT = "import torch\ntorch.cuda.is_initialized = lambda: True\n" + WORKLOADS
THREAD_AT_IMPORT = (
    "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n" + WORKLOADS
)


@pytest.mark.parametrize(
    "source, why",
    [
        (CUDA_AT_IMPORT, "CUDA is initialised in the fork server"),
        (THREAD_AT_IMPORT, "1 Python thread(s) run in the fork server"),
    ],
)
def test_a_server_that_must_not_fork_spawns_its_cases_and_says_why(tmp_path, source, why):
    config, cases = _suite(tmp_path, source)
    cases = [c for c in cases if c.case_id == "small[i=0]"]
    run = run_suite(config, cases)
    assert [m.status for m in run.measurements] == ["ok"]
    (seen,) = _seen(tmp_path).values()
    assert seen["ppid"] == os.getpid()  # spawned by the runner
    (note,) = _spawn_notes(run)
    assert why in note, note


# Where the server and each case read torch's CUDA check from (a CPU build never asks).
CHECK_AT_IMPORT = (
    "import os, pathlib\n"
    "(pathlib.Path(__file__).parent / 'check').write_text(\n"
    "    os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK', 'unset'))\n" + WORKLOADS
)


def test_torch_asks_nvml_whether_cuda_is_available_in_the_server_and_its_cases(tmp_path):
    # torch.cuda.is_available() at a workload module's import initialised the CUDA driver in
    # the server (cudaGetDeviceCount), and every case was spawned; asked of NVML, it is not.
    config, cases = _suite(tmp_path, CHECK_AT_IMPORT)
    run = run_suite(config, [c for c in cases if c.workload == "small"])
    assert [m.status for m in run.measurements] == ["ok", "ok"]
    assert (tmp_path / "check").read_text() == "1"
    assert _spawn_notes(run) == []
    assert worker_env({})["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert (
        worker_env({"PYTORCH_NVML_BASED_CUDA_CHECK": "0"})["PYTORCH_NVML_BASED_CUDA_CHECK"] == "0"
    )


def test_the_server_itself_never_initialises_cuda(tmp_path):
    """Before and after forking a case (and the environment probe, which starts CUDA in its
    own fork), the server holds no CUDA: on a GPU machine this is the real check; here the
    CPU build proves the wiring of the guard the server checks before each fork."""
    from memtrack.measure.case import run_case

    config, cases = _suite(tmp_path)
    with ForkServer.start(worker_env()) as server:
        assert server.ready(config)
        env = server.environment()
        # the fingerprint baselines compare is the one a fresh interpreter's probe gives
        assert env == probe_environment()
        before = server.status()
        device = "cuda" if env.cuda_available else "cpu"
        m = run_case(
            config,
            next(c for c in cases if c.case_id == "small[i=1]"),
            device,
            env.visible_uuids,
            server=server,
        )
        after = server.status()
    assert m.status == "ok" and not [n for n in m.notes if "fresh interpreter" in n]
    for status in (before, after):
        assert status.unsafe is None and status.cuda_initialized is False
    assert _seen(tmp_path)["small-1"]["ppid"] == before.pid


@pytest.mark.gpu
def test_a_cuda_case_is_forked_and_measured_with_the_server_untouched(tmp_path):
    source = WORKLOADS.replace("torch.nn.Linear(64, 64)", "torch.nn.Linear(64, 64).to(ctx.device)")
    config, cases = _suite(tmp_path, source)
    with ForkServer.start(worker_env()) as server:
        assert server.ready(config)
        env = server.environment()
        assert env is not None and env.cuda_available
        from memtrack.measure.case import run_case

        m = run_case(
            config,
            next(c for c in cases if c.case_id == "small[i=1]"),
            "cuda",
            env.visible_uuids,
            server=server,
        )
        status = server.status()
    assert m.status == "ok", m.message
    assert m.peak_allocated_bytes and m.peak_allocated_bytes >= 64 * 64 * 4
    assert status.unsafe is None and status.cuda_initialized is False


@pytest.mark.gpu
def test_a_workload_module_that_asks_for_cuda_at_import_keeps_its_cases_forked(tmp_path):
    # `is_available()` and `device_count()` at import: NVML is asked, the driver is not
    # initialised in the server, and the cases are forked and run on the GPU.
    source = (
        "import torch\n"
        "DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "GPUS = torch.cuda.device_count()\n"
        + WORKLOADS.replace("torch.nn.Linear(64, 64)", "torch.nn.Linear(64, 64).to(ctx.device)")
    )
    config, cases = _suite(tmp_path, source)
    run = run_suite(config, [c for c in cases if c.workload == "small"])
    assert [(m.status, m.device) for m in run.measurements] == [("ok", "cuda")] * 2
    assert _spawn_notes(run) == []


def test_a_malformed_message_is_refused_and_the_server_keeps_serving():
    import pickle
    import struct

    from memtrack.worker.protocol import Failed, Fork

    def send_raw(server, message) -> object:
        body = pickle.dumps(message)
        server.chan.sock.sendall(struct.pack("!I", len(body)) + body)
        reply, _ = server.chan.receive(600)
        return reply

    with ForkServer.start(worker_env()) as server:
        assert send_raw(server, {"op": "fork", "argv": []}) == Failed(
            "ProtocolError", "no op 'fork'"
        )
        assert send_raw(server, {"op": "Fork"}) == Failed("ProtocolError", "Fork: missing key argv")
        assert send_raw(server, {"op": "Reap", "pid": 1, "signal": 9}) == Failed(
            "ProtocolError", "Reap: unknown key(s) 'signal'"
        )
        server.chan.send(Fork(("spec.json",)))  # without its two descriptors
        reply, _ = server.chan.receive(600)
        assert isinstance(reply, Failed) and reply.kind == "ProtocolError"
        read, write = os.pipe()
        try:  # a worker that is neither the measuring nor the estimating one
            server.chan.send(Fork(("spec.json",), "os"), fds=[write, read])
        finally:
            os.close(read)
            os.close(write)
        reply, _ = server.chan.receive(600)
        assert reply == Failed(
            "ProtocolError",
            "Fork: no worker 'os' (one of memtrack.worker, memtrack.worker.estimate)",
        )
        assert server.status().unsafe is None  # still answering


TREE_SUITE = """\
import importlib.util

import memtrack
from treelib import TREE  # the repository's own code, which differs between the two trees

OWN = importlib.util.find_spec("ownlib") is not None  # a module in the candidate's tree only


@memtrack.workload(params={"tree": [TREE], "sees_ownlib": [OWN]})
def where(ctx):
    return lambda: None
"""


def _tree(root: Path, name: str) -> Path:
    root.mkdir()
    (root / "wl.py").write_text(TREE_SUITE)
    (root / "treelib.py").write_text(f"TREE = {name!r}\n")
    if name == "own":
        (root / "ownlib.py").write_text("")
    (root / "memtrack.toml").write_text('modules = ["wl.py"]\n')
    return root


def _process(pid: int) -> tuple[int, list[str]]:
    """A process's parent and command line, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(stat.rsplit(")", 1)[1].split()[1]), [a.decode() for a in cmdline if a]


def test_a_pairs_server_serves_refs_tree_from_a_twin_forked_after_its_imports(tmp_path):
    """Both sides of a paired timing from one server's imports: REF's side is served by a twin
    of the candidate's server, forked once its imports are done (its child, with its command
    line: no interpreter started again), in REF's tree: the workload module and the
    repository's own module it imports are REF's, and the candidate's server still has its
    own."""
    own, ref = _tree(tmp_path / "own", "own"), _tree(tmp_path / "ref", "ref")
    with ForkServer.start(worker_env(), cwd=own, pairs=True, twin=ref) as server:
        assert server.twin is not None
        (theirs,) = server.twin.discover(load_config(ref / "memtrack.toml"))
        (mine,) = server.discover(load_config(own / "memtrack.toml"))
        # REF's import path holds REF's tree, not the candidate's
        assert theirs.params == {"tree": ("ref",), "sees_ownlib": (False,)}
        assert mine.params == {"tree": ("own",), "sees_ownlib": (True,)}
        pid, twin = server.status().pid, server.twin.status().pid
        assert twin != pid
        parent, cmdline = _process(twin)
        assert parent == pid and cmdline == _process(pid)[1]
        assert Path(f"/proc/{twin}/cwd").resolve() == ref.resolve()


def test_where_memtrack_is_imported_from_a_tree_the_twin_is_a_fresh_interpreter(tmp_path):
    """memtrack measuring itself: the pair's server imported memtrack's own code from the
    tree, and a twin would run the candidate's memtrack on REF's side. REF's side is a server
    started afresh in REF's tree instead (still the child of the pair's server)."""
    import memtrack

    tree = Path(memtrack.__file__).resolve().parents[1]
    if any(part in ("site-packages", "dist-packages") for part in tree.parts):
        pytest.skip(f"memtrack is installed, not imported from a tree ({tree})")
    own = _tree(tmp_path / "own", "own")
    with ForkServer.start(worker_env(), cwd=own, pairs=True, twin=tree) as server:
        assert server.twin is not None
        pid, twin = server.status().pid, server.twin.status().pid
        parent, cmdline = _process(twin)
        assert parent == pid
        # `python -m memtrack.worker.server FD PARENT pairs`: no twin of its own
        assert cmdline[-5:-3] == ["-m", "memtrack.worker.server"]
        assert cmdline[-2:] == [str(pid), "pairs"]
        assert Path(f"/proc/{twin}/cwd").resolve() == tree


KILLS_THE_SERVER = WORKLOADS + textwrap.dedent(
    """
    import signal

    @memtrack.workload
    def aaa_kills_its_server(ctx):
        import time
        server = os.getppid()
        os.kill(server, signal.SIGKILL)
        while os.getppid() == server:  # the server is still exiting
            time.sleep(0.01)
        time.sleep(60)  # its parent-death signal ends this case long before
        return lambda: None
    """
)


def test_a_case_that_kills_the_server_crashes_and_the_rest_are_spawned(tmp_path):
    config, cases = _suite(tmp_path, KILLS_THE_SERVER)
    cases = sorted(
        (c for c in cases if c.workload not in ("big", "exits")), key=lambda c: c.case_id
    )
    run = run_suite(config, cases)
    first, *rest = run.measurements
    assert first.workload == "aaa_kills_its_server"
    # the server's death took its forked case with it (its parent-death signal)
    assert first.status == "crashed" and "SIGKILL" in first.message
    assert [m.status for m in rest] == ["ok", "ok"]
    for m in rest:
        assert any("not forked: the fork server exited (SIGKILL)" in n for n in m.notes), m.notes
