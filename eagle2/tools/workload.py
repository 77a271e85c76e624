"""A workload's accept lengths for every tree shape, replayed from one large recorded EAGLE-2 tree per step (no torch).

A greedy decode commits the target's own choices whatever tree drafted them, so the target's continuation after
a step's root is simply every token committed from that step on. A drafted path is accepted as far as it
matches that continuation; the draft's proposals along a path depend on that path only. So any smaller tree
whose nodes the recording drafted (a top-1 chain, EAGLE-1's static tree cut to a size, EAGLE-2 at a smaller
budget, depth or top-k) can be walked against the continuation exactly; where a node the smaller tree needs was
never drafted (its parent was not expanded) the walk stops there and the count is a lower bound, flagged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import STATIC_PRESET, cut_tree, parse_tree
from ..decode.records import ACCEPTED, KEPT, Node, StepRecord
from ..decode.rerank import best

STATIC_TREE = parse_tree(STATIC_PRESET, 10)  # EAGLE-1's mc_sim_7b_63: 25 paths of child ranks <= 3, depth <= 5
STATIC_SIZES = range(2, len(STATIC_TREE) + 2)


@dataclass
class Step:
    """One recorded step with the target's greedy continuation after its root and its nodes indexed."""

    record: StepRecord
    cont: tuple[int, ...]  # the tokens the target committed from this step on, to the decode's end
    kids: dict[int, dict[int, Node]] = field(default_factory=dict)  # parent id -> draft rank -> node
    path: list[Node] = field(default_factory=list)  # drafted nodes on the target's path from the root

    def __post_init__(self) -> None:
        by_token = {}
        for n in self.record.nodes[1:]:
            if n.source != "lookup":
                self.kids.setdefault(n.parent, {})[n.rank] = n
                by_token[(n.parent, n.token)] = n
        node = self.record.nodes[0]
        while len(self.path) < len(self.cont) and (node.id, self.cont[len(self.path)]) in by_token:
            node = by_token[(node.id, self.cont[len(self.path)])]
            self.path.append(node)

    def tokens(self, accepted: int) -> int:
        """Tokens a step commits with `accepted` draft tokens: those plus the bonus, cut at the decode's end."""
        return min(accepted + 1, len(self.cont))

    def accepted_in(self, kept: set[int]) -> int:
        """Draft tokens the target accepts of a tree holding the drafted nodes `kept` (ids): its path's prefix."""
        k = 0
        while k < len(self.path) and self.path[k].id in kept:
            k += 1
        return k


def steps_of(records: list[StepRecord]) -> list[Step]:
    """The drafted steps of one greedy decode, each with its continuation."""
    out, after = [], ()
    for r in reversed(records):
        after = tuple(r.new_tokens) + after
        if r.nodes:
            out.append(Step(r, after))
    return out[::-1]


def chain(s: Step, length: int) -> tuple[int, bool]:
    """(tokens, exact) of a top-1 chain of `length` drafted tokens: the rank-0 child of each node in turn.
    Not exact where the walk reaches a node whose rank-0 child the recording never drafted."""
    node, k = s.record.nodes[0], 0
    while k < length and k < len(s.cont):
        c = s.kids.get(node.id, {}).get(0)
        if c is None:
            return s.tokens(k), False
        if c.token != s.cont[k]:
            break
        node, k = c, k + 1
    return s.tokens(k), True


def eagle1(s: Step, size: int) -> tuple[int, bool]:
    """(tokens, exact) of EAGLE-1's static tree cut breadth first to `size` nodes (root included), its paths of
    child ranks walked through the recorded pool. Not exact where the walk reaches a node the cut expands but
    the recording did not."""
    paths = set(cut_tree(STATIC_TREE, size)) if size > 1 else set()
    node, k, at = s.record.nodes[0], 0, ()
    while k < len(s.cont):
        ranks = [p[-1] for p in paths if len(p) == len(at) + 1 and p[:-1] == at]
        if not ranks:
            break
        kids = s.kids.get(node.id, {})
        if any(r not in kids for r in ranks):
            return s.tokens(k), False
        hit = next((r for r in ranks if kids[r].token == s.cont[k]), None)
        if hit is None:
            break
        node, k, at = kids[hit], k + 1, at + (hit,)
    return s.tokens(k), True


def dynamic_pool(s: Step, depth: int, top_k: int) -> tuple[list[Node], bool]:
    """(drafted nodes in drafting order, exact) of EAGLE-2 growing `depth` levels with `top_k`: the root's best
    `top_k` children, then per level the best `top_k` frontier nodes by score expanded into their best `top_k`
    children. At the recording's own top-k this is the recording's pool cut at `depth` (its early cut only
    skipped nodes no budget up to its own could keep). With a smaller top-k a node to expand that the recording
    did not expand adds nothing, and the pool is flagged inexact."""
    recorded = len(s.kids.get(0, {}))
    if top_k >= recorded:
        return [n for n in s.record.nodes[1:] if n.depth <= depth and n.source != "lookup"], True
    frontier = [c for r, c in sorted(s.kids.get(0, {}).items()) if r < top_k]
    pool, exact = list(frontier), True
    for _ in range(1, depth):
        grow = best(frontier, top_k)
        exact = exact and all(n.id in s.kids for n in grow)
        frontier = [c for n in grow for r, c in sorted(s.kids.get(n.id, {}).items()) if r < top_k]
        if not frontier:
            break
        pool += frontier
    return pool, exact


def eagle2_by_budget(s: Step, depth: int, top_k: int, max_nodes: int) -> tuple[list[int], bool]:
    """(tokens for budgets n = 1..`max_nodes` verified nodes, root included; exact) of EAGLE-2 at `depth` and
    `top_k`: the best n - 1 of the pool by score, kept by a stable sort as the engine's rerank keeps them.
    Scores never rise along a path, so the target's path comes in sorted order and the tree of n nodes
    accepts its path nodes placed before n - 1."""
    pool, exact = dynamic_pool(s, depth, top_k)
    place = {n.id: i for i, n in enumerate(best(pool))}
    need, worst = [], -1  # budget each path prefix needs: all its nodes kept
    for n in s.path:
        if n.id not in place:
            break
        worst = max(worst, place[n.id])
        need.append(worst + 2)
    return [s.tokens(sum(q <= n for q in need)) for n in range(1, max_nodes + 1)], exact


@dataclass
class Curves:
    """Per shape, the tokens of each step; `inexact` counts the steps that are lower bounds."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    inexact: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, tokens: int, exact: bool) -> None:
        self.tokens.setdefault(key, []).append(tokens)
        self.inexact[key] = self.inexact.get(key, 0) + (not exact)


def curves(steps: list[Step], max_depth: int = 7, max_nodes: int = 60, top_ks: tuple[int, ...] = ()) -> Curves:
    """Every shape on every step: "chain L", "eagle1 N", "eagle2 N,D" (the recorded top-k), and for each of
    `top_ks` "eagle2 N,D,K"."""
    out = Curves()
    for s in steps:
        for length in range(1, max_depth + 1):
            out.add(f"chain {length}", *chain(s, length))
        for n in STATIC_SIZES:
            out.add(f"eagle1 {n}", *eagle1(s, n))
        recorded = len(s.kids.get(0, {}))
        for d in range(1, max_depth + 1):
            for k in sorted({recorded, *top_ks}):
                got, exact = eagle2_by_budget(s, d, k, max_nodes)
                for n in range(2, max_nodes + 1):
                    out.add(f"eagle2 {n},{d}" if k == recorded else f"eagle2 {n},{d},{k}", got[n - 1], exact)
    return out


def pooled_tau(runs: list[tuple[list[Step], list[int]]]) -> float:
    """τ of a shape over several decodes as a bench counts it: all their tokens over all the steps it would
    take, each decode's tokens divided by its own replayed τ (as `replay.replay_runs`)."""
    tokens = steps = 0.0
    for run, got in runs:
        if run:
            covered = sum(len(s.record.new_tokens) for s in run)
            tokens, steps = tokens + covered, steps + covered * len(run) / sum(got)
    return tokens / steps if steps else 0.0


def positions(steps: list[Step], max_depth: int = 7, max_rank: int = 10) -> dict[str, dict[str, list]]:
    """Acceptance of the verified (recorded) tree by depth x sibling rank: counts drafted, reached, accepted."""
    grid = {k: [[0] * max_rank for _ in range(max_depth)] for k in ("drafted", "reached", "accepted")}
    for s in steps:
        nodes = s.record.nodes
        for n in nodes[1:]:
            if n.status != KEPT or n.depth > max_depth or n.rank >= max_rank or n.source == "lookup":
                continue
            d, r = n.depth - 1, n.rank
            grid["drafted"][d][r] += 1
            if nodes[n.parent].verdict == ACCEPTED:
                grid["reached"][d][r] += 1
                grid["accepted"][d][r] += n.verdict == ACCEPTED
    return grid


def collapses(steps: list[Step], top: int = 8, context: int = 6) -> dict:
    """Steps where the large tree accepted no draft token: how many, and the draft's most confident misses
    first, each with the draft's best guess, the target's token and the committed text just before."""
    out, history = [], []
    for s in steps:
        r = s.record
        best = s.kids.get(0, {}).get(0)
        if not r.accepted and best is not None:
            out.append({"step": r.step, "draft": best.text, "draft_prob": round(best.prob, 4),
                        "target": r.new_texts[0] if r.new_texts else "", "context": "".join(history[-context:])})
        history += list(r.new_texts)
    out.sort(key=lambda c: -c["draft_prob"])
    return {"count": len(out), "of_steps": len(steps), "worst": out[:top]}


def _accepted_by_engine(s: Step, kept: list[Node]) -> int:
    """Draft tokens the engine's greedy acceptance rule (`verify.accept_greedy`) takes from a tree of `kept`
    nodes, given the target's choice after each node on its path (off the path the choice cannot matter)."""
    from ..decode.verify import accept_greedy

    on_path = {n.id for n in s.path}
    nodes = [s.record.nodes[0]] + sorted(kept, key=lambda n: (n.depth, n.id))
    index = {n.id: i for i, n in enumerate(nodes)}
    parents = [-1] + [index[n.parent] for n in nodes[1:]]
    best = [s.cont[n.depth] if (n.depth == 0 or n.id in on_path) and n.depth < len(s.cont) else -1 for n in nodes]
    return len(accept_greedy(parents, [n.token for n in nodes], best).accepted)


def conformance(steps: list[Step], max_depth: int = 7, budgets: tuple[int, ...] = (4, 8, 16, 26)) -> dict:
    """Two properties checked on every recorded step.
    top1_is_chain: EAGLE-2 with top-k 1 (grown by score, each level's best child; and as `eagle2_by_budget`
    grows it) accepts what the rank-0 chain of the same depth accepts.
    sibling_never_shortens: adding to EAGLE-2's tree (each budget, full depth) any one drafted sibling of a
    kept node never shortens what the engine's greedy rule accepts."""
    top1 = {"checked": 0, "failed": 0, "skipped_inexact": 0}
    sib = {"checked": 0, "failed": 0}
    for s in steps:
        for d in range(1, max_depth + 1):
            length, exact = chain(s, d)
            node, ids = s.record.nodes[0], set()
            for _ in range(d):
                kids = s.kids.get(node.id)
                if not kids:
                    break
                node = max(kids.values(), key=lambda n: (n.score, -n.rank))
                ids.add(node.id)
            got, exact2 = eagle2_by_budget(s, d, 1, d + 1)
            if not (exact and exact2):
                top1["skipped_inexact"] += 1
                continue
            top1["checked"] += 1
            top1["failed"] += not (length == got[-1] == s.tokens(s.accepted_in(ids)))
        pool, _ = dynamic_pool(s, max_depth, len(s.kids.get(0, {})))
        ranked = best(pool)
        for n in budgets:
            kept = ranked[:n - 1]
            ids = {k.id for k in kept}
            base = _accepted_by_engine(s, kept)
            for extra in pool:
                if extra.id not in ids and (extra.parent == 0 or extra.parent in ids):
                    sib["checked"] += 1
                    sib["failed"] += _accepted_by_engine(s, kept + [extra]) < base
    return {"top1_is_chain": {**top1, "passed": top1["failed"] == 0},
            "sibling_never_shortens": {**sib, "passed": sib["failed"] == 0}}
