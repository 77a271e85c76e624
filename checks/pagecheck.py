"""Does the page report the speed the command line measures? Drives the page's own Generate path (model cache with
its warm-up, the machine's tuned sizing, the runner, the metrics) on a few prompts, then `python -m eagle2
generate --json` with the same method and settings in a fresh process each, and prints both side by side.

    .venv/bin/python -m checks.pagecheck                      # three prompts of different kinds, 64 tokens
    .venv/bin/python -m checks.pagecheck --prompts FILE.jsonl --limit 5 --max-new-tokens 96

The page's first Generate after start is included (this process starts cold, as a server does). Nothing is
drawn to a browser here; the browser tests check the page itself.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from app_parts.presets import CACHE, load_presets
from app_parts.runner import generate
from app_parts.settings import RunRequest, configs
from eagle2.decode.records import tau
from eagle2.tools.prompts import read_prompts
from eagle2.policies import PANELS, PLAIN, policy

PROMPTS = ["Explain in three sentences why the sky is blue.",
           "Write a short poem about a lighthouse keeper who talks to the sea.",
           "Translate into French: The meeting has been moved to Thursday afternoon because the room is booked."]
METHODS = (*PANELS, PLAIN)


def cli_flags(cfgs: dict, method: str) -> list[str]:
    """`python -m eagle2 generate` flags that run what the page ran for `method`."""
    c = cfgs[method]
    flags = ["--method", method, "--max-new-tokens", str(c.max_new_tokens), "--draft-tokens", str(c.draft_tokens)]
    if policy(method).dynamic:
        flags += ["--total-tokens", str(c.total_tokens), "--depth", str(c.depth), "--top-k", str(c.top_k)]
    elif policy(method).static:
        flags += ["--tree", json.dumps([list(p) for p in c.tree])]
    return flags


def page_run(prompt: str, preset, max_new: int) -> tuple[dict, dict]:
    """One Generate through the page's path; (per-method {tokens_per_s, tau, tokens}, configs it ran)."""
    req = RunRequest(prompt=prompt, preset=preset.name, max_new_tokens=max_new, sizing="tuned")
    final = list(generate(req, CACHE.get, get_profile=CACHE.profile))[-1]
    if final.error:
        raise RuntimeError(final.error)
    s = final.session
    wall = s.meta.timing.decode_s
    out = {}
    for m in METHODS:
        recs = s.records(m)
        tokens = [t for r in recs for t in r.new_tokens]
        out[m] = {"tokens_per_s": len(tokens) / wall[m], "tau": tau(recs),
                  "tokens": tokens}
    return out, configs(req, CACHE.profile(preset, CACHE.get(preset)))


def cli_run(prompt: str, flags: list[str]) -> dict:
    """`python -m eagle2 generate --json` in a fresh process."""
    cmd = [sys.executable, "-m", "eagle2", "generate", "--prompt", prompt, "--json", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.pagecheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=None, help="jsonl of prompts (default: three built-in ones)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    prompts = read_prompts(args.prompts, args.limit) if args.prompts else PROMPTS[:args.limit]
    preset = next(iter(load_presets().values()))
    print(f"{'prompt':<34} {'method':<8} {'page tok/s':>10} {'cli tok/s':>10} {'page/cli':>9} {'tau page':>9} "
          f"{'tau cli':>8}  same text")
    ratios, speedups = [], []
    for prompt in prompts:
        page, cfgs = page_run(prompt, preset, args.max_new_tokens)
        speedups.append(page["eagle2"]["tokens_per_s"] / page["vanilla"]["tokens_per_s"])
        for m in METHODS:
            cli = cli_run(prompt, cli_flags(cfgs, m))
            ratio = page[m]["tokens_per_s"] / cli["tokens_per_s"]
            ratios.append(ratio)
            same = page[m]["tokens"] == cli["token_ids"] == page["vanilla"]["tokens"]
            print(f"{prompt[:33]:<34} {m:<8} {page[m]['tokens_per_s']:>10.1f} {cli['tokens_per_s']:>10.1f} "
                  f"{ratio:>9.3f} {page[m]['tau']:>9.2f} {cli['mean_accept_length']:>8.2f}  {same}", flush=True)
    c = cfgs["eagle2"]
    print(f"\nsizing: tuned for this machine: EAGLE-2 {c.total_tokens} nodes, depth {c.depth}, top-k {c.top_k}, "
          f"draft vocabulary {c.draft_tokens or 'all'}; EAGLE-1 mc_sim_7b_63 cut to {len(cfgs['eagle1'].tree) + 1}")
    print(f"page/cli tokens/s: worst {min(ratios):.3f}, best {max(ratios):.3f}; EAGLE-2 over plain on the page: "
          + ", ".join(f"{s:.2f}x" for s in speedups) + f" (mean {sum(speedups) / len(speedups):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
