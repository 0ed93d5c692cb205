"""The wheel built from this tree is complete: every package of memtrack/ and dashboard/ is in
it, with the schema and the GPU catalog, and installed non-editable into a fresh environment
outside the checkout it serves `memtrack dashboard`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from factories import venv_with_this_environment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        cwd=out,
    )
    (whl,) = out.glob("memtrack-*.whl")
    return whl


def test_the_wheel_holds_every_package_of_the_tree_and_its_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"memtrack/{p.relative_to(ROOT / 'memtrack').as_posix()}"
        for p in (ROOT / "memtrack").rglob("*.py")
    }
    expected |= {
        f"memtrack/dashboard/{p.relative_to(ROOT / 'dashboard').as_posix()}"
        for p in (ROOT / "dashboard").rglob("*.py")
    }
    assert expected - names == set()
    assert {
        "memtrack/records/schema/run-record.schema.json",
        "memtrack/plan/gpus.toml",
        "memtrack/py.typed",
    } <= names
    assert not any(n.startswith("dashboard/") for n in names)  # no top-level package of that name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_serves_the_dashboard(wheel, tmp_path):
    venv = tmp_path / "venv"
    # torch, Streamlit and the rest come from this environment; memtrack only from the wheel
    python = venv_with_this_environment(venv)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    env = {**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    env.pop("PYTHONPATH", None)  # memtrack from the wheel alone
    where = subprocess.run(
        [str(python), "-c", "from memtrack.commands.dashboard import app_path;print(app_path())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=env,
    )
    app = Path(where.stdout.strip())
    assert app.is_file() and str(app).startswith(str(venv)), app

    port = _free_port()
    server = subprocess.Popen(
        [
            str(venv / "bin" / "memtrack"),
            "dashboard",
            "--db",
            str(tmp_path / "m.db"),
            "--port",
            str(port),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        health = None
        deadline = time.monotonic() + 240  # a bound on a hung start, not a speed
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/_stcore/health", timeout=5
                ) as r:
                    health = r.read().decode()
                    break
            except OSError:
                time.sleep(0.5)
        assert health == "ok", server.stdout.read().decode() if server.poll() is not None else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.status == 200 and b'<div id="root">' in r.read()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
