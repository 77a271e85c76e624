"""Benchmark: every method on the same prompts, in one process, after a warm-up; ratios, not absolutes.

Methods by name (eagle2/decode/methods.py): our `vanilla`, `eagle1`, `eagle2` (the paper's algorithm), and this
project's `eagle2_sized`, `eagle2_lookup`, `eagle2_sized_lookup`; transformers' own greedy `generate`
(`hf_greedy`) and its prompt-lookup assisted generation (`hf_lookup`) as peers. The peers run on a stock copy of
the target (`loading.stock_target`: the same files, none of eagle2.cpu's kernels or layers), loaded once and only
when a peer is asked for; it adds a second set of weights, 538 MB for SmolLM2-135M in float32. Speedups are
tokens/s ratios within this run. Each method's settings are stored beside its numbers; with greedy decoding
the dynamic tree's own gain is also replayed at equal budgets (`equal_budgets`), independent of speed.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..config import STATIC_PRESET
from ..decode.methods import LABELS, OURS, PEERS, STATIC_NODES, Shared, config_for, settings_of
from ..decode.records import per_step, phase_totals, tau_counts
from ..inputs import whole_arg
from ..loading import stock_target
from ..policies import DYNAMIC, HF_GREEDY, STATIC, VANILLA, policy
from .autotune import same_algorithm
from .prompts import read_rows

HF_LOOKUP_TOKENS = 10  # transformers' prompt_lookup_num_tokens default
PEER_KERNELS = "stock transformers"  # what the peers run on, stored in their settings
EQUAL_BUDGETS = range(2, STATIC_NODES + 1)  # node budgets the equal-budget replay reports


def _hf(model, ids: list[int], max_new: int, lookup: bool) -> tuple[list[int], float]:
    """transformers' own generate on a stock model, greedy; prompt lookup when asked."""
    x = torch.tensor([ids], device=model.device)
    extra = {"prompt_lookup_num_tokens": HF_LOOKUP_TOKENS} if lookup else {}
    t0 = time.perf_counter()
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False, **extra)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def turns(items: list, i: int) -> list:
    """The order `items` take turns in on the i-th round: each round starts one further on, so that none always
    runs first (a slow spell of the machine, or a first run's warm-up, costs them alike). The bench, `ablate` and
    the page's timed pass all take turns this way."""
    k = i % len(items) if items else 0
    return items[k:] + items[:k]


def run_bench(bundle, prompts: list[str], methods: list[str], cfg_for, max_new: int, progress=print,
              labels: dict[str, str] | None = None) -> dict:
    """Run each method on each prompt, the first on each prompt rotating so that none always runs first;
    returns {"methods": {name: metrics}, "per_prompt": [...]}. A name that is no registered method (an engine's
    settings, `--engine-flags`) runs `cfg_for(name)` under `labels[name]`."""
    labels = {**LABELS, **(labels or {})}
    from ..api import run
    from ..decode.engine import encode_prompt

    encoded = [encode_prompt(bundle.tokenizer, p) for p in prompts]
    peer = stock_target(bundle) if any(m in PEERS for m in methods) else None
    for m in methods:  # warm-up: first calls pay for allocation and kernel selection
        if m not in PEERS:
            run(bundle, encoded[0], replace(cfg_for(m), max_new_tokens=8))
        else:
            _hf(peer, encoded[0], 8, policy(m).lookup)
    # "tau": the (tokens, target forwards) that τ counts (`records.tau_counts`), pooled over prompts; None for
    # transformers' peers, whose forwards are not recorded
    # "phases": the runs' `records.phase_totals` added up, for where each method's time went; None for the peers
    totals = {m: {"tokens": 0, "wall": 0.0, "tau": (0, 0), "match": 0, "phases": None if m in PEERS else {}}
              for m in methods}
    per_prompt, per_tau, per_tokens = [], [], []
    for i, ids in enumerate(encoded):
        outs, counts = {}, {}
        for m in turns(methods, i):
            if m not in PEERS:
                res = run(bundle, ids, cfg_for(m))
                toks, wall = res.token_ids, res.wall_s
                got = tau_counts(res.records)
                phases = totals[m]["phases"]
                for k, v in phase_totals(res.records, wall).items():
                    phases[k] = phases.get(k, 0) + v
            else:
                toks, wall = _hf(peer, ids, max_new, policy(m).lookup)
                got = None
            outs[m], counts[m] = toks, got
            t = totals[m]
            t["tokens"] += len(toks)
            t["wall"] += wall
            t["tau"] = None if got is None or t["tau"] is None else (t["tau"][0] + got[0], t["tau"][1] + got[1])
        ref = outs.get(VANILLA, outs.get(HF_GREEDY))
        for m in methods:
            totals[m]["match"] += int(ref is not None and outs[m] == ref)
        per_prompt.append({m: len(outs[m]) for m in methods})
        per_tau.append(counts)
        per_tokens.append(outs)  # the outputs themselves: runs in other processes can be checked token for token
        progress(f"prompt {i + 1}/{len(encoded)} done")
    base = totals.get(VANILLA)  # no vanilla run: no "x vanilla" column (the hf_greedy column has the peer's)
    base_tps = base["tokens"] / base["wall"] if base else None
    hf_tps = totals[HF_GREEDY]["tokens"] / totals[HF_GREEDY]["wall"] if HF_GREEDY in totals else None
    has_ref = VANILLA in totals or HF_GREEDY in totals
    result = {}
    for m, t in totals.items():
        tps = t["tokens"] / t["wall"]
        result[m] = {
            "mean_accept_length": _ratio(t["tau"]),
            "tokens_per_s": tps,
            "speedup_vs_vanilla": tps / base_tps if base_tps else None,
            "speedup_vs_hf_greedy": tps / hf_tps if hf_tps else None,
            "matches_vanilla": t["match"] / len(encoded) if has_ref else None,  # None: no greedy reference ran
            "new_tokens": t["tokens"],
            "wall_s": t["wall"],
            "time": None if t["phases"] is None else {**{k: round(v, 4) for k, v in per_step(t["phases"]).items()},
                                                      "steps": t["phases"]["steps"]},
            "label": labels[m],
            "settings": settings_of(cfg_for(m)) if m not in PEERS else
            {"max_new_tokens": max_new, "kernels": PEER_KERNELS,
             **({"prompt_lookup_num_tokens": HF_LOOKUP_TOKENS} if policy(m).lookup else {})},
        }
    return {"methods": result, "prompts": len(encoded), "max_new_tokens": max_new, "per_prompt": per_prompt,
            "per_prompt_tau_counts": per_tau, "per_prompt_tokens": per_tokens}


def _ratio(counts: tuple[int, int] | None) -> float | None:
    """τ from pooled (tokens, target forwards); None when unknown or no step after the prefill ran."""
    return counts[0] / counts[1] if counts and counts[1] else None


def equal_budgets(bundle, prompts: list[str], shared: Shared, progress=print) -> dict:
    """The dynamic tree's own gain, independent of speed: mean accept length of EAGLE-2 (depth and top-k as
    given, no additions) and of EAGLE-1 (mc_sim_7b_63 cut breadth first) at each budget of EQUAL_BUDGETS nodes,
    replayed exactly from one greedy decode of each prompt with the largest tree of each kind, both drafting over
    the same vocabulary. Accept lengths are pooled as the bench counts them (`replay.replay_runs`)."""
    from ..api import run
    from ..decode.engine import encode_prompt
    from .replay import replay_runs

    top = max(EQUAL_BUDGETS)
    base = replace(shared, total_tokens=top, temperature=0.0, tree=None, tuned={})
    dyn, static = config_for("eagle2", base), config_for("eagle1", base)
    runs: dict[str, list] = {"eagle2": [], "eagle1": []}
    for i, text in enumerate(prompts):
        ids = encode_prompt(bundle.tokenizer, text)
        for m, cfg in (("eagle2", dyn), ("eagle1", static)):
            runs[m].append([r for r in run(bundle, ids, cfg).records if r.nodes])
        progress(f"equal budgets: prompt {i + 1}/{len(prompts)} recorded")
    return {"nodes": list(EQUAL_BUDGETS), "eagle2_depth": dyn.depth, "eagle2_top_k": dyn.top_k,
            "eagle1_tree": STATIC_PRESET, "draft_tokens": dyn.draft_tokens,
            "eagle2": [round(replay_runs(runs["eagle2"], n, dyn.depth), 4) for n in EQUAL_BUDGETS],
            "eagle1": [round(replay_runs(runs["eagle1"], n, 0, static=True), 4) for n in EQUAL_BUDGETS]}


def format_equal_budgets(eq: dict) -> str:
    """The equal-budget replay as two rows of accept lengths."""
    show = [n for n in eq["nodes"] if n in (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 26)]
    idx = [eq["nodes"].index(n) for n in show]
    rows = [f"tau at equal budgets (replayed; EAGLE-2 depth {eq['eagle2_depth']}, top-k {eq['eagle2_top_k']}; "
            f"EAGLE-1 {eq['eagle1_tree']} cut breadth first)",
            f"{'nodes':<8}" + "".join(f"{n:>6}" for n in show)]
    rows += [f"{m:<8}" + "".join(f"{eq[m][i]:>6.2f}" for i in idx) for m in (DYNAMIC, STATIC)]
    return "\n".join(rows)


def by_category(res: dict, categories: list[str | None]) -> dict[str, dict[str, float | None]]:
    """Mean accept length of each method within each prompt category (in first-seen order); {} without any."""
    if not any(categories):
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for cat in dict.fromkeys(c or "-" for c in categories):
        rows = [i for i, c in enumerate(categories) if (c or "-") == cat]
        out[cat] = {}
        for m in res["methods"]:
            counts = [res["per_prompt_tau_counts"][i][m] for i in rows]
            out[cat][m] = None if None in counts else _ratio(tuple(map(sum, zip(*counts))))
    return out


def format_categories(cats: dict[str, dict[str, float | None]]) -> str:
    """Accept length per category and method, one row per category."""
    methods = [m for m in next(iter(cats.values())) if any(c[m] is not None for c in cats.values())]
    rows = [f"{'category (tau)':<14} " + " ".join(f"{m:>13}" for m in methods)]
    rows += [f"{cat:<14} " + " ".join(f"{'-' if c[m] is None else format(c[m], '.2f'):>13}" for m in methods)
             for cat, c in cats.items()]
    return "\n".join(rows)


def format_table(res: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    rows = [f"{'method':<20} {'tau':>6} {'tok/s':>8} {'x vanilla':>10} {'x hf':>7} {'= greedy':>9}  settings"]
    for m, r in res["methods"].items():
        rows.append(f"{m:<20} {f(r['mean_accept_length'], '.2f'):>6} {r['tokens_per_s']:>8.2f} "
                    f"{f(r['speedup_vs_vanilla'], '.2f'):>10} {f(r['speedup_vs_hf_greedy'], '.2f'):>7} "
                    f"{f(r['matches_vanilla'], '.2f'):>9}  {describe_settings(r['settings'])}")
    return "\n".join(rows)


def format_phases(res: dict) -> str:
    """Where each of our methods' time went (`time`: the records' own timers, pooled over the prompts): a drafted
    step's mean ms in each phase, and the prefill's mean ms a prompt; empty when only peers ran."""
    ours = {m: r["time"] for m, r in res["methods"].items() if r.get("time")}
    if not ours:
        return ""
    rows = [f"{'ms a step':<20} {'drafting':>9} {'verifying':>10} {'committing':>11} {'rest':>6} "
            f"{'prefill a prompt':>17}"]
    for m, t in ours.items():
        rows.append(f"{m:<20} {t['draft_ms_per_step']:>9.2f} {t['verify_ms_per_step']:>10.2f} "
                    f"{t['commit_ms_per_step']:>11.2f} {t['rest_ms_per_step']:>6.2f} {t['prefill_ms']:>17.1f}")
    return "\n".join(rows)


def describe_settings(s: dict) -> str:
    """A method's settings in a few words for the table."""
    if "tree" in s:
        return f"{s['total_tokens']}-node static tree" + (f", {s['draft_tokens']} draft tokens" if s["draft_tokens"] else "")
    if "chain_tokens" in s:
        text = f"chain of {s['chain_tokens']}" + (f", stops below p {s['p_min']:g}" if s["p_min"] else "")
        return text + (f", {s['draft_tokens']} draft tokens" if s.get("draft_tokens") else "")
    if "depth" not in s:
        return s.get("kernels", "")
    text = f"{s['total_tokens']} nodes, depth {s['depth']}, top-k {s['top_k']}"
    if "min_prob" in s:
        text = f"up to {s['total_tokens']} nodes, floors {s['min_prob']:g}/{s['expand_prob']:g}, depth {s['depth']}"
    return text + (f", {s['draft_tokens']} draft tokens" if s.get("draft_tokens") else "")


def cmd_bench(args: argparse.Namespace) -> None:
    import sys

    from .cli_common import config_from, prepare, tune_shared
    from ..loading import load
    from ..decode.methods import budget_note

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods and not args.sweep:
        raise ValueError(f"--methods names no method: give a comma-separated list from {', '.join(OURS + PEERS)}")
    if args.json:  # made now, not after the whole run, so that an unwritable path fails before anything runs
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    rows = read_rows(args.prompts, args.limit)
    prompts = [r.prompt for r in rows]
    if not prompts:
        raise ValueError(f"no prompts in {args.prompts}")
    if args.temperature != 0.0 and any(m in PEERS for m in methods):
        raise ValueError("hf_greedy and hf_lookup are greedy baselines: use --temperature 0")
    if args.sweep and args.total_tokens == "auto":
        raise ValueError("--sweep tries many sizes itself: give --total-tokens a number")
    if args.sweep and (args.min_prob or args.expand_prob):
        raise ValueError("--sweep measures fixed tree sizes: leave out --min-prob and --expand-prob")
    engine = None
    if args.engine_flags is not None:
        from .engines import parse_engine_flags

        engine = parse_engine_flags(args.engine_flags)  # refused before anything loads
        if engine.engine in methods:
            raise ValueError(f"--methods already names {engine.engine}")
    shared, auto = prepare(args, [] if args.sweep else methods)
    bundle = load(args.model, args.head, args.device, args.kernels, args.draft_dtype)
    print(bundle.describe(), file=sys.stderr)
    if args.sweep:
        from viz.sweep import write_plots

        from .sweep import run_sweep

        rows = run_sweep(bundle, prompts, config_from(args, "eagle2"))
        for r in rows:
            print(f"{r['method']:<8} {r['label']:<14} nodes {r['total_tokens']:>3} tau {r['tau']:.2f} "
                  f"tok/s {r['tokens_per_s']:.2f} x{r['speedup']:.2f}")
        prefix = args.sweep_out
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.json").write_text(json.dumps({"device": bundle.describe(), "rows": rows}, indent=2))
        print("wrote", ", ".join(write_plots(rows, prefix) + [f"{prefix}.json"]), file=sys.stderr)
        return
    tuned = None
    if auto:
        shared, tuned = tune_shared(args, bundle, methods, shared)
    note = budget_note(shared, methods)
    same = same_algorithm(shared.tuned) if auto else None
    if same:
        note = f"{note} {same}" if note else same
    if note:
        print(note, file=sys.stderr)
    cfgs, labels = {}, {}
    if engine is not None:  # one more row, named after the engine: its own tree, neither given nor tuned
        from .engines import engine_config

        cfgs[engine.engine] = engine_config(args.engine_flags, shared)[1]
        labels[engine.engine] = f"{engine.terms} -> {engine.policy}"
        methods = [*methods, engine.engine]
    res = run_bench(bundle, prompts, methods, lambda m: cfgs.get(m) or config_for(m, shared), args.max_new_tokens,
                    progress=lambda s: print(s, file=sys.stderr), labels=labels)
    if engine is not None:
        res["engine"] = engine.to_dict()
    res.update(device=bundle.describe(), head=bundle.head_name, head_kind=bundle.head_kind, settings={k: v for k, v in vars(args).items() if k != "func"},
               comparison="each method at its own tuned best on this machine" if auto else
               "the node budget given (EAGLE-1's tree cut to it)" if args.tree is None else "the settings given")
    if tuned:
        res["tuned"] = tuned
    if note:
        res["note"] = note
    cats = by_category(res, [r.category for r in rows])
    if cats:
        res["categories"] = cats
    print(f"comparison: {res['comparison']}")
    print(format_table(res))
    phases = format_phases(res)
    if phases:
        print(phases)
    if len(cats) > 1:
        print(format_categories(cats))
    if args.equal_budgets and shared.temperature == 0.0 and any(m in OURS and policy(m).drafts for m in methods):
        res["equal_budgets"] = equal_budgets(bundle, prompts, shared, progress=lambda s: print(s, file=sys.stderr))
        print(format_equal_budgets(res["equal_budgets"]))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


def add_parser(sub, decode_args) -> None:
    b = sub.add_parser("bench", help="compare methods on a prompt file")
    b.add_argument("--prompts", required=True, help="Spec-Bench / MT-bench jsonl")
    b.add_argument("--limit", type=whole_arg(1), default=None, help="the first N prompts (default: all)")
    b.add_argument("--methods", default="vanilla,eagle1,eagle2",
                   help=f"comma-separated, of {', '.join(OURS + PEERS)}")
    b.add_argument("--no-equal-budgets", dest="equal_budgets", action="store_false",
                   help="skip the replay of EAGLE-2 against EAGLE-1 at equal budgets (2-26 nodes; one more greedy "
                        "decode of each prompt with each tree kind's largest tree)")
    b.add_argument("--json", default=None, help="write results to this file")
    b.add_argument("--sweep", action="store_true", help="sweep tree size and depth for both tree kinds")
    b.add_argument("--sweep-out", default="out/sweep", help="path prefix of the sweep's .json/.html/.png")
    decode_args(b)
    b.set_defaults(func=cmd_bench)
