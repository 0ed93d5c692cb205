"""The dashboard served by `streamlit run` and loaded by a real headless Chromium (Debian's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from test_dashboard import D8, VISION, free_port, seed_store, wait_healthy

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: CI installs Debian's chromium (.ci/run)")
        pytest.skip(f"Debian's chromium is not installed ({CHROMIUM}); apt-get install chromium")
    pytest.importorskip("playwright")
    return CHROMIUM


@pytest.fixture
def server(chromium: Path, tmp_path: Path) -> Iterator[str]:
    seeded = seed_store(tmp_path)
    port = free_port()
    env = {
        **os.environ,
        "STREAMLIT_SERVER_HEADLESS": "true",
        "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
        "STREAMLIT_SERVER_ADDRESS": "127.0.0.1",
        "STREAMLIT_SERVER_PORT": str(port),
        "STREAMLIT_CLIENT_TOOLBAR_MODE": "minimal",
    }
    log = tmp_path / "streamlit.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--",
             "--db", str(seeded["db"]), "--config", str(seeded["config"])],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_the_overview_loads_in_chromium(chromium: Path, server: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    shot, history_shot = tmp_path / "dashboard.png", tmp_path / "dashboard-history.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(chromium),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(server, wait_until="domcontentloaded", timeout=60_000)
            # The overview's content: the call-outs name the failed and over-budget cases.
            page.get_by_text(VISION).first.wait_for(timeout=60_000)
            page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1500)  # the table draws on a canvas after it mounts
            body = page.inner_text("body")
            assert "Overview" in body and D8 in body and "over budget" in body
            assert page.locator("[data-testid='stException']").count() == 0
            page.screenshot(path=str(shot), full_page=True)

            # A deep link to a history page: both charts draw, still no exception.
            page.goto(f"{server}/?page=History&case={quote(D8)}", wait_until="domcontentloaded")
            page.get_by_text("Where the series moved").wait_for(timeout=60_000)
            charts = page.locator("[data-testid='stVegaLiteChart']")
            charts.nth(1).wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            assert charts.count() == 2
            assert page.locator("[data-testid='stException']").count() == 0
            page.screenshot(path=str(history_shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "dashboard.png")
    shutil.copyfile(history_shot, ARTIFACTS / "dashboard-history.png")
