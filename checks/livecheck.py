"""Does the page stream, play and time as it should? Serves the page (`python app.py`, its own process, a fresh
cache folder unless --cache is given, so the first Generate tunes the machine profile as a new install does),
then drives it in Debian's chromium with the page's defaults and prints, per prompt: the step numbers each tree
panel's title showed while the run decoded (sampled once a second), the steps Play showed within 5 s, and the
metrics table's speedup, τ and "same text as plain" column. Exits 1 when the bar fails.

    .venv/bin/python -m checks.livecheck                      # four prompts of different kinds, 96 tokens
    .venv/bin/python -m checks.livecheck --prompts FILE.jsonl --limit 3 --max-new-tokens 96

Bar: each panel shows >= 3 different steps while decoding; Play shows >= 3 within 5 s; EAGLE-2 at least 1.2x plain
decoding on average and 1.0x on every prompt; EAGLE-2's τ at least EAGLE-1's on average; every text equals plain
decoding's.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle2.tools.prompts import read_prompts

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]
PROMPTS = ["Explain to a ten-year-old why ships made of steel float.",
           "Write a short story about a lost umbrella that finds its way home.",
           "What are three good habits for writing clean Python code? Give a short example for each.",
           "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Explain each step."]


def serve(port: int, cache: str) -> subprocess.Popen:
    """The page as `make run` starts it, on 127.0.0.1:`port`, with `cache` as its cache folder."""
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", "EAGLE2_CACHE": cache}
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the page did not start within 180 s")


def _step(page, method: str) -> int | None:
    title = page.locator(f"#tree-{method} .gtitle").first.text_content() or ""
    found = re.search(r"step (\d+)", title)
    return int(found.group(1)) if found else None


def _status(page) -> str:
    return page.locator("#status").inner_text()


def _metrics(page) -> dict[str, dict]:
    """The metrics table's rows: method label -> tau, speedup, same text."""
    rows = {}
    for line in page.locator("#metrics table tr").all_inner_texts()[1:]:
        cells = [c.strip() for c in line.split("\t")]
        if len(cells) >= 8:
            rows[cells[0]] = {"tau": float(cells[4]), "tok_s": float(cells[5]),
                              "speedup": float(cells[6].rstrip("×")) if cells[6] != "—" else None, "same": cells[7]}
    return rows


def one_prompt(page, prompt: str, max_new: int, timeout_s: float) -> dict:
    """Generate with the page's defaults; sample the titles once a second; then Play for 5 s."""
    page.fill("#prompt textarea", prompt)
    box = page.locator("#max-new input[type=number]")
    box.fill(str(max_new))
    box.press("Tab")
    page.click("#generate")
    seen: dict[str, set[int]] = {"eagle2": set(), "eagle1": set()}
    start, deadline = time.time(), time.time() + timeout_s
    while time.time() < deadline:
        status = _status(page)
        if status.startswith(("Done", "Stopped", "⚠")):
            break
        if status.startswith(("Live pass", "Timed pass")):
            for m in seen:
                k = _step(page, m)
                if k is not None:
                    seen[m].add(k)
        time.sleep(1.0)
    status, took = _status(page), time.time() - start
    page.wait_for_function("() => (document.querySelector('#metrics')?.innerText || '').includes('speedup')")
    metrics = _metrics(page)
    page.click("#play")
    played: dict[str, set[int]] = {"eagle2": set(), "eagle1": set()}
    end = time.time() + 5
    while time.time() < end:
        for m in played:
            k = _step(page, m)
            if k is not None:
                played[m].add(k)
        time.sleep(0.25)
    page.click("#play")  # pause
    return {"status": status, "seconds": round(took, 1), "live": {m: sorted(v) for m, v in seen.items()},
            "played": {m: sorted(v) for m, v in played.items()}, "metrics": metrics,
            "budget": page.locator("#budget").inner_text()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.livecheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=None, help="jsonl of prompts (default: four built-in ones)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--cache", default=None, help="cache folder for the page (default: a new empty one)")
    ap.add_argument("--port", type=int, default=7871)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    prompts = read_prompts(args.prompts, args.limit) if args.prompts else PROMPTS[:args.limit]
    cache = args.cache or tempfile.mkdtemp(prefix="eagle2-livecheck-")
    proc = serve(args.port, cache)
    results = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(f"http://127.0.0.1:{args.port}/")
            page.wait_for_selector("#prompt textarea")
            for i, prompt in enumerate(prompts):
                r = one_prompt(page, prompt, args.max_new_tokens, timeout_s=600)
                results.append(r)
                e2 = next((v for k, v in r["metrics"].items() if k.startswith("EAGLE-2")), {})
                e1 = next((v for k, v in r["metrics"].items() if k.startswith("EAGLE-1")), {})
                plain = next((v for k, v in r["metrics"].items() if k.startswith("plain")), {})
                print(f"[{i + 1}] {prompt[:50]!r}: {r['seconds']} s{' (first Generate)' if i == 0 else ''}; "
                      f"live steps eagle2 {len(r['live']['eagle2'])}, eagle1 {len(r['live']['eagle1'])}; "
                      f"Play steps in 5 s {len(r['played']['eagle2'])}/{len(r['played']['eagle1'])}; "
                      f"EAGLE-2 {e2.get('speedup')}x tau {e2.get('tau')} same {e2.get('same')}; "
                      f"EAGLE-1 {e1.get('speedup')}x tau {e1.get('tau')} same {e1.get('same')}; "
                      f"tokens/s plain {plain.get('tok_s')}, EAGLE-2 {e2.get('tok_s')}", flush=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    print("budget line:", results[0]["budget"] if results else "—")
    e2 = [next(v for k, v in r["metrics"].items() if k.startswith("EAGLE-2")) for r in results]
    e1 = [next(v for k, v in r["metrics"].items() if k.startswith("EAGLE-1")) for r in results]
    speed = [x["speedup"] for x in e2]
    checks = {
        "live: each panel >= 3 steps while decoding": all(len(r["live"][m]) >= 3 for r in results for m in r["live"]),
        "Play: >= 3 steps within 5 s": all(len(r["played"][m]) >= 3 for r in results for m in r["played"]),
        f"EAGLE-2 speedup mean {statistics.mean(speed):.2f}x >= 1.2": statistics.mean(speed) >= 1.2,
        f"EAGLE-2 speedup min {min(speed):.2f}x >= 1.0": min(speed) >= 1.0,
        f"tau EAGLE-2 {statistics.mean(x['tau'] for x in e2):.2f} >= EAGLE-1 "
        f"{statistics.mean(x['tau'] for x in e1):.2f}": statistics.mean(x["tau"] for x in e2)
        >= statistics.mean(x["tau"] for x in e1),
        "every text equals plain decoding": all(x["same"].startswith("yes") for x in e2 + e1),
    }
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
