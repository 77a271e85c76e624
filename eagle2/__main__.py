"""Command line: `python -m eagle2 generate | bench | train`."""
from __future__ import annotations

import argparse
import json
import sys

from .config import DecodeConfig, parse_tree


def _size(text: str) -> int | str:
    """--total-tokens: a whole number or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', not {text!r}") from None


def wants_tuning(args: argparse.Namespace, methods: list[str]) -> bool:
    """Whether --total-tokens auto has an EAGLE-2 tree to tune among `methods`; if not, the default size stands."""
    if args.total_tokens == "auto" and not {"eagle2", "eagle2_lookup"} & set(methods):
        args.total_tokens = DecodeConfig.total_tokens
    if args.total_tokens == "auto" and (args.min_prob or args.expand_prob):
        raise ValueError("--total-tokens auto chooses --min-prob and --expand-prob itself: leave them out, or give "
                         "--total-tokens a number")
    return args.total_tokens == "auto"


def resolve_auto(args: argparse.Namespace, bundle) -> None:
    """Tune EAGLE-2's nodes and depth, or its per-step floors, on this machine (a warm-up on the shipped tuning
    prompts, a minute or two on 2 CPU cores) and put the choice into args. Without --draft-tokens it also
    chooses between the head's whole draft vocabulary and its first NARROW_DRAFT tokens."""
    from .api import decoder_for
    from .autotune import NARROW_DRAFT, describe, tune, warmup_texts
    from .engine import encode_prompt

    dec = decoder_for(bundle)
    vocab = (0, NARROW_DRAFT) if dec.draft_ids is not None and len(dec.draft_ids) > NARROW_DRAFT else (0,)
    base = DecodeConfig(top_k=args.top_k, max_new_tokens=args.max_new_tokens)
    prompts = [encode_prompt(bundle.tokenizer, t) for t in warmup_texts()]
    best, options = tune(dec, prompts, base, progress=lambda m: print(m, file=sys.stderr),
                         draft_tokens=vocab if args.draft_tokens is None else (args.draft_tokens,))
    print(describe(best, options), file=sys.stderr)
    args.total_tokens, args.depth = best.total_tokens, best.depth
    args.min_prob, args.expand_prob = best.min_prob, best.expand_prob
    args.tuned_draft_tokens = best.draft_tokens
    args.tuned = [o.to_dict() for o in options]


def _decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-tokens", type=_size, default=DecodeConfig.total_tokens,
                   help="EAGLE-2 verified nodes per step, or 'auto': choose nodes and depth by timing this machine")
    p.add_argument("--depth", type=int, default=DecodeConfig.depth)
    p.add_argument("--top-k", type=int, default=DecodeConfig.top_k)
    p.add_argument("--min-prob", type=float, default=DecodeConfig.min_prob,
                   help="EAGLE-2: size the tree per step, keeping only nodes whose cumulative draft probability is "
                        "at least this (0: no floor; --total-tokens stays the cap)")
    p.add_argument("--expand-prob", type=float, default=DecodeConfig.expand_prob,
                   help="EAGLE-2: draft children only of nodes at least this probable (0: no floor)")
    p.add_argument("--draft-tokens", type=int, default=None,
                   help="score only the first N tokens of the head's draft vocabulary (most frequent first; 0: all): "
                        "a cheaper draft level, fewer tokens the draft can propose; the output is the same. "
                        "Default: all, except that --total-tokens auto chooses for EAGLE-2 between all and 8192")
    p.add_argument("--lookup-tokens", type=int, default=DecodeConfig.lookup_tokens,
                   help="longest prompt-lookup branch (with --lookup or method eagle2_lookup)")
    p.add_argument("--tree", default="mc_sim_7b_63", help="static tree preset name or JSON list of paths")
    p.add_argument("--model", default="embedded", help="'embedded', a hub id or a local directory")
    p.add_argument("--head", default=None, help="draft head directory (official EAGLE layout)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--kernels", default="auto", choices=("auto", "onednn", "torch"),
                   help="CPU float32 matmuls: prepacked oneDNN (auto: where it applies) or PyTorch's default")
    p.add_argument("--draft-dtype", default="auto", choices=("auto", "float32", "bfloat16", "int8"),
                   help="the draft head's weights; auto: int8 rows on a CPU where our row kernel builds, else bfloat16 "
                        "on a CPU with native bf16, else the target's dtype (the target stays as it is, so the output "
                        "is the same)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")


def config_from(args: argparse.Namespace, method: str) -> DecodeConfig:
    """Settings from the command line; method `eagle2_lookup` is EAGLE-2 with the prompt-lookup branch. A draft
    vocabulary the tuner chose (`resolve_auto`) applies to EAGLE-2 only, the method it was tuned for."""
    tree = parse_tree(args.tree, max(args.top_k, 20))
    eagle2 = method in ("eagle2", "eagle2_lookup")
    lookup = method == "eagle2_lookup" or bool(getattr(args, "lookup", False))
    draft_tokens = getattr(args, "draft_tokens", None)
    if draft_tokens is None:
        draft_tokens = getattr(args, "tuned_draft_tokens", 0) if eagle2 else 0
    return DecodeConfig(method="eagle2" if eagle2 else method, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                        total_tokens=args.total_tokens, depth=args.depth, top_k=args.top_k, tree=tree,
                        lookup=lookup and eagle2, lookup_tokens=args.lookup_tokens,
                        min_prob=args.min_prob, expand_prob=args.expand_prob,
                        draft_tokens=draft_tokens)


def cmd_generate(args: argparse.Namespace) -> None:
    from .api import run
    from .loading import load

    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    auto = wants_tuning(args, [args.method])
    # settings are checked before the model loads (with auto, against the default size until tuned)
    cfg = config_from(argparse.Namespace(**{**vars(args), "total_tokens": DecodeConfig.total_tokens}) if auto
                      else args, args.method)
    bundle = load(args.model, args.head, args.device, args.kernels, args.draft_dtype)
    if auto:
        resolve_auto(args, bundle)
        cfg = config_from(args, args.method)
    res = run(bundle, args.prompt, cfg, raw=args.raw)
    if args.json:
        out = res.to_json()
        out.update(model=bundle.model_name, head=bundle.head_name, device=bundle.describe())
        steps = [r for r in res.records if r.nodes]
        if cfg.method in ("eagle2", "eagle1") and cfg.greedy and not cfg.lookup and not cfg.sized and steps:
            from .replay import size_curve

            # what a tree of 1, 2, ... N nodes would have accepted a step on this run's own steps (EAGLE-1: its
            # static tree cut breadth first)
            curve = size_curve(steps, max(len(r.verified) for r in steps), static=cfg.method == "eagle1")
            out["replayed_accept_length_by_nodes"] = [round(t, 4) for t in curve]
        print(json.dumps(out))
    else:
        print(res.text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="decode one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="eagle2", choices=("eagle2", "eagle1", "vanilla"))
    g.add_argument("--json", action="store_true", help="print one JSON object with the metrics")
    g.add_argument("--lookup", action="store_true",
                   help="EAGLE-2: add a prompt-lookup branch to each tree (verified on top of it)")
    _decode_args(g)
    g.set_defaults(func=cmd_generate)

    from . import bench
    bench.add_parser(sub, _decode_args)
    try:
        from .train import cli as train_cli
        train_cli.add_parser(sub)
    except ImportError:
        pass

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
