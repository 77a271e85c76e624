"""Command line: `python -m eagle2 generate | bench | diagnose | train`."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from .config import DecodeConfig
from .tools.cli_common import decode_args, prepare, tune_shared
from .decode.methods import OURS, budget_note, config_for, settings_of
from .policies import policy


def cmd_generate(args: argparse.Namespace) -> None:
    from .api import run
    from .loading import load

    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    engine = None
    if args.engine_flags is not None:  # the engine's tree replaces --method and any size given or tuned
        from .tools.engines import parse_engine_flags

        engine = parse_engine_flags(args.engine_flags)
        args.method, args.total_tokens = engine.policy, DecodeConfig.total_tokens
        print(f"{engine.terms}: runs {engine.policy}" + (f" (this project's reading: {engine.reading})"
                                                         if engine.reading else ""), file=sys.stderr)
    shared, auto = prepare(args, [args.method])
    if engine is not None:
        shared = replace(shared, **engine.settings)
    note = None if auto else budget_note(shared, [args.method])
    bundle = load(args.model, args.head, args.device, args.kernels, args.draft_dtype)
    tuned = None
    if auto:
        shared, tuned = tune_shared(args, bundle, [args.method], shared)
        note = budget_note(shared, [args.method])
    if note:
        print(note, file=sys.stderr)
    cfg = config_for(args.method, shared)
    if args.json:  # it reports a speed: warm up first, as the bench does, so first-use costs stay out of it
        run(bundle, args.prompt, replace(cfg, max_new_tokens=min(8, cfg.max_new_tokens)), raw=args.raw)
    res = run(bundle, args.prompt, cfg, raw=args.raw)
    if args.json:
        out = res.to_json()
        out.update(model=bundle.model_name, head=bundle.head_name, head_kind=bundle.head_kind, device=bundle.describe(),
                   settings=settings_of(cfg))
        if engine is not None:
            out["engine"] = engine.to_dict()
        if tuned:
            out["tuned"] = tuned
        steps = [r for r in res.records if r.nodes]
        if policy(cfg.name).paper and cfg.greedy and steps:
            from .tools.replay import size_curve

            # what a tree of 1, 2, ... N nodes would have accepted a step on this run's own steps (EAGLE-1: its
            # static tree cut breadth first)
            curve = size_curve(steps, max(len(r.verified) for r in steps), static=policy(cfg.name).static)
            out["replayed_accept_length_by_nodes"] = [round(t, 4) for t in curve]
        print(json.dumps(out))
    else:
        print(res.text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="decode one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="eagle2", choices=OURS,
                   help="eagle2: the paper's EAGLE-2; eagle2_sized / eagle2_lookup / eagle2_sized_lookup: with this "
                        "project's confidence sizing and/or prompt-lookup branch; eagle1: static tree; vanilla")
    g.add_argument("--json", action="store_true", help="print one JSON object with the metrics")
    decode_args(g)
    g.set_defaults(func=cmd_generate)

    from .tools import bench
    bench.add_parser(sub, decode_args)
    from .tools import diagnose
    diagnose.add_parser(sub)
    try:
        from .train import cli as train_cli
    except ImportError as e:  # a broken training import: say so when `train` is asked for, keep the rest working
        broken = sub.add_parser("train", help=f"unavailable here: {e}")
        broken.add_argument("rest", nargs=argparse.REMAINDER)
        broken.set_defaults(func=lambda args, why=f"{e}": _unavailable("train", why))
    else:
        train_cli.add_parser(sub)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError, RuntimeError) as e:  # bad input, a missing or unreadable file, a failed load
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _unavailable(command: str, why: str) -> None:
    raise RuntimeError(f"`python -m eagle2 {command}` is unavailable: one of its modules failed to import ({why})")


if __name__ == "__main__":
    sys.exit(main())
