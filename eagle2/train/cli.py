"""Command line for draft-head training: `train instructions`, `generate`, `fit`, `evaluate`, `export`, and
`eagle3` (an EAGLE-3 head end to end, eagle3_pipeline.py).

    python -m eagle2 train instructions --count 2000 --exclude assets/bench/mt_bench.jsonl --out data/own_prompts.jsonl
    python -m eagle2 train generate --prompts data/own_prompts.jsonl --out data/selfdistill
    python -m eagle2 train fit --data data/selfdistill --out data/ckpt --epochs 2
    python -m eagle2 train evaluate --data data/selfdistill --ckpt data/ckpt
    python -m eagle2 train heldout --data data/selfdistill --out heldout_rows.json   # regenerate with --rows
    python -m eagle2 train export --data data/selfdistill --ckpt data/ckpt --save-head assets/smollm2-135m-eagle
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields
from pathlib import Path

import torch

from ..inputs import positive_arg, whole_arg


def _load_target(args: argparse.Namespace):
    """The frozen target and tokenizer on the chosen device, with the thread count applied."""
    from ..loading import load_target, pick_device

    torch.set_num_threads(args.threads)
    device, dtype = pick_device(args.device)
    dtype = _generation_dtype(getattr(args, "dtype", "auto"), device, dtype)
    target, tok = load_target(args.model, device, dtype)
    for p in target.parameters():
        p.requires_grad_(False)
    return target, tok


def _generation_dtype(choice: str, device: torch.device, default: torch.dtype) -> torch.dtype:
    """The target's dtype for writing data: the device's default, or bfloat16 when asked for. On a CPU that
    multiplies bf16 in hardware (AVX512-BF16/AMX) a bf16 target generates about 3x faster than float32; its
    answers and features differ from the float32 target's only by rounding, which the head's training absorbs
    (inference still verifies with the float32 target, so outputs never change)."""
    if choice == "auto":
        return default
    if choice == "bfloat16" and device.type == "cpu":
        from ..cpu.onednn import native_bf16
        if not native_bf16():
            raise SystemExit("error: --dtype bfloat16 on this CPU would be emulated and slower; leave it out")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[choice]


def cmd_generate(args: argparse.Namespace) -> None:
    """Self-distil: the target answers the prompts; its tokens and features go to shards."""
    from ..tools.prompts import read_rows
    from .data import GenConfig, generate_dataset, measure_throughput

    rows = [(r.prompt, r.reference) for r in read_rows(args.prompts)]
    if args.rows:
        if args.skip or args.limit:
            raise SystemExit("error: --rows picks the prompts itself; leave out --skip and --limit")
        row_ids = _read_row_list(args.rows, len(rows))
    else:
        row_ids = list(range(len(rows)))[args.skip:][: args.limit or None]
    rows = [rows[i] for i in row_ids]
    target, tok = _load_target(args)
    if args.probe:
        sizes = [int(b) for b in args.probe.split(",")]
        rates = measure_throughput(target, tok, [p for p, _ in rows], sizes)
        print(json.dumps({"tokens_per_s": rates}))
        return
    cfg = GenConfig(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, shard_prompts=args.shard_prompts,
                    sample_every=args.sample_every, temperature=args.temperature, context=args.context,
                    teacher=args.teacher, seed=args.seed)
    manifest = generate_dataset(target, tok, rows, args.out, cfg, source={"prompts": str(args.prompts)},
                                row_ids=row_ids)
    total = sum(v["response_tokens"] for v in manifest["shards"].values())
    print(f"{len(manifest['shards'])} shards, {total} response tokens in {args.out}")


def _read_row_list(path: str, n_rows: int) -> list[int]:
    """Row numbers from a JSON file: a list, or an object with `rows` (what `train heldout` writes)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"error: --rows {path}: {e}") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, int) and 0 <= r < n_rows for r in rows):
        raise SystemExit(f"error: --rows {path}: expected a list of row numbers in 0..{n_rows - 1} "
                         "(or an object with one under 'rows')")
    return rows


def _check_data(args: argparse.Namespace) -> None:
    """Refuse, before the target loads or a folder is made, data directories that `generate` did not write."""
    dirs = [("--data", d) for d in args.data] + [("--train-only", d) for d in getattr(args, "train_only", None) or []]
    for flag, d in dirs:
        if not (Path(d) / "manifest.json").is_file():
            what = "does not exist" if not Path(d).exists() else "holds no manifest.json"
            raise ValueError(f"{flag} {d} {what}: give a directory written by "
                             "`python -m eagle2 train generate --out DIR`")
    for flag in ("init", "ckpt"):
        path = getattr(args, flag, None)
        if path and not Path(path).exists():
            raise ValueError(f"--{flag} {path} does not exist")


def cmd_heldout(args: argparse.Namespace) -> None:
    """Write the prompt-file rows behind the held-out sequences of --data, for `generate --rows`."""
    _check_data(args)
    from .batches import heldout_rows
    from .data import read_manifest

    try:
        rows = [r for d in args.data for r in heldout_rows(d, args.heldout_every)]
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    sources = {read_manifest(d).get("source", {}).get("prompts") for d in args.data}
    if len(sources) != 1 or None in sources:
        raise SystemExit("error: the directories were generated from different (or unrecorded) prompt files; "
                         "run `train heldout` on each one")
    Path(args.out).write_text(json.dumps({"prompts": sources.pop(), "heldout_every": args.heldout_every,
                                          "rows": rows}) + "\n")
    print(f"{len(rows)} held-out rows written to {args.out}")


def cmd_instructions(args: argparse.Namespace) -> None:
    """The target writes new user prompts (jsonl) that share no long word sequence with --exclude files."""
    from ..tools.prompts import read_prompts
    from .instructions import write_instructions

    target, tok = _load_target(args)
    exclude = [p for f in args.exclude for p in read_prompts(f)]
    n = write_instructions(target, tok, args.out, args.count, exclude, temperature=args.temperature,
                           max_tokens=args.max_tokens, batch_size=args.batch_size, seed=args.seed,
                           openers=args.openers)
    print(f"{n} prompts in {args.out}")


def _train_config(args: argparse.Namespace):
    """A TrainConfig from the flags that were given (the rest keep their defaults)."""
    from .eagle import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in names and v is not None})


def cmd_fit(args: argparse.Namespace) -> None:
    """Train (or resume training) a head on the shards in --data; checkpoints go to --out."""
    _check_data(args)
    from .eagle import train

    target, _ = _load_target(args)
    report = train(target, args.data, args.out, _train_config(args), init=args.init, train_only=args.train_only)
    print(json.dumps(report, indent=1))
    if args.save_head:
        _export(target, args.out, args.data + (args.train_only or []), args.save_head, report)
        _draft_vocab(args, args.save_head)


def cmd_evaluate(args: argparse.Namespace) -> None:
    """Depth-1 top-k agreement of the latest checkpoint's head with the target on the held-out split."""
    _check_data(args)
    from .eagle import evaluate_checkpoint

    target, _ = _load_target(args)
    print(json.dumps(evaluate_checkpoint(target, args.data, args.ckpt, _train_config(args)), indent=1))


def cmd_export(args: argparse.Namespace) -> None:
    """Write the latest checkpoint's head in the official layout with a model card."""
    _check_data(args)
    from .eagle import evaluate_checkpoint

    target, _ = _load_target(args)
    report = evaluate_checkpoint(target, args.data, args.ckpt, _train_config(args))
    _export(target, args.ckpt, args.data + (args.train_only or []), args.save_head, report)
    _draft_vocab(args, args.save_head)


def _draft_vocab(args: argparse.Namespace, out: str) -> None:
    """With --draft-vocab N: the N tokens the target chooses most often in the training data, saved beside
    the head, so the draft scores only those (lossless: the target still verifies over the full vocabulary)."""
    if not args.draft_vocab:
        return
    from ..heads.eagle import save_draft_vocab
    from .batches import load_split
    from .eagle import data_vocab, target_choices

    train_set, _ = load_split(args.data, _train_config(args).heldout_every, args.train_only)
    labels = target_choices(train_set)
    ids = data_vocab(train_set, args.draft_vocab)
    covered = float(torch.isin(labels[labels >= 0], ids).float().mean())
    save_draft_vocab(ids, out)
    print(f"draft vocabulary: {len(ids)} tokens covering {covered:.4f} of the target's choices in the data")


def _export(target, ckpt_dir: str, data_dir: str | list, out: str, report: dict) -> None:
    """Save the newest checkpoint's head (fp16, official layout) and its model card."""
    from ..heads.eagle import save_head
    from .card import write_card
    from .checkpoint import load_latest_head

    head, state = load_latest_head(target, ckpt_dir)
    save_head(head, out, dtype=torch.float16)
    write_card(Path(out), data_dir, state, report)
    print(f"head saved to {out}")


def cmd_eagle3(args: argparse.Namespace) -> None:
    """Train an EAGLE-3 head end to end (eagle3_pipeline.py)."""
    from .eagle3_pipeline import check, run

    check(args)
    if args.device != "cpu" and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
    target, tok = _load_target(args)
    run(args, target, tok)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `train` and its sub-commands on a parent parser's subparsers."""
    p = subparsers.add_parser("train", help="self-distillation data and draft-head training")
    sub = p.add_subparsers(dest="train_cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default="embedded", help="target: 'embedded', a hub id or a local directory")
    common.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    common.add_argument("--threads", type=int, default=1,
                        help="CPU threads (1 is fastest when other processes share the cores)")
    writing = argparse.ArgumentParser(add_help=False)  # the commands where the target writes text
    writing.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                         help="the target's dtype while it writes (auto: the device's; bfloat16 is ~3x faster on "
                              "CPUs with AVX512-BF16/AMX)")

    g = sub.add_parser("generate", parents=[common, writing], help="generate self-distillation shards")
    g.add_argument("--prompts", required=True, help="json/jsonl prompts (instruction+input, turns or prompt)")
    g.add_argument("--out", required=True, help="output directory (outside git)")
    g.add_argument("--limit", type=whole_arg(1), default=None, help="the first N prompts (default: all)")
    g.add_argument("--skip", type=int, default=0, help="skip the first N prompts of the file")
    g.add_argument("--teacher", action="store_true",
                   help="use the file's reference answers (Alpaca `output`) instead of generating")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--batch-size", type=int, default=128)
    g.add_argument("--shard-prompts", type=int, default=128)
    g.add_argument("--sample-every", type=int, default=0, help="every n-th prompt sampled (0: greedy only)")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--context", type=int, default=64, help="prompt tokens kept before each response")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--probe", default="", help="comma-separated batch sizes: measure throughput and exit")
    g.add_argument("--rows", default=None,
                   help="JSON list of the prompt file's row numbers to answer (e.g. from `train heldout`)")
    g.set_defaults(func=cmd_generate)

    h = sub.add_parser("heldout", help="list the prompt-file rows behind held-out sequences (for generate --rows)")
    h.add_argument("--data", required=True, nargs="+", help="directories of shards from `generate`")
    h.add_argument("--heldout-every", type=int, default=25, help="as given to fit (default 25)")
    h.add_argument("--out", required=True, help="JSON file to write")
    h.set_defaults(func=cmd_heldout)

    s = sub.add_parser("instructions", parents=[common, writing],
                       help="the target writes new prompts (Magpie's pre-query trick) for `generate`")
    s.add_argument("--out", required=True, help="jsonl file to append to (outside git; a rerun resumes)")
    s.add_argument("--count", type=whole_arg(1), required=True, help="how many prompts the file should hold")
    s.add_argument("--exclude", nargs="*", default=[],
                   help="prompt files (e.g. the evaluation prompts) whose 6-word sequences a new prompt may not share")
    s.add_argument("--temperature", type=float, default=0.9)
    s.add_argument("--max-tokens", type=int, default=96, help="longer requests are dropped as cut off")
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--openers", nargs="*", default=None,
                   help="words each request starts with, round robin (e.g. Write Solve Pretend; '' leaves a row "
                        "to the model); without it the model starts every request itself")
    s.set_defaults(func=cmd_instructions)

    from .eagle3_pipeline import add_arguments as eagle3_arguments
    e = sub.add_parser("eagle3", parents=[common, writing], help="an EAGLE-3 head: prompts -> the target's answers -> training "
                       "(training-time test) -> the head, resumable, within --minutes")
    eagle3_arguments(e)
    e.set_defaults(func=cmd_eagle3)

    for name, fn, helptext in (("fit", cmd_fit, "train the head"), ("evaluate", cmd_evaluate, "held-out agreement"),
                               ("export", cmd_export, "save the head in the official layout")):
        q = sub.add_parser(name, parents=[common], help=helptext)
        q.add_argument("--data", required=True, nargs="+", help="directories of shards from `generate`")
        q.add_argument("--out" if name == "fit" else "--ckpt", required=True,
                       help="checkpoint directory" + ("" if name == "fit" else " (evaluate: or an exported head)"))
        q.add_argument("--save-head", default=None, required=name == "export",
                       help="directory to save the head in (the official layout, with a model card)")
        q.add_argument("--epochs", type=float, default=None)
        q.add_argument("--lr", type=float, default=None)
        q.add_argument("--batch-tokens", type=int, default=None)
        q.add_argument("--noise", type=float, default=None, help="uniform noise half-width on input features")
        q.add_argument("--ce-weight", type=float, default=None)
        q.add_argument("--ce-vocab", default=None, choices=("full", "data"),
                       help="cross-entropy over the full vocabulary or the target's most frequent tokens in the data")
        q.add_argument("--save-every", type=int, default=None)
        q.add_argument("--max-minutes", type=float, default=None, help="stop (and checkpoint) after this long")
        q.add_argument("--budget-minutes", type=float, default=None,
                       help="fit the lr schedule into this wall time (sized after 30 steps)")
        q.add_argument("--seed", type=int, default=None)
        q.add_argument("--heldout-every", type=int, default=None,
                       help="every n-th greedy sequence of each --data directory is held out (default 25)")
        q.add_argument("--ce-target", default=None, choices=("hard", "soft"))
        q.add_argument("--ce-temperature", type=positive_arg, default=None,
                       help="soft labels: temperature of the target's distribution (below 1 leans to its greedy token)")
        q.add_argument("--context", type=int, default=None, help="prompt tokens kept before each response")
        q.add_argument("--autocast", action="store_true", default=None, help="bf16 autocast")
        q.add_argument("--unroll", type=int, default=None, choices=(1, 2, 3),
                       help="d > 1: also train draft depths 2..d on the head's own features")
        q.add_argument("--unroll-weight", type=float, default=None)
        q.add_argument("--ce-vocab-size", type=int, default=None)
        q.add_argument("--train-only", nargs="*", default=None, help="more shard directories, none held out")
        q.add_argument("--draft-vocab", type=int, default=0,
                       help="with the saved head, also save the N most frequent target tokens as its draft vocabulary")
        if name == "fit":
            q.add_argument("--init", default=None,
                           help="start from this checkpoint file (step_N.pt) or exported head directory")
        q.set_defaults(func=fn)
    return p


def main(args: argparse.Namespace) -> None:
    """Run the chosen `train` sub-command."""
    t0 = time.time()
    args.func(args)
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m eagle2.train.cli")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    main(parser.parse_args())
