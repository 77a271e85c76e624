"""Acceptance: which drafted path the target keeps, and its bonus token.

Greedy: follow the child whose token equals the target's argmax at its parent; stop at the first miss.
Sampling: at each accepted node, try its children in the draft's rank order against the target's
residual distribution (accept x with probability r(x); on rejection zero r(x) and renormalise); when
every child fails, or at a leaf, sample the bonus from the residual. Drafting is deterministic (top-k),
so this is speculative sampling with a point-mass proposal: the output is distributed exactly as p.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .records import ACCEPTED, REJECTED, UNREACHED


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(N, V) logits -> the target's sampling distribution per row (temperature, then nucleus)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@dataclass(frozen=True)
class Decision:
    accepted: list[int]         # tree indices on the accepted path, root excluded
    bonus: int                  # token the target adds after the last accepted node
    verdicts: list[str | None]  # per tree index (root first)
    target_tokens: list[int] | None  # greedy: target argmax after each tree node
    # Sampling only: per tree index, the numbers that decided a tried child (None where none was tried).
    target_probs: list[float | None] | None = None  # r(x) / sum(r): the residual's probability of its token
    draws: list[float | None] | None = None         # u: accepted when u < that probability
    residual_top: list[tuple[int, float]] = field(default_factory=list)  # stopping node's residual, likeliest first
    bonus_prob: float | None = None                 # the residual's probability of the bonus token


RESIDUAL_TOP = 5  # residual tokens kept per step for the page: enough to see where the bonus came from


def _children(parents: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents[1:], start=1):
        kids[p].append(i)  # tree indices are ordered by depth then sibling rank
    return kids


def accept_greedy(parents: list[int], tokens: list[int], best: list[int]) -> Decision:
    """Longest path agreeing with the target's argmax after each node (`best`), plus the argmax after it as bonus."""
    kids = _children(parents)
    verdicts: list[str | None] = [UNREACHED] * len(parents)
    verdicts[0] = ACCEPTED
    path, cur = [], 0
    while True:
        nxt = None
        for c in kids[cur]:
            hit = tokens[c] == best[cur]
            verdicts[c] = ACCEPTED if hit else REJECTED
            if hit:
                nxt = c
        if nxt is None:
            break
        path.append(nxt)
        cur = nxt
    return Decision(accepted=path, bonus=best[cur], verdicts=verdicts, target_tokens=best)


def accept_sampling(parents: list[int], tokens: list[int], logits: torch.Tensor, temperature: float,
                    top_p: float, gen: torch.Generator) -> Decision:
    """Sibling-wise rejection sampling down the tree; lossless for deterministic drafts."""
    probs = target_probs(logits, temperature, top_p)  # (N, V)
    kids = _children(parents)
    verdicts: list[str | None] = [UNREACHED] * len(parents)
    verdicts[0] = ACCEPTED
    ratios: list[float | None] = [None] * len(parents)
    draws: list[float | None] = [None] * len(parents)
    path, cur = [], 0
    while True:
        residual = probs[cur].clone()
        nxt = None
        for c in kids[cur]:
            x = tokens[c]
            total = residual.sum()
            u = torch.rand((), generator=gen, device=residual.device)
            # Kept for the page: the same comparison read as u < r(x)/sum(r); the rule below is left untouched
            # so a seed's output does not change.
            ratios[c], draws[c] = float(residual[x] / total) if total > 0 else 0.0, float(u)
            if total > 0 and u * total < residual[x]:  # accept with probability r(x) / sum(r)
                verdicts[c] = ACCEPTED
                nxt = c
                break
            verdicts[c] = REJECTED
            residual[x] = 0.0
        if nxt is None:
            dist = residual / residual.sum()  # (V,)
            bonus = int(torch.multinomial(dist, 1, generator=gen))
            top = dist.topk(min(RESIDUAL_TOP, dist.numel()))
            # .tolist(): one copy off the device, not one per number
            shown = [(t, p) for t, p in zip(top.indices.tolist(), top.values.tolist()) if p > 0]
            return Decision(accepted=path, bonus=bonus, verdicts=verdicts, target_tokens=None, target_probs=ratios,
                            draws=draws, residual_top=shown, bonus_prob=float(dist[bonus]))
        path.append(nxt)
        cur = nxt


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> int:
    """One token from a (V,) logit row: argmax at temperature 0, else the target's distribution."""
    if temperature == 0.0:
        return int(logits.argmax())
    return int(torch.multinomial(target_probs(logits[None], temperature, top_p)[0], 1, generator=gen))
