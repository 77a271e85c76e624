"""The registry of tree policies: every decoding method by name, what it grows and what it reads (no torch).

A policy is what the command line's `--method`, the JSON's "method", the page's panels and the tuner call a
method. Its `growth` is what the engine runs (`DecodeConfig.method`): a dynamic tree (EAGLE-2 and this project's
variants of it), a static tree (EAGLE-1), a chain, or no tree (plain decoding); peers are transformers' own
`generate` loops, which the bench runs beside ours. Code outside this file asks the registry (`policy(name)`,
the growth constants, the name lists) and never compares a method's name with a string of its own.

Adding a policy: see docs/how-it-works.md ("Adding a tree policy").
"""
from __future__ import annotations

from dataclasses import dataclass

# What the engine grows each step (DecodeConfig.method).
DYNAMIC, STATIC, CHAIN, PLAIN = "eagle2", "eagle1", "chain", "vanilla"
GROWTHS = (DYNAMIC, STATIC, PLAIN, CHAIN)


@dataclass(frozen=True)
class Policy:
    """One decoding method: its name and labels, what the engine grows for it and which settings it reads."""

    name: str
    label: str                  # the command line's and the bench's label
    growth: str | None          # DecodeConfig.method; None for a peer (transformers' generate)
    settings: tuple[str, ...]   # the Shared settings it reads, beyond the ones every method shares
    ours: bool = False          # this project's addition (its label says so)
    sized: bool = False         # confidence floors size its tree per step (min_prob / expand_prob)
    lookup: bool = False        # a prompt-lookup branch joins its pool
    tuned_by: str | None = None  # whose tuned settings it runs with (None: it has none)

    @property
    def drafts(self) -> bool:
        """Whether it drafts a tree (anything but plain decoding and the peers)."""
        return self.growth not in (None, PLAIN)

    @property
    def peer(self) -> bool:
        return self.growth is None

    @property
    def static(self) -> bool:
        return self.growth == STATIC

    @property
    def dynamic(self) -> bool:
        return self.growth == DYNAMIC

    @property
    def chain(self) -> bool:
        return self.growth == CHAIN

    @property
    def plain(self) -> bool:
        return self.growth == PLAIN

    @property
    def paper(self) -> bool:
        """A paper's algorithm as published (EAGLE-2's or EAGLE-1's), whose accept length a tree size replays."""
        return self.growth in (DYNAMIC, STATIC) and not (self.ours or self.sized or self.lookup)


_TREE = ("total_tokens", "depth", "top_k", "draft_tokens")
REGISTRY: dict[str, Policy] = {p.name: p for p in (
    Policy("eagle2", "EAGLE-2", DYNAMIC, _TREE, tuned_by="eagle2"),
    Policy("eagle2_sized", "EAGLE-2 + confidence sizing (ours)", DYNAMIC, (*_TREE, "min_prob", "expand_prob"),
           ours=True, sized=True, tuned_by="eagle2_sized"),
    Policy("eagle2_lookup", "EAGLE-2 + prompt-lookup branch (ours)", DYNAMIC, (*_TREE, "lookup_tokens"), ours=True,
           lookup=True, tuned_by="eagle2"),
    Policy("eagle2_sized_lookup", "EAGLE-2 + confidence sizing + prompt-lookup branch (ours)", DYNAMIC,
           (*_TREE, "min_prob", "expand_prob", "lookup_tokens"), ours=True, sized=True, lookup=True,
           tuned_by="eagle2_sized"),
    Policy("eagle1", "EAGLE-1 (static tree)", STATIC, ("total_tokens", "tree", "draft_tokens"), tuned_by="eagle1"),
    Policy("chain", "chain (top-1 drafts)", CHAIN, ("chain_tokens", "p_min", "draft_tokens")),
    Policy("vanilla", "plain decoding", PLAIN, ()),
    Policy("hf_greedy", "transformers greedy generate", None, ()),
    Policy("hf_lookup", "transformers prompt-lookup generate", None, (), lookup=True),
)}

OURS = tuple(n for n, p in REGISTRY.items() if not p.peer)      # what our engine runs
PEERS = tuple(n for n, p in REGISTRY.items() if p.peer)         # transformers' own generate
TUNED = tuple(dict.fromkeys(p.tuned_by for p in REGISTRY.values() if p.tuned_by))  # with settings to tune
EAGLE2_KINDS = tuple(n for n, p in REGISTRY.items() if p.dynamic)
LABELS = {n: p.label for n, p in REGISTRY.items()}
VANILLA, HF_GREEDY = "vanilla", "hf_greedy"  # the references: our plain decoding, transformers' greedy generate
PANELS = ("eagle2", "eagle1")  # the page's two tree panels by default: the paper's dynamic tree beside the static


def policy(name: str) -> Policy:
    """The registered policy called `name`; ValueError naming the choices otherwise."""
    p = REGISTRY.get(name) if isinstance(name, str) else None
    if p is None:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(REGISTRY)}")
    return p


def growth_of(name: str) -> str | None:
    """What the engine grows for a method (a policy's name, or a growth itself)."""
    return name if name in GROWTHS else policy(name).growth
