"""Decoding settings: one frozen dataclass, validated in one place, plus the shipped tree presets."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .inputs import check_number, load_json, shown
from .policies import CHAIN, DYNAMIC, GROWTHS, PLAIN, STATIC

ASSETS = Path(__file__).resolve().parent.parent / "assets"
METHODS = GROWTHS  # what the engine grows (eagle2/policies.py names the methods that run them)

# Bounds enforced by the engine as well as by the page's widgets.
LIMITS = {
    "max_new_tokens": (1, 1024),
    "temperature": (0.0, 2.0),
    "top_p": (0.01, 1.0),
    "total_tokens": (2, 128),
    "depth": (1, 12),
    "top_k": (1, 20),
    "lookup_tokens": (1, 32),
    "min_prob": (0.0, 1.0),
    "expand_prob": (0.0, 1.0),
    "p_min": (0.0, 1.0),
    "static_nodes": (1, 127),
    "draft_tokens": (0, 1 << 20),
    "seed": (0, 2**63 - 1),  # torch's generators take 64-bit seeds; a signed 64-bit one is portable
}
WHOLE = ("max_new_tokens", "total_tokens", "depth", "top_k", "lookup_tokens", "static_nodes", "draft_tokens", "seed")


def load_tree_presets() -> dict[str, list[list[int]]]:
    """Static trees shipped in assets/trees.json: name -> list of child-rank paths."""
    return json.loads((ASSETS / "trees.json").read_text())


def parse_tree(spec: str | list, top_k: int) -> tuple[tuple[int, ...], ...]:
    """A static tree from a preset name, a JSON string or a list of paths; raises ValueError naming the bad path."""
    if isinstance(spec, str):
        presets = load_tree_presets()
        if spec in presets:
            spec = presets[spec]
        else:
            if not spec.lstrip().startswith("["):
                raise ValueError(f"tree {shown(spec)} must be a preset ({', '.join(presets)}) or a JSON list of "
                                 "paths such as [[0], [1], [0, 0]]")
            spec = load_json(spec, "the static tree")
    if not isinstance(spec, list) or not spec:
        raise ValueError("tree must be a non-empty list of paths such as [[0], [1], [0, 0]]")
    hi = LIMITS["static_nodes"][1]
    if len(spec) > hi:
        raise ValueError(f"tree has {len(spec):,} nodes; at most {hi} are allowed: remove some paths")
    paths: list[tuple[int, ...]] = []
    for p in spec:
        if not isinstance(p, list) or not p or not all(isinstance(r, int) and not isinstance(r, bool) for r in p):
            raise ValueError(f"tree path {shown(p)} must be a non-empty list of integer child ranks such as [0, 1]")
        if any(r < 0 or r >= top_k for r in p):
            raise ValueError(f"tree path {shown(p)} has a rank outside 0..{top_k - 1} (top_k={top_k}): "
                             f"use ranks from 0 to {top_k - 1}")
        paths.append(tuple(p))
    if len(set(paths)) != len(paths):
        raise ValueError("tree has a repeated path")
    max_depth = LIMITS["depth"][1]
    known = set(paths)
    for p in paths:
        if len(p) > max_depth:
            raise ValueError(f"tree path {shown(list(p))} is deeper than {max_depth} levels: shorten it")
        if len(p) > 1 and p[:-1] not in known:
            raise ValueError(f"tree is not prefix-closed: path {shown(list(p))} has no parent "
                             f"{shown(list(p[:-1]))}; add the parent path")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def cache_dir() -> Path:
    """Where converted models and per-machine measurements are kept: $EAGLE2_CACHE, else ~/.cache/eagle2-viz."""
    base = os.environ.get("EAGLE2_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "eagle2-viz")
    return Path(base)


STATIC_PRESET = "mc_sim_7b_63"  # EAGLE-1's tree: 25 nodes + root, depth 5


def cut_tree(paths: tuple[tuple[int, ...], ...], total_tokens: int) -> tuple[tuple[int, ...], ...]:
    """A static tree cut breadth first to `total_tokens` verified nodes, root included: its first
    `total_tokens - 1` paths in level order (parents come before children, so the cut is a tree). A budget at
    or above the whole tree's size keeps it whole."""
    ordered = sorted(paths, key=lambda p: (len(p), p))
    return tuple(ordered[:max(total_tokens - 1, 1)])


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that shapes one decode. Validated on construction."""

    method: str = "eagle2"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    total_tokens: int = 26     # verified nodes per step, root included (EAGLE-2)
    depth: int = 6             # drafted levels (EAGLE-2): the authors' 6 levels, 10 expanded per level
    top_k: int = 10
    tree: tuple[tuple[int, ...], ...] = field(default=())  # static tree (EAGLE-1); empty = preset mc_sim_7b_63
    lookup: bool = False       # EAGLE-2 only: add a prompt-lookup branch, verified on top of total_tokens
    lookup_tokens: int = 10    # the branch's longest length (transformers' prompt_lookup_num_tokens default)
    # EAGLE-2, a tree sized per step by confidence (both 0 = off: always total_tokens): keep only drafted nodes
    # whose cumulative draft probability is at least min_prob, and expand only nodes at least expand_prob;
    # total_tokens and depth stay the caps. On a CPU, where every verified row and every draft level costs, this spends them
    # where the draft expects them to be accepted.
    min_prob: float = 0.0
    expand_prob: float = 0.0
    # The draft scores the first draft_tokens tokens of the head's draft vocabulary (0: all of it). Fewer is a
    # cheaper draft level and fewer tokens the draft can propose; verification always uses the full vocabulary.
    draft_tokens: int = 0
    # A chain (method "chain": depth drafted tokens, the draft's top-1 each) stops drafting at the first token
    # whose draft probability is below p_min, as llama.cpp's --spec-draft-p-min does (0: never).
    p_min: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {shown(self.method)}")
        for name in ("max_new_tokens", "temperature", "top_p", "seed", "total_tokens", "depth", "top_k",
                     "lookup_tokens", "min_prob", "expand_prob", "draft_tokens", "p_min"):
            check_number(name, getattr(self, name), *LIMITS[name], whole=name in WHOLE)
        if not isinstance(self.lookup, bool):
            raise ValueError(f"lookup must be true or false, not {self.lookup!r}")
        if not self.tree:
            object.__setattr__(self, "tree", parse_tree(STATIC_PRESET, max(self.top_k, 4)))
        if self.method == CHAIN and (self.top_k != 1 or self.total_tokens != self.depth + 1):
            raise ValueError(f"a chain drafts the top-1 token at each of its {self.depth} levels: top_k=1 and "
                             f"total_tokens={self.depth + 1}, not top_k={self.top_k}, total_tokens={self.total_tokens}")
        if self.p_min and self.method != CHAIN:
            raise ValueError("p_min stops a chain early (method chain); other methods do not read it")
        need = self.top_k if self.method in (DYNAMIC, CHAIN) else self.static_top_k
        if self.draft_tokens and self.method != PLAIN and self.draft_tokens < need:
            raise ValueError(f"draft_tokens={self.draft_tokens} is fewer than the {need} candidates the draft "
                             f"proposes per node; use at least {need}, or 0 for the head's whole draft vocabulary")

    @property
    def sized(self) -> bool:
        """Whether EAGLE-2 sizes its tree per step (either floor set): its size then varies from step to step."""
        return self.min_prob > 0 or self.expand_prob > 0

    @property
    def name(self) -> str:
        """The method this config runs, by its name (eagle2/decode/methods.py): `eagle2` is the paper's algorithm
        only; confidence sizing and the prompt-lookup branch are this project's additions and carry their own
        names."""
        if self.method != DYNAMIC:
            return self.method
        return DYNAMIC + ("_sized" if self.sized else "") + ("_lookup" if self.lookup else "")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def static_top_k(self) -> int:
        """Children drafted per static-tree node: the largest rank used, plus one."""
        return 1 + max(r for p in self.tree for r in p)
