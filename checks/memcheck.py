"""Does the app's memory stay flat over consecutive runs? Drives the page's own Generate path (engine, session,
views) N times on one prompt and reports the process's resident memory after each run.

    .venv/bin/python -m checks.memcheck --runs 10 --max-new-tokens 1024

Like a visitor's page, only the newest run's Session is kept; each run's step records are measured as the
size of the trace file it would export.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from collections.abc import Callable

from app_parts.presets import load_presets
from app_parts.runner import generate
from app_parts.session import Session
from app_parts.settings import RunRequest
from eagle2.decode.records import Trace

PROMPT = "Tell me a long story about a dragon who learns to bake bread, with many chapters."


def rss_mb() -> float:
    """Resident memory of this process in MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def trace_bytes(session: Session) -> int:
    """Size of the session's step records as exported JSON (metadata left out)."""
    return len(Trace(meta={}, runs=session.runs).to_json().encode())


def measure(bundle, runs: int, max_new_tokens: int, prompt: str = PROMPT, with_vanilla: bool = False,
            report: Callable[[dict], None] | None = None) -> list[dict]:
    """Run Generate `runs` times; one row per run: resident MiB, tokens, steps and trace size."""
    preset = next(iter(load_presets()))
    req = RunRequest(prompt=prompt, preset=preset, max_new_tokens=max_new_tokens, with_vanilla=with_vanilla)
    rows, session = [], None
    for i in range(runs):
        t0 = time.perf_counter()
        last = None
        for u in generate(req, lambda _p, _say=None: bundle):
            last = u
        if last is None or last.session is None:
            raise RuntimeError(f"run {i + 1} produced no session: {last.status if last else 'no update'}")
        session = last.session  # the page keeps only the newest run
        gc.collect()
        row = {"run": i + 1, "rss_mb": round(rss_mb(), 1), "seconds": round(time.perf_counter() - t0, 1),
               "tokens": {m: sum(len(r.new_tokens) for r in session.records(m)) for m in session.runs},
               "steps": {m: len(session.records(m)) for m in session.runs},
               "trace_kb": round(trace_bytes(session) / 1024, 1)}
        rows.append(row)
        if report:
            report(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Command line: print one JSON line per run, then the growth after the first run."""
    from eagle2.loading import load

    p = argparse.ArgumentParser(prog="python -m checks.memcheck", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--plain", action="store_true", help="also run plain decoding, as the page's checkbox does")
    a = p.parse_args(argv)
    bundle = load("embedded", None, "auto")
    print(json.dumps({"loaded_rss_mb": round(rss_mb(), 1)}), flush=True)
    rows = measure(bundle, a.runs, a.max_new_tokens, a.prompt, a.plain,
                   report=lambda r: print(json.dumps(r), flush=True))
    rss = [r["rss_mb"] for r in rows]
    print(json.dumps({"after_first_mb": rss[0], "after_last_mb": rss[-1], "growth_after_first_mb":
                      round(rss[-1] - rss[0], 1), "max_mb": max(rss)}))


if __name__ == "__main__":
    main()
