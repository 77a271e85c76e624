"""Command-line pieces shared by `generate` and `bench`: the decoding flags, the shared settings they make, and
`--total-tokens auto` (each method tuned for itself)."""
from __future__ import annotations

import argparse
import sys

from ..config import DecodeConfig
from ..decode.methods import OURS, Shared, check_methods, config_for, static_tree, tunable


def _size(text: str) -> int | str:
    """--total-tokens: a whole number or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', not {text!r}") from None


def shared_from(args: argparse.Namespace) -> Shared:
    """The settings every method shares, from the command line."""
    return Shared(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                  total_tokens=DecodeConfig.total_tokens if args.total_tokens == "auto" else args.total_tokens,
                  depth=args.depth, top_k=args.top_k, tree=args.tree, lookup_tokens=args.lookup_tokens,
                  min_prob=args.min_prob, expand_prob=args.expand_prob, draft_tokens=args.draft_tokens or 0,
                  chain_tokens=args.chain_tokens, p_min=args.p_min)


def prepare(args: argparse.Namespace, methods: list[str]) -> tuple[Shared, bool]:
    """Check the settings for `methods` before anything loads; (shared settings, whether to tune)."""
    shared = shared_from(args)
    check_methods(methods, shared)
    auto = args.total_tokens == "auto" and bool(tunable(methods, args.tree is not None))
    if args.total_tokens == "auto" and (args.min_prob is not None or args.expand_prob is not None):
        raise ValueError("--total-tokens auto chooses eagle2_sized's --min-prob and --expand-prob itself: leave "
                         "them out, or give --total-tokens a number")
    if args.tree is not None:
        static_tree(args.tree, shared.total_tokens)  # a bad tree fails even where EAGLE-1 does not run
    for m in methods:
        if m in OURS:
            config_for(m, shared)  # a bad setting fails here, not after the model has loaded
    return shared, auto


def tune_shared(args: argparse.Namespace, bundle, methods: list[str], shared: Shared) -> tuple[Shared, dict]:
    """--total-tokens auto: tune each method for itself on this machine; returns the settings and a summary: every
    option per method, and under "near_ties" the options each method's choice was within the tuner's margin of
    (a second run may choose one of those)."""
    from .autotune import describe, near_ties, tune_for

    if args.temperature != 0.0:
        print(f"note: --total-tokens auto sizes the trees by replaying greedy decoding (its accept lengths); with "
              f"--temperature {args.temperature:g} a step accepts differently, so the chosen sizes are a greedy "
              "machine's best, not necessarily sampling's", file=sys.stderr)
    tuning, shared = tune_for(bundle, methods, shared, progress=lambda m: print(m, file=sys.stderr),
                              draft_tokens=args.draft_tokens)
    print(describe(tuning), file=sys.stderr)
    ties = {m: near_ties(tuning, m) for m in tuning.chosen}
    return shared, {**{m: [o.to_dict() for o in opts] for m, opts in tuning.options.items()}, "near_ties": ties}


def decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-tokens", type=_size, default=DecodeConfig.total_tokens,
                   help="verified nodes per step, root included, for EAGLE-2 and (its tree cut breadth first to it) "
                        "EAGLE-1; or 'auto': tune each method for itself by timing this machine")
    p.add_argument("--depth", type=int, default=DecodeConfig.depth)
    p.add_argument("--top-k", type=int, default=DecodeConfig.top_k)
    p.add_argument("--min-prob", type=float, default=None,
                   help="eagle2_sized: keep only nodes whose cumulative draft probability is at least this "
                        "(default 0.12; --total-tokens stays the cap)")
    p.add_argument("--expand-prob", type=float, default=None,
                   help="eagle2_sized: draft children only of nodes at least this probable (default 0.48)")
    p.add_argument("--draft-tokens", type=int, default=None,
                   help="score only the first N tokens of the head's draft vocabulary (most frequent first; 0: all): "
                        "a cheaper draft level, fewer tokens the draft can propose; the output is the same. "
                        "Default: all, except that --total-tokens auto chooses between all and 8192 (for every "
                        "tree method alike)")
    p.add_argument("--lookup-tokens", type=int, default=DecodeConfig.lookup_tokens,
                   help="longest prompt-lookup branch (methods eagle2_lookup, eagle2_sized_lookup)")
    p.add_argument("--chain-tokens", type=int, default=3,
                   help="method chain: tokens drafted a step, the draft's top-1 each (vLLM's num_speculative_tokens)")
    p.add_argument("--p-min", type=float, default=0.0,
                   help="method chain: stop drafting before a token the draft gives less than this probability "
                        "(llama.cpp's --spec-draft-p-min; 0: never)")
    p.add_argument("--engine-flags", default=None, metavar="TEXT",
                   help="run what a serving engine's settings describe, pasted as that engine takes them: SGLang's "
                        "--speculative-* flags, vLLM's speculative_config JSON, TensorRT-LLM's EagleDecodingConfig "
                        "fields, OpenVINO GenAI's num_assistant_tokens/branching_factor/tree_depth or llama.cpp's "
                        "--spec-draft-n-max/--spec-draft-p-min")
    p.add_argument("--tree", default=None,
                   help="EAGLE-1's tree: a preset name or JSON list of paths (default: mc_sim_7b_63 cut breadth "
                        "first to --total-tokens)")
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
    """One method's settings from the command line (tests and scripts)."""
    return config_for(method, shared_from(args))


