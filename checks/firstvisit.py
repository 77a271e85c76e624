"""The first visitor on a fresh machine: how long does their Generate take? Starts `app.py` with a cache of its
own (a new temporary folder: no converted model, no row kernel, no machine profile), opens the page in Chromium as
soon as it answers, presses Generate on the first example prompt at the page's defaults `--wait` seconds after
the start, and times it until the status line says Done.

    .venv/bin/python -m checks.firstvisit              # pressed 90 s after the start
    .venv/bin/python -m checks.firstvisit --wait 30    # while the server is still preparing

It prints what the status line said when the page opened and when Generate was pressed, the server's own log
of its preparation, and the load average (on a shared machine every step is slower).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from app_parts.settings import load_examples

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]
# the status line's text (its markdown: the progress tracker beside it holds a timer's text, invisible or not)
STATUS = "document.querySelector('#status [data-testid=markdown]')?.innerText || ''"


def _load() -> str:
    """The 1, 5 and 15 minute load averages (Linux), or '?'."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def first_visit(wait_s: float, port: int, cache: Path) -> float:
    """Seconds from pressing Generate to Done, pressed `wait_s` after `app.py` starts with `cache` as its cache."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    env = {**os.environ, "EAGLE2_CACHE": str(cache / "eagle2-viz"), "TORCH_EXTENSIONS_DIR": str(cache / "ext"),
           "XDG_CACHE_HOME": str(cache), "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_SERVER_PORT": str(port)}
    url = f"http://127.0.0.1:{port}/"
    log = (cache / "server.log").open("w")
    t0 = time.monotonic()
    server = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        while not _answers(url):
            if server.poll() is not None:
                raise RuntimeError(f"app.py exited with {server.returncode}: see {cache / 'server.log'}")
            time.sleep(0.5)
        print(f"page answers {time.monotonic() - t0:.1f} s after the start", flush=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(url)
            try:  # the page's opening "Ready." turns into the preparation's step once the page has loaded
                page.wait_for_function(f"() => ({STATUS}).startsWith('Preparing at server start')", timeout=30_000)
            except PlaywrightTimeout:
                pass  # already prepared, or the server said something else: printed below
            print(f"status when the page opened: {page.evaluate(f'() => {STATUS}')!r}", flush=True)
            page.fill("#prompt textarea", load_examples()[0]["prompt"])
            time.sleep(max(wait_s - (time.monotonic() - t0), 0))  # the visitor arrives when they arrive
            print(f"status when Generate was pressed ({time.monotonic() - t0:.0f} s after the start): "
                  f"{page.evaluate(f'() => {STATUS}')!r}", flush=True)
            pressed = time.monotonic()
            page.click("#generate")
            page.wait_for_function(f"() => /^(Done\\.|⚠|Stopped)/.test({STATUS})", timeout=900_000, polling=200)
            took = time.monotonic() - pressed
            print(f"status at the end: {page.evaluate(f'() => {STATUS}')[:120]!r}", flush=True)
            browser.close()
        return took
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wait", type=float, default=90.0, help="seconds after the start to press Generate")
    ap.add_argument("--port", type=int, default=7899)
    args = ap.parse_args()
    if not os.path.exists(CHROMIUM):
        sys.exit(f"Debian's chromium is needed at {CHROMIUM} (apt-get install -y chromium)")
    print(f"load average at the start: {_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="eagle2-firstvisit-") as tmp:
        took = first_visit(args.wait, args.port, Path(tmp))
        server_log = (Path(tmp) / "server.log").read_text()
    print("\n".join(line for line in server_log.splitlines() if line.startswith("eagle2:")))
    print(f"load average at the end: {_load()}")
    print(f"first Generate: {took:.1f} s, pressed {args.wait:g} s after the start")


if __name__ == "__main__":
    main()
