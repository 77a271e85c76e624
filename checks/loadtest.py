"""Many visitors at once: the page served on 127.0.0.1, driven over its HTTP API with gradio_client as new users'
scripts would drive it, checked for what each visitor got, how long they waited, how quick scrubbing stayed and
whether the server's memory came back once their sessions were freed.

    .venv/bin/python -m checks.loadtest                 # starts the page in a process of its own, 8 visitors
    .venv/bin/python -m checks.loadtest --url http://127.0.0.1:7860/ --server-pid PID

The server starts as `python app.py` does, without a model; one visitor first runs a short Generate, which
loads and warms the model through the page's own path, and leaves. Then one
visitor keeps a finished run and scrubs it over and over while the others submit Generate at once, with mixed
prompts and settings, one of them at the largest token limit. Greedy decoding throughout, so each visitor's
two tree texts must equal plain greedy decoding of their own prompt (computed here first), or be a prefix of it
when the run's time limit cut it. Then the visitors leave (the page's unload handler frees their sessions), the
scrubber stays idle until its session expires, and the server's resident memory is read again.

Bounded: 8 to 16 visitors, one Generate each, and --timeout seconds in all. The page runs as `app.py` runs it,
in a process of its own with a short session lifetime (--ttl), which reports each second how many sessions hold
a run; its resident memory is read from /proc. Against --url the memory is read from --server-pid when given,
and that server must have been started with EAGLE2_SESSION_TTL_S no longer than --ttl.
The exit status is 1 when the bar fails: every visitor served without error, each text its own greedy
decoding, scrub latency under 1 s at the 95th percentile while decoding, memory back within 10% of before.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import runpy
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ("127.0.0.1", "localhost")
PROMPTS = [
    "Write a short poem about a lighthouse keeper who talks to the sea.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h? Explain step by step.",
    "Translate into French: \"The weather is nice today, so we are going to the beach.\"",
    "List every city mentioned in this text, one per line: \"After a week in Lisbon we took the train to Madrid, "
    "then flew to Rome, and finally spent two nights in Vienna.\"",
    "Count from 1 to 20, separated by commas.",
    "Explain in three sentences why the sky is blue.",
    "Give me three tips for keeping a houseplant alive.",
    "What are the main differences between a list and a tuple in Python?",
    "Describe a sunrise over the mountains in four sentences.",
    "Name five animals that live in the ocean and one fact about each.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "Why do we have seasons on Earth?",
    "Write a haiku about autumn leaves.",
    "What is the capital of Australia, and why was it chosen?",
    "Suggest a name for a bakery and explain it.",
]
LONG_PROMPT = "Tell me a long story about a dragon who learns to bake bread, with many chapters."
# (tree sizing, prompt-lookup branch, plain decoding, max new tokens): mixed, all greedy
SETTINGS = [("tuned", False, True, 32), ("paper", False, True, 24), ("custom", True, False, 32),
            ("tuned", True, True, 40), ("custom", False, True, 16), ("paper", False, False, 32),
            ("tuned", False, False, 48), ("custom", True, True, 24)]
SCRUB_P95_S = 1.0
MEMORY_SLACK = 0.10
HEARTBEAT_S = 15  # how often Gradio writes to a page's heartbeat stream: a closed page is noticed within this


def shown_text(html_text: str) -> str:
    """The output text as the page shows it: the token spans after the legend, tags stripped."""
    body = html_text.split('class="tok-text"', 1)[-1]
    spans = re.findall(r'<span class="tok tok-\w+" data-step="\d+"[^>]*>(.*?)</span>', body, flags=re.S)
    return html.unescape("".join(spans).replace("<br>", "\n"))


def rss_of(pid: int | None) -> float | None:
    """Resident MiB of process `pid` from /proc; None when it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return None


def page() -> SimpleNamespace:
    """app.py's functions (build_demo, calm_queue, launch_options), run from its file as `python app.py` runs
    it but without its `__main__` block, so the page served here is the page as app.py builds it and no
    module imports `app`."""
    return SimpleNamespace(**runpy.run_path(str(ROOT / "app.py"), run_name="page"))


def serve(port: int) -> None:
    """The page as app.py serves it (the model loads on the first Generate), on 127.0.0.1:`port`, printing one
    JSON line a second: the sessions that hold a run and what Gradio keeps per session. Runs until killed."""
    from app_parts.session import Session

    app = page()
    demo = app.calm_queue(app.build_demo().queue(default_concurrency_limit=1))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                **app.launch_options())
    while True:
        sessions = list(demo.state_holder.session_data.values())
        held = [v for s in sessions for v in list(s.state_data.values())]
        kept = [len(json.dumps(s.config_values, default=str)) for s in sessions]
        print(json.dumps({"sessions": len(sessions),
                          "with_runs": sum(isinstance(v, Session) and any(v.runs.values()) for v in held),
                          "gradio_kept_kb": round(sum(kept) / len(kept) / 1024, 1) if kept else 0.0}), flush=True)
        time.sleep(1)


class Server:
    """The page in a process of its own (`serve`), and what it reports: the latest line and the peaks."""

    def __init__(self, ttl: float, deadline: float):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "EAGLE2_SESSION_TTL_S": str(ttl), "GRADIO_ANALYTICS_ENABLED": "False"}
        self.proc = subprocess.Popen([sys.executable, "-m", "checks.loadtest", "--serve", str(port)], env=env,
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.url, self.pid, self.latest, self.peak_runs = f"http://127.0.0.1:{port}/", self.proc.pid, None, 0
        threading.Thread(target=self._read, daemon=True).start()
        while self.latest is None:
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("the page did not start")
            time.sleep(0.5)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.latest = json.loads(line)
                self.peak_runs = max(self.peak_runs, self.latest["with_runs"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Sampler(threading.Thread):
    """Reads the server's resident memory every half second and keeps the peak."""

    def __init__(self, pid: int | None):
        super().__init__(daemon=True)
        self.pid, self.peak, self.halt = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            self.peak = max(self.peak, rss_of(self.pid) or 0.0)


def submit(client, prompt: str, sizing: str, lookup: bool, plain: bool, n: int):
    return client.submit(prompt, max_new_tokens=n, sizing=sizing, lookup=lookup, with_vanilla=plain,
                         api_name="/generate")


def watch(visitors: list[dict], deadline: float) -> None:
    """Until every job ends: when each got its first update (its turn), and the queue place the API reported."""
    while any(not v["job"].done() for v in visitors) and time.time() < deadline:
        now = time.time()
        for v in visitors:
            if v["started"] is None and v["job"].outputs():
                v["started"] = now
            st = v["job"].status()
            if st.rank is not None and st.queue_size:
                v["rank"] = max(v["rank"], st.rank + 1)
                v["eta"] = v["eta"] if st.eta is None else st.eta
        time.sleep(0.1)


def scrub_loop(client, halt: threading.Event, lat: list[float], errors: list[str]) -> None:
    """Scrub the finished run's EAGLE-2 tree, step after step, until `halt`."""
    step = 0
    while not halt.is_set():
        t0 = time.perf_counter()
        try:
            fig, text, caption = client.predict(step, True, api_name="/scrub_eagle2")
        except Exception as e:  # any failure over the API is part of the report, not a crash of the test
            errors.append(f"scrub: {e}")
            return
        lat.append(time.perf_counter() - t0)
        if not caption.startswith(f"Step {step}"):
            errors.append(f"scrub step {step}: caption {caption[:60]!r}")
        step = (step + 1) % 6


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(round(q * (len(xs) - 1))), len(xs) - 1)] if xs else float("nan")


def check(v: dict, i: int, errors: list[str], deadline: float) -> dict:
    """One visitor's row: served (each tree's text equal to its greedy reference, or a prefix when cut), waits."""
    row = {"visitor": i + 1, "prompt": v["prompt"][:40],
           "settings": f"{v['sizing']}, lookup {v['lookup']}, plain {v['plain']}, {v['n']} tokens"}
    try:
        final = v["job"].result(timeout=max(deadline - time.time(), 1))
    except Exception as e:  # a visitor whose job failed is reported with its error
        errors.append(f"visitor {i + 1}: {e}")
        return {**row, "served": False, "error": str(e)}
    status = str(final[0])
    cut = status.startswith("Stopped at the time limit")
    texts = [shown_text(final[k]) for k in (8, 9)] if status.startswith("Done.") or cut else []
    ok = bool(texts) and all(t == v["want"] or (cut and t and v["want"].startswith(t)) for t in texts)
    if not ok:
        errors.append(f"visitor {i + 1}: {status[:100]!r}; texts {[t[:40] for t in texts]}")
    if cut:
        row["status"] = status
    return {**row, "served": ok, "cut_by_time_limit": cut, "characters_shown": [len(t) for t in texts],
            "queue_wait_s": round((v["started"] or time.time()) - v["submitted"], 1),
            "queue_place_seen": v["rank"], "estimate_seen_s": None if v["eta"] is None else round(v["eta"], 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m checks.loadtest", description=__doc__.split("\n")[0])
    p.add_argument("--visitors", type=int, default=8, help="visitors who Generate at once (8 to 16)")
    p.add_argument("--ttl", type=float, default=45.0, help="session lifetime in seconds")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds in all")
    p.add_argument("--url", help="a page already served on 127.0.0.1 (default: start one)")
    p.add_argument("--server-pid", type=int, help="that server's process id, to read its memory")
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the server side of this test
    a = p.parse_args(argv)
    if a.serve:
        serve(a.serve)
    if not 8 <= a.visitors <= len(PROMPTS):
        p.error(f"--visitors must be 8 to {len(PROMPTS)}")
    if a.url and urlparse(a.url).hostname not in LOCAL:
        p.error("--url must be on 127.0.0.1: this test loads the server it talks to")
    deadline = time.time() + a.timeout
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    server = None if a.url else Server(a.ttl, deadline)
    try:
        return run_visitors(a, server, deadline)
    finally:
        if server is not None:
            server.stop()


def run_visitors(a: argparse.Namespace, server: Server | None, deadline: float) -> int:
    """The test itself, against `server` (or --url); prints the report and returns the exit status."""
    from gradio_client import Client

    from app_parts.presets import page_token_limit
    from eagle2.api import run
    from eagle2.config import DecodeConfig
    from eagle2.loading import load

    url, pid = (server.url, server.pid) if server else (a.url, a.server_pid)
    report: dict = {"url": url, "visitors": a.visitors, "session_ttl_s": a.ttl}
    plan = [{"prompt": PROMPTS[i], "sizing": s, "lookup": lk, "plain": pl, "n": n}
            for i, (s, lk, pl, n) in zip(range(a.visitors), SETTINGS * 2)]
    plan[-1].update(prompt=LONG_PROMPT, n=page_token_limit())  # one visitor asks for the largest token limit
    bundle = load("embedded", None, "cpu")
    for v in plan:  # the references, before any visitor
        v["want"] = "".join(t for r in run(bundle, v["prompt"], DecodeConfig(method="vanilla", max_new_tokens=v["n"]))
                            .records for t in r.new_texts)
    del bundle
    report["rss_mb_started"] = round(rss_of(pid) or 0, 1)

    first = Client(url, verbose=False)  # the server's first run after start (it loads the model), then it leaves
    warm = list(submit(first, "Say hello.", "tuned", False, True, 8))[-1]
    first.close()
    if not str(warm[0]).startswith("Done."):
        print(json.dumps({"error": f"the first run did not finish: {warm[0]!r}"}))
        return 1
    time.sleep(HEARTBEAT_S + 5)  # until the server has noticed, and its unload handler freed that session
    before = rss_of(pid)
    report["rss_mb_before"] = round(before or 0, 1)

    sampler = Sampler(pid)
    sampler.start()
    scrubber = Client(url, verbose=False)
    done = list(submit(scrubber, "Count from 1 to 10.", "tuned", False, False, 16))[-1]
    if not str(done[0]).startswith("Done."):
        print(json.dumps({"error": f"the scrubber's run did not finish: {done[0]!r}"}))
        return 1
    clients = [Client(url, verbose=False) for _ in plan]
    halt, lat, errors = threading.Event(), [], []
    scrub = threading.Thread(target=scrub_loop, args=(scrubber, halt, lat, errors), daemon=True)
    t0 = time.time()
    visitors = [{**v, "job": submit(c, v["prompt"], v["sizing"], v["lookup"], v["plain"], v["n"]),
                 "submitted": time.time(), "started": None, "rank": 0, "eta": None} for v, c in zip(plan, clients)]
    scrub.start()
    watch(visitors, deadline)
    halt.set()
    scrub.join(timeout=30)
    report["all_decodes_s"] = round(time.time() - t0, 1)
    rows = [check(v, i, errors, deadline) for i, v in enumerate(visitors)]
    report["visitor_rows"] = rows
    report["served_equal_to_greedy"] = f"{sum(r['served'] for r in rows)}/{len(rows)}"
    report["longest_queue_wait_s"] = max(r.get("queue_wait_s", 0) for r in rows)
    report["scrub_s_while_decoding"] = {"calls": len(lat), "median": round(statistics.median(lat), 3) if lat else None,
                                        "p95": round(percentile(lat, 0.95), 3),
                                        "worst": round(max(lat), 3) if lat else None}
    if server:
        report["sessions_with_runs_peak"] = server.peak_runs
        report["gradio_kept_kb_per_session"] = server.latest["gradio_kept_kb"]

    for c in clients:  # the visitors leave; the scrubber stays, idle, until its session expires
        c.close()
    del visitors, clients
    wait_until = min(time.time() + max(a.ttl, HEARTBEAT_S) + 10, deadline)
    while time.time() < wait_until and (server is None or server.latest["with_runs"] > 0):
        time.sleep(1)
    time.sleep(3)
    sampler.halt.set()
    after = rss_of(pid)
    report["rss_mb_peak"] = round(sampler.peak, 1)
    report["rss_mb_after"] = round(after or 0, 1)
    if server:
        report["sessions_with_runs_after"] = server.latest["with_runs"]
        report["sessions_after"] = server.latest["sessions"]
    report["scrubber_after_expiry"] = scrubber.predict(1, True, api_name="/scrub_eagle2")[2][:80]
    scrubber.close()

    bar = {"all_served_without_error": not errors and all(r["served"] for r in rows),
           "scrub_p95_under_1s": bool(lat) and percentile(lat, 0.95) < SCRUB_P95_S,
           "memory_back_within_10pct": None if before is None or after is None else
           after <= before * (1 + MEMORY_SLACK)}
    report["errors"] = errors
    report["bar"] = bar
    print(json.dumps(report, indent=1, ensure_ascii=False))
    return 0 if all(v is not False for v in bar.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
