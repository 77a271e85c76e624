"""Tidy top-down tree layout, written out because networkx has none without graphviz.

Leaves take consecutive slots along x in depth-first order (children sorted by sibling rank), each
parent sits at the mean x of its children, and y = -depth, so the root is on top and every level of the
draft tree lines up on one row. A slot is 1 wide and a subtree as wide as its leaves' slots, unless
`width` gives a node's whole subtree another width: its descendants are then squeezed (or spread) to fit.
The tree figure squeezes each crowd of unlabelled pruned nodes this way, so the labelled kept nodes
keep room for their text.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def tidy_layout(
    pairs: Sequence[tuple[int, int]], rank: Mapping[int, float] | None = None,
    width: Mapping[int, float] | None = None,
) -> dict[int, tuple[float, float]]:
    """Map each id in `pairs` (id, parent) to (x, y); a parent not among the ids marks a root. `width[id]`:
    the width of that node's subtree (default: 1 for a leaf, its children's sum otherwise); with the
    defaults leaves sit at x = 0, 1, 2, ..."""
    width = width or {}
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

    # Pre-order with depths, iteratively: deep trees must not hit Python's recursion limit.
    pre: list[tuple[int, int]] = []
    seen: set[int] = set()
    for root in roots:
        stack = [(root, 0)]
        while stack:
            node, depth = stack.pop()
            if node in seen:
                continue  # guards against a malformed input that lists a node twice
            seen.add(node)
            pre.append((node, depth))
            stack.extend((k, depth + 1) for k in reversed(children[node]))
    kids_of = {n: [k for k in children[n] if k in seen] for n, _ in pre}
    natural: dict[int, float] = {}
    full: dict[int, float] = {}  # each subtree's width
    for node, _ in reversed(pre):
        natural[node] = sum(full[k] for k in kids_of[node])
        full[node] = width.get(node, natural[node] if kids_of[node] else 1.0)
    # Slots top-down: (left edge, scale); a subtree given another width than its natural one scales its children.
    left: dict[int, float] = {}
    scale: dict[int, float] = {}
    cursor = -0.5
    for root in dict.fromkeys(r for r in roots if r in full):  # side by side, each listed once
        left[root], scale[root] = cursor, 1.0
        cursor += full[root]
    for node, _ in pre:
        kids = kids_of[node]
        if not kids:
            continue
        s = scale[node] * (full[node] / natural[node] if natural[node] > 0 else 1.0)
        at = left[node] + (full[node] * scale[node] - natural[node] * s) / 2
        for k in kids:
            left[k], scale[k] = at, s
            at += full[k] * s
    pos: dict[int, tuple[float, float]] = {}
    for node, depth in reversed(pre):
        kids = kids_of[node]
        x = (sum(pos[k][0] for k in kids) / len(kids) if kids
             else left[node] + full[node] * scale[node] / 2)
        pos[node] = (x, -float(depth))
    return pos


# The tree panels' plotting width in pixels (half the page, less the colour bar and margins), and the width of
# one character of an 11-pixel label: enough to tell which labels would run into each other on a row.
PLOT_PX = 360.0
CHAR_PX = 6.5


def labels_with_room(pos: Mapping[int, tuple[float, float]], texts: Mapping[int, str], always: Sequence[int],
                     optional: Sequence[int], plot_px: float = PLOT_PX) -> set[int]:
    """Which nodes get a label under their mark: every id in `always`, then each of `optional` in the order
    given (most informative first) when its label clears every label already placed on its row. `pos` must
    hold every node the figure draws (it sets the figure's x range: its leaves plus 0.8 on either side)."""
    xs = [p[0] for p in pos.values()]
    px_per_unit = plot_px / (max(xs) - min(xs) + 1.6) if xs else 1.0
    placed: dict[float, list[tuple[float, float]]] = {}  # row y -> label extents in pixels

    def extent(i: int) -> tuple[float, float]:
        x, half = pos[i][0] * px_per_unit, (len(texts[i]) * CHAR_PX + 4) / 2
        return x - half, x + half

    chosen: set[int] = set()
    for i in always:
        placed.setdefault(pos[i][1], []).append(extent(i))
        chosen.add(i)
    for i in optional:
        lo, hi = extent(i)
        row = placed.setdefault(pos[i][1], [])
        if all(hi <= a or lo >= b for a, b in row):
            row.append((lo, hi))
            chosen.add(i)
    return chosen
