"""Render an HTML page (a Plotly figure) to PNG with Debian's headless chromium through Playwright."""
from __future__ import annotations

import os
import tempfile

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]


def html_to_png(html: str, png_path: str, width: int = 1100, height: int = 520) -> None:
    """Screenshot `html` at the given size; RuntimeError when no browser is available."""
    if not os.path.exists(CHROMIUM):
        raise RuntimeError(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as f:
        f.write(html)
        page_path = f.name
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(f"file://{page_path}")
            page.wait_for_timeout(500)
            page.screenshot(path=png_path)
            browser.close()
    finally:
        os.unlink(page_path)
