"""Does each CPU kernel earn its place? End-to-end tokens/s with every piece, and with each piece left out, in one
run on one machine (`python -m eagle2.tools.ablate --prompts assets/bench/mt_bench.jsonl --limit 20`).

Each variant is its own copy of the model and head, built from PyTorch's nn.Linear with the pieces of
eagle2/cpu put back one by one, except those that only flip a process-wide switch of the row kernel (`SWITCHED`),
which run the default's own copy; the variants take turns on every prompt, the first turn passing from one to
the next (`bench.turns`), so a slow spell of the machine costs them alike. A piece worth under 3% end to end does
not pay for its complexity.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from .. import cpu
from ..cpu import rows
from ..api import run
from .bench import turns
from .prompts import read_prompts
from ..config import DecodeConfig
from ..decode.engine import encode_prompt
from ..loading import load

VARIANTS = {
    "all": "oneDNN, our row kernel, int8 draft head, bounded argmax in the kernel, four-bit codes, fused Llama layers "
           "in one call (the default here)",
    "no bounded argmax": "the target's plain float32 argmax",
    "no kernel argmax": "the bounded argmax's shortlist ranked in PyTorch (bounds, top-k, exact scores, rounding gaps)",
    "no int8 draft": "the draft head in float32 (through the same kernels)",
    "no row kernel": "oneDNN beyond PyTorch's rows; the int8 pieces need the row kernel, so float32 draft and "
                     "bf16-bounded argmax where the CPU has native bf16",
    "no lean layers": "transformers' own LlamaDecoderLayer forward (the same operations, more Python; not fused either)",
    "no fused layers": "the lean layers' PyTorch operations instead of one kernel call per layer for 1 to 32 rows",
    "no fused draft level": "a draft level as the head's own PyTorch operations (embedding, fc, rotary, the fused "
                            "layer, the lm_head rows, log-softmax, top-k) instead of one kernel call",
    "no fused stack": "the fused layers called one by one from Python instead of all thirty in one kernel call",
    "no four-bit codes": "the row kernel over the float32 weights instead of their exact four-bit codes",
    "no eight-row pass": "five to eight rows of four-bit products expanded into L1 and multiplied four rows a pass "
                         "(as for more rows) instead of in registers",
    "no prefetch ahead": "the four-bit codes not fetched ahead, the int8 rows one block ahead instead of two",
    "no streamed codes": "the target's four-bit codes fetched ahead like everything else instead of as non-temporal "
                         "(which leaves the last-level cache to what is read again soon)",
    "no int16 sums": "the int8 rows (argmax bounds, draft head) times float32 inputs in float32 multiply-adds "
                     "instead of inputs rounded to int16 and summed exactly with AVX512-VNNI",
    "none": "PyTorch's nn.Linear everywhere, float32 draft, plain argmax",
}


def variant(name: str, model: str, head: str | None):
    """A bundle with the pieces of `name` (see VARIANTS)."""
    bundle = load(model, head, "cpu", kernels="torch", draft_dtype="float32")
    if name == "none":
        return bundle
    plan = cpu.plan_for([bundle.target, bundle.head])
    if name == "no row kernel":
        plan = replace(plan, own_rows=0)
    int8_rows = name not in ("no int8 draft", "no row kernel") and rows.load() is not None
    cpu.accelerate(bundle.target, plan, four_bit=name != "no four-bit codes")
    cpu.accelerate(bundle.head, plan, int8_rows=int8_rows)
    lean = (cpu.swap_layers(bundle.target, fused=name not in ("no fused layers", "no row kernel"))
            if name != "no lean layers" else 0)
    greedy = None if name == "no bounded argmax" else cpu.exact_greedy(bundle.target.get_output_embeddings())
    if greedy is not None and name == "no kernel argmax":
        greedy.exact_rows = 0
    stack = cpu.fused_stack(bundle.target) if lean and name != "no fused stack" else None
    if lean:  # the head's layer too, as `load` swaps it
        cpu.swap_layers(bundle.head, fused=name not in ("no fused layers", "no row kernel"))
    fused_draft = lean and int8_rows and name != "no fused draft level" and cpu.FusedDraft.head_applies(bundle.head)
    return replace(bundle, kernels=cpu.describe(plan, bundle.target, lean, stack is not None, fused_draft),
                   draft_dtype="int8" if int8_rows else "float32", draft_linear=cpu.draft_linear(plan, int8_rows),
                   greedy=greedy, stack=stack, draft_level=cpu.draft_level if fused_draft else None)


# the row kernel's process-wide switches
SWITCHED = ("no eight-row pass", "no prefetch ahead", "no int16 sums", "no streamed codes")


def run_variant(name: str, bundle, ids: list[int], cfg: DecodeConfig):
    """`api.run` with the row kernel's process-wide switches set for `name` (the pieces not held by the bundle)."""
    kernel = rows.load()
    if kernel is not None:
        kernel.set_eight_rows(name != SWITCHED[0])
        kernel.set_prefetch(name != SWITCHED[1])
        kernel.set_int16_sums(name != SWITCHED[2])
        kernel.set_stream_codes(name != SWITCHED[3])
    return run(bundle, ids, cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2.tools.ablate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--methods", default="eagle2,vanilla")
    ap.add_argument("--total-tokens", type=int, default=4)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--draft-tokens", type=int, default=8192)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--head", default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of: {', '.join(VARIANTS)} (all is always run: the others are against it)")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",")]
    names = ["all", *(v.strip() for v in args.variants.split(",") if v.strip() != "all")]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    bundles: dict = {}
    for name in names:  # a variant that differs only by a kernel switch runs the default's own model and head
        bundles[name] = bundles["all"] if name in SWITCHED else variant(name, args.model, args.head)
    for name, b in bundles.items():
        print(f"{name:<18} {b.describe()}", file=sys.stderr)
    cfgs = {m: DecodeConfig(method=m, max_new_tokens=args.max_new_tokens, total_tokens=args.total_tokens,
                            depth=args.depth, top_k=args.top_k, draft_tokens=args.draft_tokens) for m in methods}
    prompts = read_prompts(args.prompts, args.limit)
    ids = [encode_prompt(bundles["all"].tokenizer, p) for p in prompts]
    for v, b in bundles.items():  # warm-up
        for cfg in cfgs.values():
            run_variant(v, b, ids[0], replace(cfg, max_new_tokens=8))
    tokens = {(v, m): 0 for v in bundles for m in methods}
    wall = dict.fromkeys(tokens, 0.0)
    ref: dict[int, list[int]] = {}
    order = list(bundles)
    for i, x in enumerate(ids):
        for v in turns(order, i):
            b = bundles[v]
            for m, cfg in cfgs.items():
                res = run_variant(v, b, x, cfg)
                tokens[v, m] += len(res.token_ids)
                wall[v, m] += res.wall_s
                if ref.setdefault(i, res.token_ids) != res.token_ids:
                    raise RuntimeError(f"{v} / {m} decoded other tokens than plain decoding on prompt {i + 1}")
        print(f"prompt {i + 1}/{len(ids)} done", file=sys.stderr)
    print(f"{'variant':<18} " + " ".join(f"{m + ' tok/s':>14} {'x all':>7}" for m in methods) + "  what it leaves out")
    for v in bundles:
        cells = []
        for m in methods:
            tps = tokens[v, m] / wall[v, m]
            cells.append(f"{tps:>14.2f} {tps / (tokens['all', m] / wall['all', m]):>7.3f}")
        print(f"{v:<18} " + " ".join(cells) + f"  {VARIANTS[v]}")
    print(f"{len(ids)} prompts, {args.max_new_tokens} new tokens, every output equal across variants and methods")
    return 0


if __name__ == "__main__":
    sys.exit(main())
