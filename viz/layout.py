"""Tidy top-down tree layout, written out because networkx has none without graphviz.

Leaves take consecutive integer x positions in depth-first order (children sorted by sibling rank),
each parent sits at the mean x of its children, and y = -depth, so the root is on top and every
level of the draft tree lines up on one row.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def tidy_layout(
    pairs: Sequence[tuple[int, int]], rank: Mapping[int, float] | None = None
) -> dict[int, tuple[float, float]]:
    """Map each id in `pairs` (id, parent) to (x, y); a parent not among the ids marks a root."""
    ids = [i for i, _ in pairs]
    known = set(ids)
    order = {i: k for k, i in enumerate(ids)}  # list order breaks ties between equal ranks
    children: dict[int, list[int]] = {i: [] for i in ids}
    roots: list[int] = []
    for i, p in pairs:
        if p in known and p != i:
            children[p].append(i)
        else:
            roots.append(i)

    def sort_key(i: int) -> tuple[float, int]:
        return (rank.get(i, 0.0) if rank else 0.0, order[i])

    for kids in children.values():
        kids.sort(key=sort_key)
    roots.sort(key=sort_key)

    pos: dict[int, tuple[float, float]] = {}
    next_x = 0.0
    # Iterative post-order walk: deep trees must not hit Python's recursion limit.
    for root in roots:
        stack: list[tuple[int, int, bool]] = [(root, 0, False)]
        while stack:
            node, depth, done = stack.pop()
            if node in pos:
                continue  # guards against a malformed input that lists a node twice
            kids = children[node]
            if not kids:
                pos[node] = (next_x, -float(depth))
                next_x += 1.0
            elif done:
                xs = [pos[k][0] for k in kids if k in pos]
                pos[node] = (sum(xs) / len(xs), -float(depth))
            else:
                stack.append((node, depth, True))
                stack.extend((k, depth + 1, False) for k in reversed(kids))
    return pos
