"""`python -m eagle2 train eagle3`: prompts -> the target's answers -> an EAGLE-3 head, in one resumable command.

Stages, each kept in --out and skipped when a rerun finds it done: (1) `own.jsonl`, prompts the target writes
itself (Magpie's pre-query trick, `--self-prompts N`, evaluation prompts excluded); (2) `answers.safetensors`,
its greedy answers to those and to the --prompts files; (3) `ckpt/eagle3.pt`, training (training-time test,
eagle3.py); (4) `head/`, the head in the official EAGLE-3 layout with its draft-vocabulary order, report and
model card. `--minutes` bounds the whole run: each stage gets its share and stops with what it has, so the
same command fits a GPU's few minutes or a CPU's hours (rerun to continue: a finished schedule is not redone).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from . import eagle3
from .instructions import PromptFilter, pre_query_ids
from ..inputs import positive_arg


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@torch.inference_mode()
def self_prompts(target, tokenizer, count: int, exclude: list[str], openers: list[str], batch_size: int,
                 deadline: float, seed: int = 0, max_tokens: int = 96, temperature: float = 0.9) -> list[str]:
    """Up to `count` new requests written by the target (sampled from its chat template's user turn, each row
    started with an opener word round robin), whole, filtered and deduplicated; stops at the deadline."""
    keep, out, dev = PromptFilter(exclude), [], target.device
    prefix = pre_query_ids(tokenizer)
    opener_ids = [tokenizer(o, add_special_tokens=False)["input_ids"] if o else [] for o in openers or [""]]
    eos = target.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    torch.manual_seed(seed)
    rounds = 0
    while len(out) < count and time.time() < deadline:
        rows = [prefix + opener_ids[(rounds * batch_size + i) % len(opener_ids)] for i in range(batch_size)]
        ids, mask = eagle3.left_padded(rows, pad)
        gen = target.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_tokens,
                              do_sample=True, temperature=temperature, top_p=1.0, top_k=0, pad_token_id=pad)
        for r, g in zip(rows, gen[:, ids.shape[1]:].tolist()):
            end = next((j for j, t in enumerate(g) if t in stops), None)
            if end is None:
                continue  # cut off by the cap
            text = tokenizer.decode(r[len(prefix):] + g[:end], skip_special_tokens=True).strip()
            if keep.accept(text) and len(out) < count:
                out.append(text)
        rounds += 1
        log(f"self-prompts: {len(out)}/{count} after {rounds} batches")
    return out


def references(tok, files: list[str], max_prompt_tokens: int, eos: int, context: int = 64) -> eagle3.Answers:
    """The prompt files' reference answers (Alpaca's `output`) after their prompts, ended by EOS: text the
    target reads teacher-forced (its own next-token distributions are still the labels)."""
    from ..decode.engine import encode_prompt
    from ..tools.prompts import read_rows

    out = eagle3.Answers([], [])
    for f in files:
        for row in read_rows(f):
            if not row.reference:
                continue
            ids = encode_prompt(tok, row.prompt)
            if len(ids) <= max_prompt_tokens:
                c = min(len(ids), context)
                out.tokens.append(torch.tensor(ids[-c:] + tok(row.reference, add_special_tokens=False)["input_ids"]
                                               + [eos]))
                out.starts.append(c)
    log(f"references: {len(out.tokens)} answers from the prompt files, train only")
    return out


def check(args: argparse.Namespace) -> None:
    """Refuse a run with nothing to answer (`train eagle3` calls it before the target loads)."""
    if not args.prompts and not args.self_prompts and not (Path(args.out) / eagle3.ANSWERS).exists():
        raise ValueError("nothing to answer: give --prompts FILES, --self-prompts N, or both")


def run(args: argparse.Namespace, target, tok) -> dict:
    from ..decode.engine import encode_prompt
    from ..heads.eagle3 import save
    from ..tools.prompts import read_prompts
    from .card import hardware, write_card3

    t0 = time.time()
    end = t0 + args.minutes * 60
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    autocast = target.device.type == "cuda" or (args.autocast and target.device.type == "cpu")

    own = out / "own.jsonl"
    if args.self_prompts and not own.exists():
        exclude = [p for f in args.exclude for p in read_prompts(f)]
        texts = self_prompts(target, tok, args.self_prompts, exclude, args.openers, args.batch_size,
                             t0 + args.minutes * 60 * 0.12, args.seed)
        own.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    answers_path = out / eagle3.ANSWERS
    data = eagle3.Answers.load(answers_path) if answers_path.exists() else None
    if data is None or not data.tokens:  # none yet (an empty file, from before this check, counts as none)
        texts = [p for f in args.prompts for p in read_prompts(f)] + (read_prompts(own) if own.exists() else [])
        prompts = [ids for ids in (encode_prompt(tok, t) for t in texts) if len(ids) <= args.max_prompt_tokens]
        partial = out / "answers.partial.safetensors"  # progress of an interrupted stage, continued
        done = eagle3.Answers.load(partial) if partial.exists() else None
        log(f"answers: {len(prompts)} prompts" + (f", {len(done.tokens)} answered before" if done else ""))
        data = eagle3.write_answers(target, tok, prompts, args.max_new_tokens, args.batch_size,
                                    t0 + args.minutes * 60 * 0.5, log=log, done=done, save=lambda a: a.save(partial))
        if not data.tokens:
            raise ValueError(f"no answers were written ({len(prompts)} prompts within their "
                             f"{args.max_prompt_tokens}-token limit): give more --minutes or more prompts")
        data.save(answers_path)
        partial.unlink(missing_ok=True)
    eos = target.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    refs = references(tok, args.prompts, args.max_prompt_tokens, min(stops)) if args.references else None
    order = eagle3.vocabulary(data, args.vocab, stops)
    cfg = eagle3.Fit3Config(steps=args.steps, lr=args.lr, epochs=args.epochs, batch_tokens=args.batch_tokens,
                            seed=args.seed)
    head, report = eagle3.fit(target, data, order, out / "ckpt", cfg, deadline=end - args.reserve * 60,
                              autocast=autocast, log=log, extra=refs)
    head.set_vocab_order(order.to(head.d2t.device))
    dest = out / "head"
    save(head.cpu(), dest, target.config)
    from safetensors.torch import save_file
    save_file({"token_ids": order.to(torch.int64).contiguous()}, str(dest / "draft_vocab.safetensors"))
    spent = out / "minutes.json"  # wall time of the earlier invocations that got here: a resumed run adds up
    before = json.loads(spent.read_text())["minutes"] if spent.exists() else 0.0
    minutes = before + (time.time() - t0) / 60
    spent.write_text(json.dumps({"minutes": minutes}))
    report.update(prompts=len(data.tokens), own_prompts=sum(1 for _ in own.open()) if own.exists() else 0,
                  minutes=round(minutes, 1), hardware=hardware(), vocab=args.vocab,
                  max_new_tokens=args.max_new_tokens, feature_layers=list(head.feature_layers))
    (dest / "report.json").write_text(json.dumps(report, indent=2))
    write_card3(dest, report)
    log(f"head saved to {dest}: held-out {report['heldout']}")
    return report


def add_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--prompts", nargs="*", default=[], help="prompt files (json/jsonl) the target answers")
    q.add_argument("--self-prompts", type=int, default=0, help="also have the target write this many prompts")
    q.add_argument("--exclude", nargs="*", default=["assets/bench/mt_bench.jsonl"],
                   help="prompt files whose 6-word sequences a written prompt may not share (the evaluation's)")
    q.add_argument("--openers", nargs="*", default=[
        "", "Write", "Explain", "Solve", "Translate", "Summarize", "Describe", "Compare", "Given", "Create",
        "Rewrite", "Calculate", "Imagine", "What", "How", "List", "Answer", "Extract", "Implement", "Classify"],
        help="words written prompts start with, round robin ('' leaves a row to the model)")
    q.add_argument("--out", required=True, help="working directory (outside git): data, checkpoint, head/")
    q.add_argument("--minutes", type=positive_arg, default=60.0, help="the whole run's wall-time budget")
    q.add_argument("--reserve", type=float, default=0.5, help="minutes kept for evaluation and export")
    q.add_argument("--max-new-tokens", type=int, default=160)
    q.add_argument("--max-prompt-tokens", type=int, default=384)
    q.add_argument("--batch-size", type=int, default=64, help="prompts per generate batch")
    q.add_argument("--vocab", type=int, default=16384, help="draft vocabulary size")
    q.add_argument("--steps", type=int, default=7, help="unrolled draft steps in training")
    q.add_argument("--lr", type=float, default=5e-4)
    q.add_argument("--epochs", type=float, default=2.0)
    q.add_argument("--batch-tokens", type=int, default=8192)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--references", action="store_true",
                   help="also train on the prompt files' reference answers (Alpaca `output`), read teacher-forced; "
                        "none held out")
    q.add_argument("--autocast", action="store_true",
                   help="bf16 autocast on a CPU (pays with AVX512-BF16/AMX; always on with CUDA)")
