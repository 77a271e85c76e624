"""`python -m eagle2 diagnose`: a workload's accept lengths for every tree shape, and the shape to serve it with.

Each prompt is decoded greedily once with a large recorded EAGLE-2 tree; every smaller shape is replayed from
those records (`workload`). The report: per prompt and per category τ of chains, of EAGLE-1's static tree
cut to each size and of EAGLE-2 at each budget and depth; acceptance by position; the steps where acceptance
collapsed; conformance checks; and the fastest shape for this machine (measured) and for a GPU profile
(stated), written as SGLang, vLLM and TensorRT-LLM settings (`serving`). The report is built from plain
data (`report`); only `cmd_diagnose` loads torch.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..decode.records import TAU_DEFINITION, tau
from ..files import write_atomic
from ..policies import CHAIN, DYNAMIC, policy
from . import workload as wl
from .serving import ASSUMED, Shape, cpu_cost, fastest, gpu_cost, sglang_flags, tensorrt_llm_config, vllm_config

RECORD = {"total_tokens": 60, "depth": 7, "top_k": 10}  # the recorded tree: the authors' defaults at depth 7
TOP_KS = (1, 2, 4, 6, 8)  # smaller top-k replayed for the recommendations
GPU_ROWS, GPU_DRAFT = 64, 0.05
DEFINITIONS = {
    "tau": TAU_DEFINITION + "; each decode's tokens divided by its own replayed τ when pooled",
    "drafts_accepted_per_step": "mean draft tokens accepted per drafted step, the bonus not counted (not τ: "
                                "τ - 1 where no decode was cut short)",
    "chain": "keyed by L, draft tokens per step (top-1 only; verifies L + 1 nodes with the root)",
    "eagle1": "keyed by N, verified nodes with the root: mc_sim_7b_63 cut breadth first",
    "eagle2": "keyed by 'N,D': N verified nodes with the root, depth D, top-k 10",
    "conditional": "accepted / reached: of the verified draft tokens at this depth and sibling rank whose parent "
                   "the target accepted, the share it accepted",
    "mean": "accepted / drafted: of all verified draft tokens at this depth and sibling rank, the share accepted",
    "collapse": "a step where the 60-node tree accepted no draft token; worst: the draft's most confident misses",
    "inexact": "steps where a node a smaller shape needs was never drafted (its parent not expanded): the τ "
               "given is a lower bound there",
}


def _tau_tables(runs: list[tuple[list[wl.Step], wl.Curves]]) -> dict:
    """{"chain": {"L": τ}, "eagle1": {"N": τ}, "eagle2": {"N,D": τ}} pooled over `runs`."""
    out: dict[str, dict[str, float]] = {"chain": {}, "eagle1": {}, "eagle2": {}}
    keys = runs[0][1].tokens if runs else {}
    for key in keys:
        kind, arg = key.split(" ")
        if kind == DYNAMIC and arg.count(",") > 1:
            continue
        out[kind][arg] = round(wl.pooled_tau([(steps, c.tokens[key]) for steps, c in runs]), 4)
    return out


def _recorded(steps_runs: list[list[wl.Step]]) -> dict:
    """τ of the recorded 60-node decodes as they ran (`records.tau`), and the accepted drafts per step."""
    drafted = [s for run in steps_runs for s in run]
    if not drafted:
        return {}
    accepted = sum(len(s.record.accepted) for s in drafted)
    return {"tau": round(tau([s.record for s in drafted]), 4),
            "drafts_accepted_per_step": round(accepted / len(drafted), 4),
            "steps": len(drafted)}


def _position(steps: list[wl.Step]) -> dict:
    g = wl.positions(steps)

    def ratio(a, b):
        return [[round(x / y, 4) if y else None for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]

    return {"depths": list(range(1, len(g["drafted"]) + 1)), "ranks": list(range(len(g["drafted"][0]))), **g,
            "conditional": ratio(g["accepted"], g["reached"]), "mean": ratio(g["accepted"], g["drafted"]),
            "definitions": {k: DEFINITIONS[k] for k in ("conditional", "mean")}}


def recommend(runs, verify_ms: dict[int, float] | None, draft_ms: dict[int, float] | None,
              gpu_rows: int = GPU_ROWS, gpu_draft: float = GPU_DRAFT, head: str = "DRAFT_MODEL_PATH",
              head_kind: str = "eagle1") -> dict:
    """The fastest shape for this machine (when its costs were measured) and for the GPU profile, with the
    GPU pick as each engine's settings (vLLM: the best chain, since it drafts chains)."""
    taus: dict[tuple[int, int, int], float] = {}
    for key in runs[0][1].tokens:
        kind, arg = key.split(" ")
        got = wl.pooled_tau([(steps, c.tokens[key]) for steps, c in runs])
        if kind == CHAIN:
            taus[(int(arg) + 1, int(arg), 1)] = got
        elif kind == DYNAMIC:
            n, d, *k = map(int, arg.split(","))
            taus[(n, d, k[0] if k else RECORD["top_k"])] = got
    out = {"gpu_profile": {"verify_flat_up_to_rows": gpu_rows, "draft_cost_per_level_in_forwards": gpu_draft}}
    if verify_ms and draft_ms:
        cpu = fastest(taus, cpu_cost(verify_ms, draft_ms), "ms")
        out["cpu"] = {**cpu.to_dict(), "tokens_per_s": round(1e3 * cpu.speed, 2),
                      "verify_ms_by_rows": verify_ms, "draft_ms_by_depth": draft_ms}
    gcost = gpu_cost(gpu_rows, gpu_draft)
    gpu = fastest(taus, gcost, "target forwards")
    best_chain = fastest({k: v for k, v in taus.items() if k[2] == 1}, gcost, "target forwards")
    out["gpu"] = {**gpu.to_dict(), "speedup_estimate": round(gpu.speed, 3)}
    out["sglang"] = sglang_flags(gpu.shape, head, head_kind)
    out["vllm"] = {**vllm_config(best_chain.shape, head, head_kind), "predicted_tau": round(best_chain.tau, 4)}
    out["tensorrt_llm"] = tensorrt_llm_config(gpu.shape, head, head_kind)
    out["openvino"] = {"num_assistant_tokens": gpu.shape.num_draft_tokens - 1, "branching_factor": gpu.shape.topk,
                       "tree_depth": gpu.shape.steps}
    out["llama.cpp"] = f"--spec-draft-n-max {best_chain.shape.steps}"  # a chain, as vLLM's
    out["assumed"] = ASSUMED
    return out


def engine_verdict(runs, engine, verify_ms: dict[int, float] | None, draft_ms: dict[int, float] | None,
                   gpu_rows: int = GPU_ROWS, gpu_draft: float = GPU_DRAFT) -> dict:
    """What an engine's own settings (`engines.EngineRun`) would give on these prompts: their shape's replayed τ
    and predicted speed here and on the GPU profile, against plain decoding (why a config can run slower)."""
    s = engine.settings
    if policy(engine.policy).chain:
        shape, key = Shape(s["chain_tokens"], 1, s["chain_tokens"] + 1), f"chain {s['chain_tokens']}"
    else:
        shape = Shape(s["depth"], s["top_k"], s["total_tokens"])
        key = f"eagle2 {shape.num_draft_tokens},{shape.steps}" + (
            "" if shape.topk == RECORD["top_k"] else f",{shape.topk}")
    out = {**engine.to_dict(), "replayed_as": key}
    if not runs or key not in runs[0][1].tokens:
        out["note"] = (f"not replayable from the recorded tree ({RECORD['total_tokens']} nodes, depth "
                       f"{RECORD['depth']}, top-k {', '.join(map(str, TOP_KS))} or {RECORD['top_k']} replayed)")
        return out
    tau = wl.pooled_tau([(steps, c.tokens[key]) for steps, c in runs])
    out["tau"] = round(tau, 4)
    if s.get("p_min"):
        out["note"] = "τ of the whole chain: its p_min stop is not replayed (a stop only shortens it)"
    if verify_ms and draft_ms:
        ms = cpu_cost(verify_ms, draft_ms)(shape)
        out.update(cpu_tokens_per_s=round(1e3 * tau / ms, 2), cpu_vs_plain=round(tau * verify_ms[1] / ms, 3))
    out["gpu_speedup_estimate"] = round(tau / gpu_cost(gpu_rows, gpu_draft)(shape), 3)
    return out


def report(prompts: list[dict], decodes: list[list], verify_ms=None, draft_ms=None, gpu_rows: int = GPU_ROWS,
           gpu_draft: float = GPU_DRAFT, head: str = "DRAFT_MODEL_PATH", interrupted: bool = False,
           head_kind: str = "eagle1", engine=None) -> dict:
    """The JSON report from each prompt's row ({"id", "category"}) and its recorded decode (StepRecords)."""
    steps = [wl.steps_of(recs) for recs in decodes]
    runs = [(s, wl.curves(s, top_ks=TOP_KS)) for s in steps]
    per_prompt, cats = [], {}
    for row, recs, (st, cv) in zip(prompts, decodes, runs):
        inexact = {k: v for k, v in cv.inexact.items() if v and k.count(",") < 2}
        per_prompt.append({"id": row["id"], "category": row["category"], "tokens": sum(len(r.new_tokens) for r in recs),
                           "text": "".join(t for r in recs for t in r.new_texts), "tau": _tau_tables([(st, cv)]),
                           "recorded": _recorded([st]), "inexact": inexact, "collapses": wl.collapses(st)})
        cats.setdefault(row["category"], []).append((st, cv))
    by_category = {c: {"prompts": len(r), "tau": _tau_tables(r), "recorded": _recorded([s for s, _ in r])}
                   for c, r in cats.items()}
    all_steps = [s for run in steps for s in run]
    return {"definitions": DEFINITIONS, "recorded_tree": RECORD, "interrupted": interrupted,
            "per_prompt": per_prompt, "by_category": by_category,
            "overall": {"tau": _tau_tables(runs), "recorded": _recorded(steps)} if runs else {},
            "position": _position(all_steps),
            "recommended": recommend(runs, verify_ms, draft_ms, gpu_rows, gpu_draft, head, head_kind) if all_steps else {},
            "conformance": wl.conformance(all_steps),
            **({"engine": engine_verdict(runs, engine, verify_ms, draft_ms, gpu_rows, gpu_draft)} if engine else {})}


def say(message: str) -> None:
    """Progress on stderr, so that stdout stays the result."""
    print(message, file=sys.stderr, flush=True)


def cmd_diagnose(args: argparse.Namespace) -> None:
    from ..api import decoder_for
    from .autotune import SIZES, time_drafting, time_verify
    from ..config import DecodeConfig
    from ..decode.engine import encode_prompt
    from ..inputs import check_number
    from ..loading import load
    from .prompts import read_rows

    if args.limit is not None:
        check_number("--limit", args.limit, 1, 1 << 20, whole=True)
    check_number("--gpu-rows", args.gpu_rows, 1, 4096, whole=True)
    check_number("--gpu-draft-cost", args.gpu_draft_cost, 0.0, 10.0)
    engine = None
    if args.engine_flags is not None:
        from .engines import parse_engine_flags

        engine = parse_engine_flags(args.engine_flags)  # refused before anything loads
    rows = read_rows(args.prompts, args.limit)
    if not rows:
        raise ValueError(f"no prompts in {args.prompts}")
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, **RECORD)  # checked before the model loads
    bundle = load(args.model, args.head, args.device, args.kernels, args.draft_dtype)
    say(bundle.describe())
    dec = decoder_for(bundle)
    prompts, decodes, verify_ms, draft_ms, interrupted = [], [], None, None, False
    try:
        for i, row in enumerate(rows, 1):
            ids = encode_prompt(bundle.tokenizer, row.prompt, args.raw)
            records = []
            for r in dec.run(ids, cfg):
                records.append(r)
                say(f"prompt {i}/{len(rows)}: {sum(len(x.new_tokens) for x in records)}/{cfg.max_new_tokens} tokens")
            prompts.append({"id": i, "category": row.category or "uncategorised"})
            decodes.append(records)
        if not args.no_timing:
            first = encode_prompt(bundle.tokenizer, rows[0].prompt, args.raw)
            say("timing verify by rows")
            verify_ms = time_verify(dec, first, tuple(sorted({1, *SIZES})))
            draft_ms = time_drafting(dec, first, DecodeConfig(**{**RECORD, "total_tokens": 2}), range(1, 8),
                                     lambda d: say(f"timing drafting at depth {d}"))
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: writing what is done")
    if not decodes:
        raise RuntimeError("interrupted before any prompt was decoded")
    out = report(prompts, decodes, verify_ms, draft_ms, args.gpu_rows, args.gpu_draft_cost,
                 args.head or "DRAFT_MODEL_PATH", interrupted, bundle.head_kind, engine)
    out.update(model=bundle.model_name, head=bundle.head_name, head_kind=bundle.head_kind, device=bundle.describe(),
               prompts_file=str(args.prompts))
    write(out, args.json, args.html)
    rec = out["recommended"]
    g = rec["gpu"]
    print(f"recommended for a GPU: {g['num_draft_tokens']} nodes, {g['steps']} levels, top-k {g['topk']}: replayed "
          f"tau {g['tau']:.2f}, about {g['speedup_estimate']:.2f}x plain decoding there (the assumed costs are in "
          f"the report; tau for every shape, acceptance by position and collapses: --json / --html)")
    print(f"SGLang: {rec['sglang']}")
    print(f"vLLM speculative_config: {json.dumps(rec['vllm'])}")
    print(f"TensorRT-LLM: {json.dumps(rec['tensorrt_llm'])}")
    print(f"OpenVINO GenAI: {json.dumps(rec['openvino'])} (this project's reading of its tree fields)")
    print(f"llama.cpp: {rec['llama.cpp']}")
    if engine is not None:
        e = out["engine"]
        here = (f"; on this machine {e['cpu_tokens_per_s']:.1f} tokens/s, {e['cpu_vs_plain']:.2f}x plain decoding"
                if "cpu_vs_plain" in e else "")
        print(f"your settings, {e['terms']}: " + (f"replayed tau {e['tau']:.2f}{here}; about "
              f"{e['gpu_speedup_estimate']:.2f}x plain decoding on the GPU profile" if "tau" in e else e["note"]))
    conf = out["conformance"]
    print("conformance: " + ", ".join(f"{k} {'passed' if v['passed'] else 'FAILED'}" for k, v in conf.items()))


def write(out: dict, json_path: str | None, html_path: str | None) -> None:
    """The report as JSON and/or HTML, each written whole or not at all (eagle2/files.py)."""
    if json_path:
        write_atomic(json_path, json.dumps(out, indent=1))
    if html_path:
        from viz.workload import report_html

        write_atomic(html_path, report_html(out))


def add_parser(sub) -> None:
    p = sub.add_parser("diagnose", help="replay every tree shape on a prompt file; recommend serving settings")
    p.add_argument("--prompts", required=True, help="jsonl or JSON list (turns / prompt / instruction rows)")
    p.add_argument("--limit", type=int, default=None, help="the first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", default="embedded", help="'embedded', a hub id or a local directory")
    p.add_argument("--head", default=None, help="draft head directory (official EAGLE layout)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--kernels", default="auto", choices=("auto", "onednn", "torch"))
    p.add_argument("--draft-dtype", default="auto", choices=("auto", "float32", "bfloat16", "int8"))
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", default=None, help="write the report as JSON here")
    p.add_argument("--html", default=None, help="write the report as HTML (Plotly) here")
    p.add_argument("--gpu-rows", type=int, default=GPU_ROWS, help="GPU profile: verify cost flat up to this many rows")
    p.add_argument("--gpu-draft-cost", type=float, default=GPU_DRAFT,
                   help="GPU profile: one draft level's cost as a share of a target forward")
    p.add_argument("--no-timing", action="store_true", help="skip timing this machine (no CPU recommendation)")
    p.add_argument("--engine-flags", default=None, metavar="TEXT",
                   help="also judge a serving engine's own settings, pasted as it takes them (see generate --help): "
                        "their replayed tau and predicted speed against plain decoding")
    p.set_defaults(func=cmd_diagnose)
