"""Batches for head training: held-out split, prompt-context trimming, length-bucketed padded batches, masks.

A collated batch lines up, at each position i, the head's input (x_{i+1}, f_i), its target f_{i+1} and the
target's greedy token after f_{i+1}; the loss covers positions whose target feature lies in the response.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from .data import GREEDY, Sequence, load_sequences, read_manifest


def held_out_positions(kinds: list[int], every: int) -> list[int]:
    """Positions (in stored order) of the held-out sequences: every n-th one, if it is a greedy response."""
    return [i for i, k in enumerate(kinds) if k == GREEDY and i % every == 0]


def split(seqs: list[Sequence], every: int) -> tuple[list[Sequence], list[Sequence]]:
    """(train, held-out): every n-th greedy response is held out, stable as more shards arrive."""
    held = set(held_out_positions([s.kind for s in seqs], every))
    return [s for i, s in enumerate(seqs) if i not in held], [seqs[i] for i in sorted(held)]


def heldout_rows(data_dir: str | Path, every: int) -> list[int]:
    """The prompt-file rows behind `split`'s held-out sequences of one data directory, from its manifest (the
    stored order is sorted by prompt length within each shard, so it is not the file's order)."""
    shards = read_manifest(data_dir)["shards"]
    if not shards or any("rows" not in shards[n] for n in shards):
        raise ValueError(f"{data_dir}: its manifest does not list the rows behind its sequences "
                         "(written before they were recorded); the held-out prompts cannot be found from it")
    rows = [r for name in sorted(shards) for r in shards[name]["rows"]]
    kinds = [k for name in sorted(shards) for k in shards[name]["kinds"]]
    return [rows[i] for i in held_out_positions(kinds, every)]


def load_split(data_dirs: str | Path | list, every: int,
               train_only: list | None = None) -> tuple[list[Sequence], list[Sequence]]:
    """Train and held-out sequences of data directories (each split on its own); `train_only` ones hold none out."""
    dirs = [data_dirs] if isinstance(data_dirs, (str, Path)) else list(data_dirs)
    train_set, held = [s for d in train_only or [] for s in load_sequences(d)], []
    for d in dirs:
        t, h = split(load_sequences(d), every)
        train_set += t
        held += h
    return without_prompts_of(train_set, held), held


def _prompt_key(s: Sequence) -> bytes:
    return s.tokens[:s.start].numpy().tobytes()


def without_prompts_of(train_set: list[Sequence], held: list[Sequence]) -> list[Sequence]:
    """Training sequences whose prompt is not one of the held-out prompts: another response to a held-out prompt
    (a sampled one, say, stored in another directory) would otherwise leak it into training."""
    banned = {_prompt_key(s) for s in held}
    return [s for s in train_set if _prompt_key(s) not in banned]


def trim(s: Sequence, context: int) -> Sequence:
    """Keep at most `context` prompt tokens before the response."""
    cut = max(0, s.start - context)
    return Sequence(tokens=s.tokens[cut:], features=s.features[cut:], start=s.start - cut, kind=s.kind,
                    argmax=s.next_argmax()[cut:])


def make_batches(seqs: list[Sequence], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length so that padding stays small; batch order shuffled."""
    return by_length([len(s.tokens) for s in seqs], batch_tokens, rng)


def by_length(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices into `lengths` in batches of similar length, at most `batch_tokens` padded tokens each (a longer
    item alone); batch order shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, cur, width = [], [], 0
    for i in order:
        w = max(width, lengths[i])
        if cur and w * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, w = [], lengths[i]
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(seqs: list[Sequence], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Pad to one width: head inputs, feature targets, labels and the loss mask (B, T-1)."""
    width = max(len(s.tokens) for s in seqs)
    b, h = len(seqs), seqs[0].features.shape[-1]
    tokens = torch.zeros(b, width, dtype=torch.long)
    feats = torch.zeros(b, width, h, dtype=torch.float32)
    valid = torch.zeros(b, width, dtype=torch.bool)
    train_pos = torch.zeros(b, width - 1, dtype=torch.bool)
    labels = torch.full((b, width - 1), -100, dtype=torch.long)
    for j, s in enumerate(seqs):
        n = len(s.tokens)
        tokens[j, :n], feats[j, :n], valid[j, :n] = s.tokens, s.features.float(), True
        train_pos[j, max(s.start - 1, 0): n - 1] = True  # predicted feature f_{i+1} lies in the response
        labels[j, : n - 1] = s.next_argmax()[1:]  # the target's greedy token after f_{i+1}
    labels[(labels < 0) | ~train_pos] = -100
    out = {"in_tokens": tokens[:, 1:], "in_feats": feats[:, :-1], "target": feats[:, 1:],
            "key_valid": valid[:, 1:], "train_pos": train_pos, "labels": labels}
    return {k: v.to(device) for k, v in out.items()}


def causal_mask(key_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive (B, 1, T, T) mask: causal and no padded keys (0 keep, finfo.min block)."""
    t = key_valid.shape[1]
    dev = key_valid.device
    keep = torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None] & key_valid[:, None, :]
    keep |= torch.eye(t, dtype=torch.bool, device=dev)[None]  # padded queries see themselves: no empty rows
    return torch.zeros(keep.shape, dtype=dtype, device=dev).masked_fill(~keep, torch.finfo(dtype).min)[:, None]
