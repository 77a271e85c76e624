"""`bench --sweep`: tokens/s and mean accept length against tree size and depth, for both tree kinds.

EAGLE-2 runs over a grid of total tokens x depth; EAGLE-1 runs the mc_sim_7b_63 tree cut at each depth
and a chain of each depth. Plain decoding runs once for the speedup baseline. All in one process.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from ..config import DecodeConfig, parse_tree
from ..decode.records import tau_counts
from ..policies import policy

TOTALS = (4, 8, 12, 16, 26, 40, 60)  # small trees matter on a CPU, where each verified node costs
DEPTHS = (3, 5, 7)


def static_variants(max_depth: int = 7) -> list[tuple[str, tuple]]:
    """(label, paths): mc_sim_7b_63 cut at each depth, and chains."""
    mc = parse_tree("mc_sim_7b_63", 20)
    out = []
    for d in range(2, 6):
        out.append((f"mc_sim<=d{d}", tuple(p for p in mc if len(p) <= d)))
    for d in (3, 5, max_depth):
        out.append((f"chain_{d}", tuple((0,) * i for i in range(1, d + 1))))
    return out


def run_sweep(bundle, prompts: list[str], base: DecodeConfig, totals=TOTALS, depths=DEPTHS,
              progress=lambda s: print(s, file=sys.stderr)) -> list[dict]:
    """One row per configuration: method, label, total_tokens, depth, tokens_per_s, tau, speedup."""
    from ..api import run
    from ..decode.engine import encode_prompt

    encoded = [encode_prompt(bundle.tokenizer, p) for p in prompts]
    run(bundle, encoded[0], replace(base, method="eagle2", max_new_tokens=8))  # warm-up

    def measure(cfg: DecodeConfig) -> tuple[float, float]:
        """(tokens/s, τ pooled over the prompts as `records.tau_counts` counts them)."""
        tokens = tau_tokens = tau_forwards = 0
        wall = 0.0
        for ids in encoded:
            res = run(bundle, ids, cfg)
            tokens += len(res.token_ids)
            counted = tau_counts(res.records)
            tau_tokens, tau_forwards = tau_tokens + counted[0], tau_forwards + counted[1]
            wall += res.wall_s
        return tokens / wall, tau_tokens / tau_forwards if tau_forwards else 0.0

    vtps, _ = measure(replace(base, method="vanilla"))
    rows = [{"method": "vanilla", "label": "vanilla", "total_tokens": 1, "depth": 0, "tokens_per_s": vtps,
             "tau": 1.0, "speedup": 1.0}]
    configs = [("eagle2", f"T{t} D{d}", replace(base, method="eagle2", total_tokens=t, depth=d))
               for d in depths for t in totals]
    configs += [("eagle1", label, replace(base, method="eagle1", tree=paths, depth=max(len(p) for p in paths)))
                for label, paths in static_variants(max(depths))]
    for i, (method, label, cfg) in enumerate(configs, start=1):
        tps, tau = measure(cfg)
        total = len(cfg.tree) + 1 if policy(method).static else cfg.total_tokens
        rows.append({"method": method, "label": label, "total_tokens": total, "depth": cfg.depth,
                     "tokens_per_s": tps, "tau": tau, "speedup": tps / vtps})
        progress(f"sweep {i}/{len(configs)}: {method} {label} tau={tau:.2f} x{tps / vtps:.2f}")
    return rows
