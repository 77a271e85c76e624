"""Replay recorded greedy EAGLE-2 steps with smaller trees, without drafting or verifying again (no torch).

A step's record lists every drafted node with its score, and the target's own choice after each verified
one. The tree EAGLE-2 would have kept with fewer nodes (or fewer levels) is what the engine's rerank
(`rerank.best`, as `rerank.select_dynamic` calls it) keeps of those nodes, and the target's recorded choices
(`target_path`) say how far along it the target would have accepted. The tuner (`autotune`) picks a tree size
with this, and the page draws each run's accept length against tree size with it. Greedy only: sampling
accepts by chance.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..decode.records import Node, StepRecord
from ..decode.rerank import best


def target_path(root: Node, nodes: Iterable[Node]) -> list[Node]:
    """The target's recorded choices walked through `nodes` from `root`: at each node, the child among `nodes`
    whose token is the target's own choice after it, until a node without a recorded choice (not verified)
    or without that child. For a greedy step walked through its verified nodes, this is its accepted path."""
    child: dict[tuple[int, int], Node] = {}
    for n in nodes:
        child.setdefault((n.parent, n.token), n)  # siblings hold distinct tokens; the first wins regardless
    path, node = [], root
    while node.target_token is not None and (node.id, node.target_token) in child:
        node = child[(node.id, node.target_token)]
        path.append(node)
    return path


def produced(r: StepRecord, tokens: int) -> int:
    """`tokens` a replayed tree would have accepted in step `r`, as that step could produce them: a step the run
    ended by a cut (EOS, or the token limit) kept only its own new tokens, and any tree would have been cut there
    too."""
    return min(tokens, len(r.new_tokens)) if r.stop in ("eos", "max_new_tokens") else tokens


def accept_by_size(r: StepRecord, max_nodes: int, depth: int | None = None, static: bool = False) -> list[int]:
    """Tokens one recorded step would have produced with a tree of n nodes, for n = 1..`max_nodes`: the root
    plus the n - 1 best-scored drafted nodes of depth <= `depth` (all when None), walking the target's
    recorded choices from the root. `static`: an EAGLE-1 step instead, whose smaller trees are its first
    n - 1 nodes in drafting order (the static tree cut breadth first, as its paths are listed).

    A record lists its nodes in drafting order, level by level, so the nodes of depth <= `depth` are a prefix
    of it: that prefix is the pool a `depth`-level draft would have grown. The engine's rerank
    (`rerank.select_dynamic`) keeps the best n - 1 of a pool in a stable sort by score; scores never rise
    along a path and ties go to the earlier-drafted node, so the nodes on the target's path come in that
    order one after another, and the tree of n nodes accepts those of them that sort before place n - 1.
    A static tree drafts a parent before its children, so the same holds for its drafting order.
    Past the recorded tree the target's choices are unknown: n beyond the recorded verified nodes (at the
    recorded depth) is an undercount, so callers stay within them. A step the run ended by a cut counts what it
    could produce (`produced`)."""
    pool = r.nodes if depth is None else [n for n in r.nodes if n.depth <= depth]
    if len(pool) < len(r.nodes) and r.nodes[len(pool)].depth <= depth:
        raise ValueError("a record's nodes are not in drafting order")
    order = range(1, len(pool)) if static else best(range(1, len(pool)), score=lambda i: pool[i].score)
    place = {pool[i].id: k for k, i in enumerate(order)}
    path = [place[n.id] for n in target_path(pool[0], pool[1:])]
    return [produced(r, 1 + sum(k < n - 1 for k in path)) for n in range(1, max_nodes + 1)]


def replayed_step(r: StepRecord, total_tokens: int, depth: int) -> int:
    """Tokens one recorded step would have produced with the tree of the `total_tokens - 1` best-scored drafted
    nodes of depth <= `depth` (see `accept_by_size`)."""
    return accept_by_size(r, total_tokens, depth)[-1]


def size_curve(records: list[StepRecord], max_nodes: int, static: bool = False) -> list[float]:
    """Mean accept length over these recorded steps had each kept the root plus its n - 1 best drafted nodes
    (`static`: its first n - 1), for n = 1..`max_nodes`, at the recorded depth."""
    steps = [r for r in records if r.nodes]
    if not steps:
        raise ValueError("no drafted steps to replay")
    per_step = [accept_by_size(r, max_nodes, static=static) for r in steps]
    return [sum(col) / len(steps) for col in zip(*per_step)]


def recorded_top_k(r: StepRecord) -> int:
    """Children the recording drafted per expanded node: the root's, counting draft-ranked ones only."""
    return sum(1 for n in r.nodes[1:] if n.parent == 0 and n.source != "lookup")


def replay_tau(records: list[StepRecord], total_tokens: int, depth: int) -> float:
    """Mean accept length the smaller tree (see `replayed_step`) would have had on these recorded steps."""
    steps = [r for r in records if r.nodes]
    if not steps:
        raise ValueError("no drafted steps to replay")
    return sum(replayed_step(r, total_tokens, depth) for r in steps) / len(steps)


def accept_top_k(r: StepRecord, total_tokens: int, depth: int, top_k: int) -> int:
    """Tokens one recorded step would have produced had EAGLE-2 drafted with a smaller `top_k` (at most the
    recording's): the root's best `top_k` children, then level by level the best `top_k` frontier nodes by score
    expanded into their best `top_k` children, and the best `total_tokens - 1` of that pool kept, walking the
    target's recorded choices. A node this growth expands that the recording did not expand has no recorded
    children; it adds none (the recording's own rerank left it far from the kept tree), so for such steps the
    result is a lower bound."""
    kids: dict[int, list] = {}
    for n in r.nodes[1:]:
        kids.setdefault(n.parent, []).append(n)
    frontier = [n for n in kids.get(0, []) if n.rank < top_k]
    pool = list(frontier)
    for _ in range(1, depth):
        grow = best(frontier, top_k)
        frontier = [c for n in grow for c in kids.get(n.id, []) if c.rank < top_k]
        if not frontier:
            break
        pool += frontier
    return produced(r, 1 + len(target_path(r.nodes[0], best(pool, total_tokens - 1))))


def replay_runs(runs: list[list[StepRecord]], total_tokens: int, depth: int, top_k: int | None = None,
                static: bool = False) -> float:
    """Accept length of the smaller tree over several decodes, as a bench counts it: all their tokens over
    all the steps it would have taken. A decode that the big tree covered in few steps (an answer that
    repeats itself) would take the small tree many more, so pooling the recorded steps would underweight it
    and overrate big trees: each decode's tokens are divided by its own replayed accept length instead
    (tokens / tau steps). `top_k`: EAGLE-2 drafting fewer children per node (`accept_top_k`); `static`: an
    EAGLE-1 recording cut to its first `total_tokens - 1` nodes (`depth` unused)."""
    def step(r: StepRecord) -> int:
        if static:
            return accept_by_size(r, total_tokens, static=True)[-1]
        if top_k is not None and top_k < recorded_top_k(r):
            return accept_top_k(r, total_tokens, depth, top_k)
        return replayed_step(r, total_tokens, depth)

    tokens = steps = 0.0
    for records in runs:
        drafted = [r for r in records if r.nodes]
        if drafted:
            n = sum(len(r.new_tokens) for r in drafted)  # the tokens those steps covered
            tokens, steps = tokens + n, steps + n * len(drafted) / sum(step(r) for r in drafted)
    if not steps:
        raise ValueError("no drafted steps to replay")
    return tokens / steps


def accept_with_floors(r: StepRecord, total_tokens: int, depth: int, floor: float, grow: float) -> tuple[int, int, int]:
    """(tokens, verified rows, draft levels) of one recorded step had EAGLE-2 sized its tree by confidence
    (`rerank.floors`: keep floor `floor`, expand floor `grow`, both cumulative log-probabilities): of the
    nodes of depth <= `depth` whose parent it would have expanded (the root, or a parent scoring at least both
    floors), the best `total_tokens - 1` scoring at least `floor`, walking the target's recorded choices.
    Exact where the recording drafted every node the smaller tree would have (at most `top_k` nodes per level
    pass the expand floor, which holds whenever it is above 1 / top_k, since a level's probabilities sum to at
    most 1)."""
    grow = max(floor, grow)
    drafted = [n for n in r.nodes[1:] if n.depth <= depth and (n.parent == 0 or r.nodes[n.parent].score >= grow)]
    kept = best((n for n in drafted if n.score >= floor), total_tokens - 1)
    tokens = produced(r, 1 + len(target_path(r.nodes[0], kept)))
    levels = 1 + max((n.depth for n in drafted if n.score >= grow and n.depth < depth), default=0)
    return tokens, len(kept) + 1, levels
