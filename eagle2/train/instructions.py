"""New training prompts written by the target itself (the "pre-query" trick of Magpie, arXiv 2406.08464).

An instruction-tuned model that reads only the start of its chat template's user turn writes a plausible
user request. The head then learns from the target's answers to prompts no file contains: every Alpaca
prompt already has several answers, and a head that has seen the same prompts many times fits them better
than it generalises. Prompts that share a long word sequence with an excluded file (the evaluation
prompts) are dropped, as are duplicates, fragments and requests cut off by the length cap.

Left alone, the model mostly asks for help ("Can you ...", "I'm planning ..."). `openers` start each request
with a word of the caller's choosing ("Write", "Solve", "Pretend"), round robin over a batch, so the requests
also cover writing, role play, maths and code; the model writes the rest.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from tqdm import tqdm

from .data import generate_responses

_MARK = "\u2063QUERY\u2063"


def pre_query_ids(tokenizer) -> list[int]:
    """The chat template's tokens up to where the user's text would begin."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False,
                                         add_generation_prompt=False)
    if _MARK not in text:
        raise ValueError("the chat template does not place the user's text verbatim; cannot build a pre-query")
    return tokenizer(text.split(_MARK)[0], add_special_tokens=False)["input_ids"]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The word n-grams of a text (lower case, punctuation ignored)."""
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


class PromptFilter:
    """Keeps new, whole, reasonably sized prompts that share no `n`-word sequence with the excluded texts."""

    def __init__(self, exclude: list[str], n: int = 6, min_words: int = 4, max_words: int = 200):
        self.n, self.min_words, self.max_words = n, min_words, max_words
        self.banned: set[tuple[str, ...]] = set().union(*(ngrams(t, n) for t in exclude)) if exclude else set()
        self.short_banned = {" ".join(_words(t)) for t in exclude}  # texts shorter than n words
        self.seen: set[str] = set()

    def accept(self, text: str) -> bool:
        """True (and remembered) when the prompt is kept."""
        words = _words(text)
        key = " ".join(words)
        if not (self.min_words <= len(words) <= self.max_words) or key in self.seen or key in self.short_banned:
            return False
        if ngrams(text, self.n) & self.banned:
            return False
        self.seen.add(key)
        return True


@torch.inference_mode()
def write_instructions(target, tokenizer, out: str | Path, count: int, exclude: list[str], temperature: float = 1.0,
                       max_tokens: int = 96, batch_size: int = 64, seed: int = 0,
                       openers: list[str] | None = None) -> int:
    """Append new prompts as jsonl rows {"prompt": ...} to `out` until it holds `count`; resumable.

    Returns how many rows the file holds. Each batch samples `batch_size` requests from the pre-query;
    those that end (EOS) within `max_tokens` and pass the filter are kept. With `openers`, row i of a batch
    begins with openers[i % len(openers)] ("" leaves a row to the model) and the model continues it.
    """
    out = Path(out)
    have = [json.loads(line)["prompt"] for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    keep = PromptFilter(exclude)
    for p in have:
        keep.accept(p)
    prefix = pre_query_ids(tokenizer)
    opener_ids = [tokenizer(o.strip(), add_special_tokens=False)["input_ids"] if o.strip() else []
                  for o in (openers or [""])]
    rows = [i % len(opener_ids) for i in range(batch_size)]
    bar = tqdm(total=count, initial=len(have), unit="prompt", desc="self-instruct")
    batch_no, misses = len(have), 0
    with out.open("a") as f:
        while len(have) < count:
            seqs = generate_responses(target, tokenizer, [prefix + opener_ids[r] for r in rows], max_tokens,
                                      temperature, seed=seed + 7919 * batch_no, context=1)
            batch_no += 1
            new = 0
            for r, s in zip(rows, seqs):
                body = s.tokens[s.start:].tolist()
                if len(body) >= max_tokens - 1:  # cut off by the cap (an ended request has its EOS dropped)
                    continue
                text = tokenizer.decode(opener_ids[r] + body, skip_special_tokens=True).strip()
                if keep.accept(text) and len(have) < count:
                    have.append(text)
                    f.write(json.dumps({"prompt": text}) + "\n")
                    new += 1
            f.flush()
            bar.update(new)
            misses = misses + 1 if new == 0 else 0
            if misses >= 20:
                raise RuntimeError(f"20 batches in a row gave no new prompt; {len(have)} of {count} written")
    bar.close()
    return len(have)
