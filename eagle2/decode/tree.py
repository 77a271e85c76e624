"""Trees as data: a parents list (root = index 0, parent -1) plus tokens.

`tree_inputs` derives the verification inputs (additive 4D mask, position ids) from the parents list; both tree kinds and the draft head's level-by-level drafting go through it.
`static_children` reads an EAGLE-1 tree given as child-rank paths; EAGLE-2's rerank is in `rerank`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def depths(parents: list[int]) -> list[int]:
    """Depth of every node (root 0); parents must precede children."""
    d = [0] * len(parents)
    for i, p in enumerate(parents):
        if p >= 0:
            d[i] = d[p] + 1
    return d


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: [i, j] is True when j is i itself or an ancestor of i."""
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            m[i] = m[p]
        m[i, i] = True
    return m


def additive_mask(visible: torch.Tensor, past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, Q, past+K) additive float mask: every query sees the whole past plus the new keys `visible` allows."""
    q, k = visible.shape
    block = torch.finfo(dtype).min
    mask = torch.zeros(q, past_len + k, dtype=dtype)
    mask[:, past_len:].masked_fill_(~visible, block)
    return mask[None, None]


@dataclass(frozen=True)
class TreeInputs:
    mask: torch.Tensor          # (1, 1, N, past+N) additive float
    position_ids: torch.Tensor  # (1, N) = past_len + depth


def tree_inputs(parents: list[int], past_len: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> TreeInputs:
    """Everything a stock transformers model needs to score a whole tree in one forward over its cache."""
    mask = additive_mask(ancestor_matrix(parents), past_len, dtype).to(device)
    pos = torch.tensor([past_len + d for d in depths(parents)], device=device)[None]
    return TreeInputs(mask=mask, position_ids=pos)


def static_children(paths: tuple[tuple[int, ...], ...]) -> dict[tuple[int, ...], list[int]]:
    """For each path prefix (root = ()), the child ranks the static tree drafts under it."""
    kids: dict[tuple[int, ...], list[int]] = {}
    for p in paths:
        kids.setdefault(p[:-1], []).append(p[-1])
    return {k: sorted(v) for k, v in kids.items()}
