"""The dashboard served by `streamlit run` and loaded by a real headless Chromium (Debian's)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from test_dashboard import D8, free_port, seed_store, wait_healthy

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: CI installs Debian's chromium (.ci/run)")
        pytest.skip(f"Debian's chromium is not installed ({CHROMIUM}); apt-get install chromium")
    pytest.importorskip("playwright")
    return CHROMIUM


@pytest.fixture(scope="module")
def _launched(chromium: Path) -> Iterator[Any]:
    """One headless Chromium for the module's tests: it starts once, not once a test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(chromium),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--no-first-run",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(_launched: Any) -> Iterator[Any]:
    """The module's Chromium; each page a test opens (`browser.new_page`, a context of its
    own: no cookie or storage shared) is closed after it."""
    yield _launched
    for context in _launched.contexts:
        context.close()


@pytest.fixture
def server(chromium: Path, tmp_path: Path) -> Iterator[str]:
    seeded = seed_store(tmp_path)
    with _serving(seeded["db"], seeded["config"], tmp_path) as url:
        yield url


def _settled(page, charts: int = 0, panels: int = 0) -> None:
    """Wait until the script has finished, `charts` Vega charts and `panels` History
    panels (SVG from the server) are drawn."""
    if charts:
        page.locator("[data-testid='stVegaLiteChart'] svg.marks").nth(charts - 1).wait_for(
            timeout=60_000
        )
    if panels:
        page.locator("svg.panel").nth(panels - 1).wait_for(timeout=60_000)
    page.wait_for_function(
        "() => !document.querySelector(\"[data-testid='stStatusWidgetRunningIcon'], "
        "[data-testid='stSkeleton']\")",
        timeout=60_000,
    )
    page.wait_for_timeout(800)  # st.dataframe's grids draw on a canvas after they mount
    assert page.locator("[data-testid='stException']").count() == 0


def _shot(page, name: str, width: int = 1440) -> None:
    """A screenshot of the whole page: Streamlit scrolls inside its own container, so the
    window is made as tall as the content first."""
    height = page.evaluate(
        "() => document.querySelector(\"[data-testid='stMainBlockContainer']\").scrollHeight"
    )
    page.set_viewport_size({"width": width, "height": max(900, int(height) + 160)})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(ARTIFACTS / name))
    page.set_viewport_size({"width": width, "height": 900})


def _y_domain(page, chart: int) -> tuple[float, float]:
    """The y-axis range of a drawn panel, as it describes itself for screen readers:
    "... Y-axis titled '...' for a linear scale with values from 250 to 330"; and its tick
    labels as drawn agree."""
    panel = page.locator("svg.panel").nth(chart)
    label = panel.get_attribute("aria-label")
    ticks = [float(t.replace(",", "")) for t in panel.locator("text.ytick").all_text_contents()]
    found = re.search(r"values from (-?[\d.,]+) to (-?[\d.,]+)", label or "")
    assert found, label
    low, high = (float(x.replace(",", "")) for x in found.groups())
    assert ticks and ticks[0] == low and ticks[-1] == high, (ticks, label)
    return low, high


def test_a_reviewer_finds_the_regression(browser: Any, server: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(server, wait_until="domcontentloaded", timeout=60_000)
    page.get_by_text("A case's name opens its history").wait_for(timeout=60_000)
    _settled(page)
    body = page.inner_text("body")
    # The regression that reached main is flagged, with the commit it came in at.
    assert f"regression · {D8} · allocated +64.00 MiB since 09aaaaaaaa" in body
    assert "not fixed or accepted" in body
    assert "failed · vision" in body
    _shot(page, "dashboard-overview.png")

    # A case's name opens its history, and the address says which.
    page.locator("#overview_table td[data-col='case'] a", has_text=D8).click()
    page.wait_for_url(re.compile(r"page=History"), timeout=30_000)
    page.get_by_text("Where the series moved").wait_for(timeout=60_000)
    _settled(page, panels=4)
    shared = page.url
    assert f"case={quote(D8, safe='')}" in shared.replace("%5b", "%5B"), shared

    # The step is visible on its own view's scale: the y-axis spans the series
    # (256 to 320 MiB, the 350 MiB budget, a pull request at 400 MiB), not 0 to
    # the largest view (the device's ~900 MiB).
    low, high = _y_domain(page, 0)
    assert 150 <= low <= 256 and 400 <= high <= 500, (low, high)
    low, high = _y_domain(page, 2)  # the device view: its own ~800 MiB scale
    assert 600 <= low <= 776 and 920 <= high <= 1100, (low, high)
    _shot(page, "dashboard-history.png")

    # The shared address opens the same history for someone else.
    other = browser.new_page(viewport={"width": 1440, "height": 900})
    other.goto(shared, wait_until="domcontentloaded")
    other.get_by_text("Where the series moved").wait_for(timeout=60_000)
    _settled(other, panels=4)
    assert "320.00 MiB of 350.00 MiB framework allocated" in other.inner_text("body")
    other.close()

    page.goto(f"{server}/?page=regressions", wait_until="domcontentloaded")
    page.get_by_text("not fixed or accepted").wait_for(timeout=60_000)
    _settled(page)
    body = page.inner_text("body")
    assert f"{D8} allocated +64.00 MiB (+25.0%) since 09aaaaaaaa" in body
    _shot(page, "dashboard-regressions.png")

    page.goto(f"{server}/?page=run-detail", wait_until="domcontentloaded")
    page.get_by_text("Exact parameters").wait_for(timeout=60_000)
    _settled(page, charts=1)
    _shot(page, "dashboard-run-detail.png")

    page.goto(f"{server}/?page=Compare&a=08aaaa&b=09aaaa", wait_until="domcontentloaded")
    page.get_by_text("coloured only past").wait_for(timeout=60_000)
    _settled(page)
    _shot(page, "dashboard-compare.png")

    page.goto(f"{server}/?page=Plan", wait_until="domcontentloaded")
    page.get_by_text("Model: peak(").first.wait_for(timeout=60_000)
    _settled(page, charts=1)
    _shot(page, "dashboard-plan.png")
    assert (ARTIFACTS / "dashboard-history.png").stat().st_size > 10_000


LINKY = "see https://e.example/x and www.e.example or ops@e.example"
"""Recorded text that a Markdown reader would turn into live links: a bare address, a
`www.` host and an e-mail address."""


@pytest.fixture
def hostile_server(chromium: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The seeded history, and one more run whose recorded text is full of addresses."""
    from factories import GPU_ENV, make_measurement, make_run
    from test_dashboard import commit

    from memtrack.store.database import Store

    seeded = seed_store(tmp_path)
    run = make_run(
        [
            make_measurement("vision " + LINKY, {"res": 512}, status="error", message=LINKY),
            make_measurement("decoder", {"batch": 8}, peak=330 * 2**20),
        ],
        commit=commit(15),
        branch="main",
        subject=LINKY,
        started_at="2026-01-16T12:00:00+00:00",
        env=GPU_ENV,
    )
    with Store.open(seeded["db"]) as store:
        store.write_run(run)
    with _serving(seeded["db"], seeded["config"], tmp_path) as url:
        yield url, run.run_id


def test_recorded_addresses_never_become_live_links(browser: Any, hostile_server) -> None:
    """Escaping Markdown does not stop a reader's auto-linking: a bare https://, www. or
    e-mail address in a workload name, a message or a subject would be a link to click on
    every page that shows it. It shows as text, and the only links are the dashboard's own
    (a case's name opens its History, whatever the name holds)."""
    server, run_id = hostile_server
    case = quote("vision " + LINKY + "[res=512]", safe="")
    pages = {
        "Overview": "?page=Overview",
        "History": f"?page=History&case={case}",
        "Regressions": "?page=Regressions",
        "Run detail": f"?page=run-detail&run={run_id}",
        "Compare": f"?page=Compare&a=14aaaa&b={run_id[:8]}",
    }
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    for name, query in pages.items():
        page.goto(f"{server}/{query}", wait_until="domcontentloaded", timeout=60_000)
        page.get_by_role("heading", name=name).first.wait_for(timeout=60_000)
        _settled(page)
        for expander in page.locator("[data-testid='stExpander'] summary").all():
            expander.click()
        links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
        body = page.inner_text("body")
        # Every link opens a page of the dashboard itself (or a heading's anchor).
        assert all(h.startswith(("?page=", "#")) for h in links), (name, links)
        assert "e.example" in body.replace("\u2060", ""), name  # shown, as text


def test_run_detail_of_hostile_notes_fetches_and_links_nothing_remote(
    browser: Any, tmp_path: Path
) -> None:
    """A run whose notes, device view's note, params, subject, branch, messages and
    reasons hold a Markdown image, a link, an autolink and a bare address: its Run detail,
    drawn by Chromium, asks nothing of any host but the dashboard's (a remote image would
    tell its recorder who reads the run, and from where), and its only links are the
    dashboard's own pages or the configured forge (GitHub's here). The page may try: any
    request elsewhere is refused here, never sent, and counted."""
    from test_dashboard import write_hostile_runs

    seeded = seed_store(tmp_path)
    runs = write_hostile_runs(seeded["db"])
    elsewhere: list[str] = []

    def local(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("data", "blob", "about") or parts.hostname == "127.0.0.1"

    def route(r) -> None:
        if local(r.request.url):
            r.continue_()
        else:
            elsewhere.append(r.request.url)
            r.abort()

    with _serving(seeded["db"], seeded["config"], tmp_path) as server:
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.route("**/*", route)
        page.on("request", lambda r: None if local(r.url) else elsewhere.append(r.url))
        page.on("websocket", lambda ws: None if local(ws.url) else elsewhere.append(ws.url))
        for run_id, which in zip(runs, ("main", "branch"), strict=True):
            page.goto(
                f"{server}/?page=run-detail&run={run_id}",
                wait_until="domcontentloaded",
                timeout=60_000,
            )
            page.get_by_text("Exact parameters").wait_for(timeout=60_000)
            _settled(page)
            for expander in page.locator("[data-testid='stExpander'] summary").all():
                expander.click()
            page.wait_for_timeout(800)  # an image in an opened expander starts to load
            links = page.eval_on_selector_all(
                "a[href]", "els => els.map(e => e.getAttribute('href'))"
            )
            sources = page.eval_on_selector_all(
                "[src], [srcset], [poster]",
                "els => els.map(e => e.getAttribute('src') || e.getAttribute('srcset')"
                " || e.getAttribute('poster'))",
            )
            body = page.inner_text("body").replace("\u2060", "")
            assert f"evil.example ({which})" in body, which  # the note, shown as text
            assert all(
                h.startswith(("?page=", "#", "https://github.com/")) or local(h) for h in links
            ), (which, links)
            assert all(not urlsplit(s).netloc or local(s) for s in sources), (which, sources)
            assert elsewhere == [], (which, elsewhere)
    assert elsewhere == []


def _stop(proc: subprocess.Popen) -> None:
    """End a served dashboard: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def _serving(db: Path, config: Path, where: Path) -> Iterator[str]:
    """`streamlit run` of the app over a database, as the `server` fixture starts it."""
    port = free_port()
    env = {
        **os.environ,
        "STREAMLIT_SERVER_HEADLESS": "true",
        "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
        "STREAMLIT_SERVER_ADDRESS": "127.0.0.1",
        "STREAMLIT_SERVER_PORT": str(port),
        "STREAMLIT_CLIENT_TOOLBAR_MODE": "minimal",
    }
    log = where / "streamlit.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--"]
            + ["--db", str(db), "--config", str(config)],
            cwd=where,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        _stop(proc)


def test_a_reviewer_reads_a_revert_and_an_accepted_step(browser: Any, tmp_path: Path) -> None:
    """The story of tests/factories.story_history, served twice: after a merge and its
    revert, then after an accepted step. Each state's Overview, History and Regressions are
    saved as screenshots (artifacts/story-*.png); what a reader sees on them is checked
    here, in the browser: the gate's regression and its fix, the accepted step with its
    reason, a step drawn as one, a branch named in the time chart's tooltip, and a page
    asked for in lower case drawn with its name said right in the address."""
    from factories import (
        STORY_ACCEPT,
        STORY_MERGE,
        STORY_REASON,
        STORY_REVERT,
        story_history,
    )

    ARTIFACTS.mkdir(exist_ok=True)
    states = {
        "reverted": (STORY_REVERT + 4, "decoder[batch=1]"),
        "accepted": (STORY_ACCEPT + 3, "encoder[batch=8]"),
    }
    for state, (until, case) in states.items():
        (tmp_path / state).mkdir()
        story = story_history(tmp_path / state, until=until)
        merge = story["shas"][STORY_MERGE][:10]
        revert = story["shas"][STORY_REVERT][:10]
        with _serving(story["db"], story["config"], tmp_path / state) as server:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(server, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_text("A case's name opens its history").wait_for(timeout=60_000)
            _settled(page)
            body = page.inner_text("body")
            assert f"at {merge} (the gate's regression), fixed at {revert}" in body
            if state == "accepted":
                assert f"accepted: {STORY_REASON}" in body
                assert f"passes, 3 accepted: {STORY_REASON}" in body
            _shot(page, f"story-{state}-overview.png")

            page.goto(
                f"{server}/?page=History&case={quote(case, safe='')}",
                wait_until="domcontentloaded",
            )
            page.get_by_text("Where the series moved").wait_for(timeout=60_000)
            _settled(page, panels=2)
            line = page.locator("svg.panel polyline.line.base").first
            xy = [
                tuple(float(v) for v in pair.split(","))
                for pair in (line.get_attribute("points") or "").split()
            ]
            assert all(a[0] == b[0] or a[1] == b[1] for a, b in itertools.pairwise(xy))
            ticks = page.locator("svg.panel").first.locator("text.xtick")
            assert ticks.count() >= 3
            if state == "accepted":
                tip = page.locator("svg.panel[data-metric='time'] path.point.other")
                assert "feature/encoder-head" in (tip.first.locator("title").text_content() or "")
            _shot(page, f"story-{state}-history.png")

            page.goto(f"{server}/?page=regressions", wait_until="domcontentloaded")
            page.get_by_role("heading", name="Regressions").wait_for(timeout=60_000)
            _settled(page)
            assert "page=Regressions" in page.url, page.url
            body = page.inner_text("body")
            # the table is a grid drawn on a canvas: its rows are read by AppTest
            # (test_dashboard_story); here, that the page is drawn and counts them
            assert "No step" not in body and "change(s) on main" in body
            _shot(page, f"story-{state}-regressions.png")
            page.close()
    for state in states:
        for name in ("overview", "history", "regressions"):
            assert (ARTIFACTS / f"story-{state}-{name}.png").stat().st_size > 10_000


def test_the_dashboard_serves_overview_and_history_from_postgres(
    browser: Any, tmp_path: Path, pg_url: str
) -> None:
    """`memtrack dashboard --db postgresql://...` over the story recorded into a server's
    database: the URL is handed to the app by the environment (no password on a command
    line), the sidebar names it with the password hidden, and Overview and History read as
    they do from the SQLite file."""
    from factories import STORY_MERGE, STORY_REVERT, story_history
    from pgcluster import PASSWORD

    from memtrack.store.url import parse_database

    story = story_history(tmp_path, until=STORY_REVERT + 4, also=(parse_database(pg_url, "x"),))
    port = free_port()
    log = tmp_path / "dashboard.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMTRACK_")}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memtrack.cli", "dashboard", "--db", pg_url]
            + ["--port", str(port), "--config", str(story["config"])],
            cwd=tmp_path,
            env={**env, "STREAMLIT_SERVER_HEADLESS": "true"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, proc, log)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert PASSWORD.encode() not in f.read()  # the server's command line
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(server, wait_until="domcontentloaded", timeout=60_000)
        page.get_by_text("A case's name opens its history").wait_for(timeout=60_000)
        _settled(page)
        body = page.inner_text("body")
        merge, revert = story["shas"][STORY_MERGE][:10], story["shas"][STORY_REVERT][:10]
        assert f"at {merge} (the gate's regression), fixed at {revert}" in body
        page.goto(
            f"{server}/?page=History&case={quote('decoder[batch=1]', safe='')}",
            wait_until="domcontentloaded",
        )
        page.get_by_text("Where the series moved").wait_for(timeout=60_000)
        _settled(page, panels=2)
        sidebar = page.locator("[data-testid='stSidebar']").inner_text()
        body = (page.inner_text("body") + sidebar).replace("\u2060", "")  # esc's joiners
        assert "postgresql://memtrack:***@/" in body
        assert PASSWORD not in body and quote(PASSWORD, safe="") not in body
        page.close()
    finally:
        _stop(proc)
    assert PASSWORD not in log.read_text()


def _overflow(page, selector: str) -> tuple[int, int]:
    """(scroll width, client width) of an element: wider content scrolls sideways."""
    scroll, client = page.eval_on_selector(selector, "e => [e.scrollWidth, e.clientWidth]")
    return scroll, client


def test_a_newcomers_first_look_fits_1280_px_and_tells_cases_apart(
    browser: Any, tmp_path: Path
) -> None:
    """The shipped suite's history (150 real reruns, ten pull requests; tests/factories
    .realistic_history) in a 1,280 px browser, as a newcomer first opens it: the Overview
    scrolls sideways nowhere (neither the page nor its tables) and shows each case's key
    columns; Run detail's breakdown names decoder_generate's cases by their sessions, each
    label whole; Plan answers no further than its two measured values carry it; a Plan
    address naming a workload with no sweep says so. Screenshots: artifacts/first-look-*.png."""
    from factories import realistic_history

    ARTIFACTS.mkdir(exist_ok=True)
    db = tmp_path / "memtrack.db"
    realistic_history(db)
    # the repository's own config (the shipped CPU budgets), less those of a case newer than
    # the recorded reruns
    head, *blocks = (ROOT / "pyproject.toml").read_text().split("[[tool.memtrack.budgets]]")
    config = tmp_path / "pyproject.toml"
    config.write_text(
        "[[tool.memtrack.budgets]]".join(
            [head, *(b for b in blocks if 'workload = "gpt_generate"' not in b)]
        )
    )
    width = 1280
    with _serving(db, config, tmp_path) as server:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(server, wait_until="domcontentloaded", timeout=60_000)
        page.get_by_text("A case's name opens its history").wait_for(timeout=60_000)
        _settled(page)
        scroll, client = _overflow(page, "html")
        assert scroll <= client, (scroll, client)
        for table in ("#overview_table", "#ov_prs"):
            scroll, client = _overflow(page, table)
            assert scroll <= client, (table, scroll, client)
        # every key column of every case drawn within the window
        right = page.eval_on_selector_all(
            "#overview_table th", "els => els.map(e => e.getBoundingClientRect().right)"
        )
        assert len(right) == 10 and max(right) <= width, right
        heights = page.eval_on_selector_all(
            "#overview_table tbody tr", "els => els.map(e => e.getBoundingClientRect().height)"
        )
        assert len(heights) == 8 and max(heights) < 60, heights  # one line a case
        case = page.locator("#overview_table td[data-col='case']", has_text="sessions=4")
        assert case.first.get_attribute("title", timeout=10_000).startswith(
            "decoder_generate[d_model=128"
        )
        _shot(page, "first-look-overview.png", width)

        page.goto(f"{server}/?page=run-detail", wait_until="domcontentloaded")
        page.get_by_text("Exact parameters").wait_for(timeout=60_000)
        _settled(page, charts=1)
        labels = page.eval_on_selector_all(
            "[data-testid='stVegaLiteChart'] .role-axis-label text",
            "els => els.map(e => e.textContent)",
        )
        one = [t for t in labels if t.startswith("decoder_generate") and "sessions=1" in t]
        four = [t for t in labels if t.startswith("decoder_generate") and "sessions=4" in t]
        assert one == ["decoder_generate[sessions=1]"], labels
        assert four == ["decoder_generate[sessions=4]"], labels
        assert not any(t.endswith("…") for t in labels), labels
        assert "runtime: host RSS beyond tensors" in page.inner_text("body")
        _shot(page, "first-look-run-detail.png", width)

        page.goto(f"{server}/?page=Plan", wait_until="domcontentloaded")
        page.get_by_text("Model: peak(").first.wait_for(timeout=60_000)
        _settled(page, charts=1)
        body = page.inner_text("body")
        assert "at commit 0150cccccc on main" in body  # the base branch, not a pull request
        assert "the fit cannot carry this: measured up to sessions=4" in body
        assert "54,141" not in body
        _shot(page, "first-look-plan.png", width)

        page.goto(
            f"{server}/?page=plan&plan_workload=decoder_serve&plan_param=concurrency",
            wait_until="domcontentloaded",
        )
        page.get_by_text("has not recorded two or more values").wait_for(timeout=60_000)
        _settled(page)
        assert page.locator("[data-testid='stVegaLiteChart']").count() == 0
    for name in ("overview", "run-detail", "plan"):
        assert (ARTIFACTS / f"first-look-{name}.png").stat().st_size > 10_000


def test_the_docs_screenshot_recipe_works_as_written(chromium: Path, tmp_path: Path) -> None:
    """docs/dashboard.md's screenshot commands, run by bash as written (but for the install
    line, done, and a free port for 8501), over a history of the shipped suite in
    data/memtrack.db: the PNG shows the History page drawn, not a blank page."""
    import signal

    from factories import realistic_history
    from PIL import Image

    page = (ROOT / "docs" / "dashboard.md").read_text()
    (block,) = [
        b for b in re.findall(r"^```bash\n(.*?)^```", page, re.S | re.M) if "dashboard_shot" in b
    ]
    port = str(free_port())
    script = block.replace("8501", port).replace("scripts/", f"{ROOT}/scripts/")
    script = re.sub(r"^pip install .*$", ":", script, flags=re.M)
    (tmp_path / "data").mkdir()
    realistic_history(tmp_path / "data" / "memtrack.db", check=False)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env = {k: v for k, v in env.items() if not k.startswith("MEMTRACK_")}
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the recipe left running
    shot = tmp_path / "history.png"
    assert proc.returncode == 0 and shot.is_file(), out
    image = Image.open(shot).convert("L")
    assert image.size[0] == 1440 and image.size[1] > 900, image.size
    dark, light = image.getextrema()
    assert dark < 80 and light > 200, (light, dark)  # text and panels drawn, not blank
    assert "Traceback" not in out
