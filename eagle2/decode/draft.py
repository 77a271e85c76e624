"""One step's draft tree as it grows: the candidate pool, the head's feature at each node, and the growth rules.

EAGLE-2 (`grow_dynamic`) expands the top_k most confident frontier nodes of each level and keeps the best
total_tokens - 1 of everything drafted (`rerank.select_dynamic`). EAGLE-1 (`grow_static`) drafts exactly the
static tree's nodes. `attach_lookup` adds a prompt-lookup continuation as one more branch of EAGLE-2's pool.
The draft head itself runs behind a `Drafter` (the engine's), which owns its cache; this is bookkeeping only.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch

from ..config import DecodeConfig
from .rerank import Candidate, best, cutoff, floors, select_dynamic
from .tree import static_children

LOG_FLOOR = -69.0  # about log(1e-30): the score of a lookup token the draft gives (almost) no probability


class Drafter(Protocol):
    """Runs the draft head for one step (engine.py)."""

    def root(self, k: int) -> tuple[torch.Tensor, torch.Tensor, list[float], list[int]]:
        """Draft log-probs (V',), feature (H,) and the top-k log-probs and vocabulary ids after the root."""

    def level(self, tokens: list[int], feats: torch.Tensor, visible: torch.Tensor, depth: int,
              k: int) -> tuple[torch.Tensor, torch.Tensor, list, list]:
        """Nodes of one depth, fed to the head after the step's drafted nodes -> log-probs (Q, V'), feats (Q, H),
        and each row's top-k log-probs and vocabulary ids (Q lists of k)."""

    def logp_of(self, logp_row: torch.Tensor, token: int) -> float:
        """The draft's log-probability of one vocabulary token (floored)."""


class DraftTree:
    """The pool of drafted candidates (pool[0] is the root) and the nodes kept for verification."""

    def __init__(self, root_token: int, drafter: Drafter):
        self.pool = [Candidate(parent=-1, token=root_token, depth=0, rank=0, logp=0.0, score=0.0)]
        self.drafter = drafter
        self.feats: dict[int, torch.Tensor] = {}  # the head's output at each node's parent: its children's input
        self.drafted: list[int] = []  # nodes fed to the head this step, in the order of its cache
        self.chain: list[int] = []    # a prompt-lookup continuation (`attach_lookup`)
        self.on_chain: list[int] = []  # the chain's nodes in the pool, one per level from the root
        self._kept: list[int] = [0]

    # ---- growth ----------------------------------------------------------------------------------
    def attach_lookup(self, chain: list[int]) -> None:
        """Offer a prompt-lookup continuation: each of its tokens joins the pool as one more child of the
        chain's node above (scored by the draft from that node's row), the chain's node on each level is
        expanded with its level, and the chain's nodes the rerank leaves out are verified on top (`kept`)."""
        self.chain = list(chain)

    def _extra(self, n: int) -> int | None:
        """The chain's next token when node n ends the chain so far (the root first)."""
        at_end = (not self.on_chain and n == 0) or (self.on_chain and n == self.on_chain[-1])
        return self.chain[len(self.on_chain)] if at_end and len(self.on_chain) < len(self.chain) else None

    def _add_children(self, n: int, logp_row: torch.Tensor, top_lp: list[float], top_tok: list[int],
                      feat: torch.Tensor, ranks: list[int] | None = None) -> list[int]:
        """Node n's drafted children (its top-k, or only `ranks` of them), plus the chain's token under it."""
        parent, extra, new = self.pool[n], self._extra(n), []
        parent.expanded = True
        for r, (lp, tok) in enumerate(zip(top_lp, top_tok)):
            if ranks is None or r in ranks:
                self.pool.append(Candidate(parent=n, token=tok, depth=parent.depth + 1, rank=r, logp=lp,
                                           score=parent.score + lp, source="both" if tok == extra else "draft"))
                new.append(len(self.pool) - 1)
        if extra is not None and extra not in top_tok:
            lp = self.drafter.logp_of(logp_row, extra)
            self.pool.append(Candidate(parent=n, token=extra, depth=parent.depth + 1, rank=len(top_tok), logp=lp,
                                       score=parent.score + lp, source="lookup"))
            new.append(len(self.pool) - 1)
        for i in new:
            self.feats[i] = feat
        self.on_chain += [i for i in new if self.pool[i].source != "draft"]
        return new

    def _root(self, k: int, ranks: list[int] | None = None) -> list[int]:
        logp, feat, lp, tok = self.drafter.root(k)
        return self._add_children(0, logp, lp, tok, feat, ranks)

    def _expand(self, nodes: list[int], k: int, ranks: dict[int, list[int]] | None = None) -> list[int]:
        """Draft the children of `nodes` (all one depth) in one head forward; returns their pool indices."""
        keys = self.drafted + nodes
        where = {n: j for j, n in enumerate(keys)}
        visible = torch.zeros(len(nodes), len(keys), dtype=torch.bool)
        for q, n in enumerate(nodes):
            a = n
            while a > 0:  # the node and its drafted ancestors (the root's pair is already committed)
                visible[q, where[a]] = True
                a = self.pool[a].parent
        logp, out, top_lp, top_tok = self.drafter.level(  # top-k: (Q, k) each
            [self.pool[n].token for n in nodes], torch.stack([self.feats[n] for n in nodes]), visible,
            self.pool[nodes[0]].depth, k)
        self.drafted += nodes
        return [c for q, n in enumerate(nodes) for c in self._add_children(
            n, logp[q], top_lp[q], top_tok[q], out[q], None if ranks is None else ranks[n])]

    def grow_dynamic(self, cfg: DecodeConfig, prune: bool = True) -> list[int]:
        """EAGLE-2: expand the top_k most confident nodes per level, then keep the best total_tokens - 1 overall.
        `prune`: skip nodes scoring no better than the pool's (total_tokens - 1)-th best, none of whose
        descendants could be kept (the same tree, cheaper; off only to time every level in full). With
        `cfg.min_prob` / `cfg.expand_prob` (eagle2_sized, ours) only nodes at least as likely are kept /
        expanded, so the tree's size follows the draft's confidence step by step."""
        floor, grow = floors(cfg.min_prob, cfg.expand_prob)
        frontier = self._root(cfg.top_k)
        for d in range(1, cfg.depth):
            nodes = best(frontier, cfg.top_k, lambda i: self.pool[i].score)  # the most confident by cumulative score
            nodes = [i for i in nodes if self.pool[i].score >= grow]
            if prune:
                cut = cutoff(self.pool, cfg.total_tokens - 1)
                nodes = [i for i in nodes if self.pool[i].score > cut]
            if len(self.on_chain) == d and d < len(self.chain) and self.on_chain[-1] not in nodes:
                nodes.append(self.on_chain[-1])  # the chain grows with its level, whatever its score
            if not nodes:
                break
            frontier = self._expand(nodes, cfg.top_k)
        self._kept = select_dynamic(self.pool, cfg.total_tokens - 1, floor)
        if self.chain:
            self._keep_chain()
        return self._kept

    def _keep_chain(self) -> None:
        """The kept tree plus the whole lookup chain: its drafted nodes the rerank left out, and its tokens past
        the drafted levels hung below them unscored (LOG_FLOOR each: the draft never saw them)."""
        keep, last = set(self._kept) | set(self.on_chain), self.on_chain[-1]
        for tok in self.chain[len(self.on_chain):]:
            p = self.pool[last]
            self.pool.append(Candidate(parent=last, token=tok, depth=p.depth + 1, rank=0, logp=LOG_FLOOR,
                                       score=p.score + LOG_FLOOR, source="lookup"))
            last = len(self.pool) - 1
            keep.add(last)
        self._kept = sorted(keep, key=lambda i: (self.pool[i].depth, i))  # parents first, siblings in rank order

    def grow_static(self, tree: tuple[tuple[int, ...], ...]) -> list[int]:
        """EAGLE-1: draft exactly the static tree's nodes, level by level; every one is kept."""
        spec, k = static_children(tree), 1 + max(r for p in tree for r in p)
        path = {0: ()}
        level = self._root(k, spec[()])
        while level:
            for i in level:
                path[i] = path[self.pool[i].parent] + (self.pool[i].rank,)
            grow = [i for i in level if path[i] in spec]
            if not grow:
                break
            level = self._expand(grow, k, {i: spec[path[i]] for i in grow})
        self._kept = list(range(len(self.pool)))  # drafted in level order: parents before children
        return self._kept

    def grow_chain(self, depth: int, p_min: float = 0.0) -> list[int]:
        """A chain: the draft's top-1 token at each of `depth` levels, every one kept, stopping before the first
        whose draft probability is below `p_min` (llama.cpp's --spec-draft-p-min); that one stays in the pool,
        drafted but not verified."""
        floor = math.log(p_min) if p_min > 0 else -math.inf
        kept, level = [0], self._root(1)
        while level and self.pool[level[0]].logp >= floor:
            kept.append(level[0])
            if len(kept) > depth:  # depth drafted tokens below the root
                break
            level = self._expand(level, 1)
        self._kept = kept
        return self._kept

    # ---- what the target verifies --------------------------------------------------------------------
    def verified(self) -> tuple[list[int], list[int], list[int]]:
        """(kept pool indices, root first; each one's parent as an index into that list; their tokens)."""
        index = {old: new for new, old in enumerate(self._kept)}
        parents = [-1] + [index[self.pool[i].parent] for i in self._kept[1:]]
        return self._kept, parents, [self.pool[i].token for i in self._kept]
