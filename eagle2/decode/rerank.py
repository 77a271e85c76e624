"""EAGLE-2's rerank as plain Python (no torch): the candidate nodes of a growing tree, the order it keeps them in
(`best`), which of them to keep, and the score a node must beat to be worth expanding. The engine drafts with
it; `replay` and `workload` re-run `best` on recorded steps, which the page's charts do without loading torch.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Candidate:
    """A drafted node while the tree is being grown (becomes a records.Node afterwards)."""

    parent: int
    token: int
    depth: int
    rank: int
    logp: float      # local log-probability under the draft
    score: float     # cumulative log-probability
    expanded: bool = False
    source: str = "draft"  # who proposed it: "draft", "lookup" (prompt lookup only) or "both"


def best(items: Iterable[T], keep: int | None = None, score: Callable[[T], float] = attrgetter("score")) -> list[T]:
    """The rerank's order: highest score first (`score`: an item's cumulative log-probability; default its
    `.score`), ties to the earlier item (a stable sort); the first `keep` (all when None). Drafting order puts
    parents before children, so ties go to shallower nodes."""
    ranked = sorted(items, key=lambda x: -score(x))
    return ranked if keep is None else ranked[:keep]


def select_dynamic(pool: list[Candidate], keep: int, floor: float = -math.inf) -> list[int]:
    """EAGLE-2 rerank: indices (into pool, pool[0] = root) of the root plus the best `keep` drafted nodes, of
    those scoring at least `floor` (a cumulative log-probability; -inf: all).

    Scores never rise along a path, so the top set is connected; a stable sort breaks ties towards
    shallower (earlier-drafted) nodes, which keeps that true when scores are equal.
    """
    chosen = set(best((i for i in range(1, len(pool)) if pool[i].score >= floor), keep, lambda i: pool[i].score))
    for i in chosen:  # connectivity is an invariant; fail loudly rather than verify a broken tree
        p = pool[i].parent
        if p != 0 and p not in chosen:
            raise AssertionError(f"rerank kept node {i} without its parent {p}")
    return [0] + sorted(chosen, key=lambda i: (pool[i].depth, i))


def floors(min_prob: float, expand_prob: float) -> tuple[float, float]:
    """EAGLE-2's per-step sizing as cumulative log-probabilities: (keep floor, expand floor); 0 = no floor. A node
    below the keep floor is not verified; one below either floor is not expanded, since its children score
    lower still."""
    keep = math.log(min_prob) if min_prob > 0 else -math.inf
    grow = math.log(expand_prob) if expand_prob > 0 else -math.inf
    return keep, max(keep, grow)


def cutoff(pool: list[Candidate], keep: int) -> float:
    """The score a drafted node's descendants must beat to ever be among the best `keep` of this pool.

    Scores never rise along a path and the pool only grows, so a node scoring at or below the keep-th best
    drafted score so far has no descendant the rerank could keep (a later node ties after earlier ones):
    expanding it would only draft nodes `select_dynamic` prunes. -inf while the pool has fewer nodes."""
    if len(pool) - 1 < keep:
        return -math.inf
    return heapq.nlargest(keep, (c.score for c in pool[1:]))[-1]
