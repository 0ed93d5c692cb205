"""A screenshot of one page of a served dashboard, as a visitor sees it once it has settled.

    memtrack dashboard --port 8501 &
    python scripts/dashboard_shot.py 'http://127.0.0.1:8501/?page=History' history.png

Chromium (Debian's /usr/bin/chromium where installed, else Playwright's own, `playwright
install chromium`) loads the page, headless, through Playwright (a test tool: `pip install -e
".[test]"`). A screenshot straight from `chromium --headless --screenshot` is blank:
Streamlit draws the page from its websocket after the document has loaded. So this waits
until the script has finished and every History panel is drawn, then makes the window as
tall as the page's content (Streamlit scrolls inside its own container, which a full-page
screenshot would cut) and saves it as PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
SETTLED = (
    "() => document.querySelector(\"[data-testid='stMainBlockContainer'] "
    "[data-testid='stHeading']\") && "
    "!document.querySelector(\"[data-testid='stStatusWidgetRunningIcon'], "
    "[data-testid='stSkeleton']\")"
)
"""The page's script has run (its title is drawn: every page of the dashboard has one) and
finished. Its container alone can be there before the script has drawn anything: on a busy
machine a shot came out 900 px tall, the window's first height, where a History page is
taller."""


def served(url: str, timeout_s: float) -> None:
    """Wait until the server at `url` answers (a dashboard started a moment ago)."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise SystemExit(f"dashboard_shot: nothing answers at {url}") from None
            time.sleep(0.5)


def shoot(url: str, out: Path, width: int = 1440, timeout_s: float = 60.0) -> Path:
    """Save the page at `url` as a PNG at `out`, `width` pixels wide, once the server
    answers; the path."""
    from playwright.sync_api import sync_playwright

    served(url, timeout_s)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM) if CHROMIUM.exists() else None,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
            page.wait_for_function(SETTLED, timeout=timeout_s * 1000)
            page.wait_for_timeout(1500)  # a grid draws on its canvas after it mounts
            page.wait_for_function(SETTLED, timeout=timeout_s * 1000)
            height = page.evaluate(
                "() => document.querySelector(\"[data-testid='stMainBlockContainer']\")"
                ".scrollHeight"
            )
            page.set_viewport_size({"width": width, "height": max(900, int(height) + 160)})
            page.wait_for_timeout(1000)
            page.screenshot(path=str(out))
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the page, e.g. http://127.0.0.1:8501/?page=History")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1440, help="window width in pixels")
    args = parser.parse_args(argv)
    if not args.out.parent.is_dir():
        print(f"dashboard_shot: no such folder {args.out.parent}", file=sys.stderr)
        return 2
    print(shoot(args.url, args.out, args.width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
