"""The methods by name: what each one runs, its label, and its DecodeConfig from the shared settings.

`eagle2` is the paper's algorithm only: fixed total_tokens, depth and top_k, the tree kept by cumulative draft
log-probability. This project's additions carry their own names: `eagle2_sized` (confidence floors size the
tree per step, total_tokens and depth the caps), `eagle2_lookup` (the paper's tree plus a prompt-lookup
branch) and `eagle2_sized_lookup` (both). `eagle1` is the static tree, mc_sim_7b_63 cut breadth first to the
same node budget unless a tree is given. Tuning (`autotune`) picks each method's own settings; a method
never turns into another.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import LIMITS, STATIC_PRESET, DecodeConfig, cut_tree, load_tree_presets, parse_tree
from ..inputs import check_number
from ..policies import DYNAMIC, EAGLE2_KINDS, LABELS, OURS, PEERS, STATIC, TUNED, policy  # noqa: F401  (re-exported)

SIZED_DEFAULT = (0.12, 0.48)  # eagle2_sized's keep and expand floors when neither is given nor tuned
STATIC_NODES = len(load_tree_presets()[STATIC_PRESET]) + 1  # EAGLE-1's whole tree, root included


def is_sized(name: str) -> bool:
    return policy(name).sized


def has_lookup(name: str) -> bool:
    return policy(name).lookup


def tuned_as(name: str) -> str:
    """Whose tuned settings a method runs with: a lookup variant takes its tree's (the branch has none)."""
    return policy(name).tuned_by or name


@dataclass(frozen=True)
class Shared:
    """The settings every method shares (the command line's or the page's), and what tuning chose per method."""

    max_new_tokens: int = DecodeConfig.max_new_tokens
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    total_tokens: int = DecodeConfig.total_tokens  # the node budget, root included; EAGLE-1's tree is cut to it
    depth: int = DecodeConfig.depth
    top_k: int = DecodeConfig.top_k
    tree: str | list | None = None                 # EAGLE-1's tree; None: mc_sim_7b_63 cut to the budget
    lookup_tokens: int = DecodeConfig.lookup_tokens
    chain_tokens: int = 3                          # a chain's drafted tokens (method chain)
    p_min: float = 0.0                             # a chain stops before a draft less probable than this
    min_prob: float | None = None                  # eagle2_sized's floors; None: SIZED_DEFAULT
    expand_prob: float | None = None
    draft_tokens: int = 0                          # the draft vocabulary of every tree method (0: all)
    tuned: dict[str, dict] = field(default_factory=dict)  # method -> settings it was tuned to (autotune)


def static_tree(spec: str | list | None, total_tokens: int) -> tuple[tuple[int, ...], ...]:
    """EAGLE-1's tree: the one given, or mc_sim_7b_63 cut breadth first to `total_tokens` nodes."""
    if spec is None:
        return cut_tree(parse_tree(STATIC_PRESET, 20), total_tokens)
    return parse_tree(spec, 20)


def budget_note(s: Shared, methods: list[str]) -> str | None:
    """What to tell the user when EAGLE-1 cannot match the node budget (its whole tree is smaller)."""
    statics = [m for m in methods if policy(m).static]
    total = s.tuned.get(tuned_as(statics[0]), {}).get("total_tokens", s.total_tokens) if statics else 0
    if statics and s.tree is None and total > STATIC_NODES:
        return (f"note: EAGLE-1's tree {STATIC_PRESET} has {STATIC_NODES} nodes, so a budget of {total} runs it "
                f"whole: the trees do not share a budget")
    return None


def check_methods(methods: list[str], s: Shared) -> None:
    """Refuse unknown names, and floors given where no method uses them."""
    bad = [m for m in methods if m not in OURS + PEERS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(OURS + PEERS)}")
    if (s.min_prob or s.expand_prob) and not any(is_sized(m) for m in methods):
        raise ValueError("--min-prob and --expand-prob size EAGLE-2's tree per step: that is method eagle2_sized "
                         "(this project's addition); the paper's eagle2 keeps a fixed size")
    if s.p_min and not any(policy(m).chain for m in methods):
        raise ValueError("--p-min stops a chain early (method chain); no method given here reads it")


def config_for(name: str, s: Shared) -> DecodeConfig:
    """The DecodeConfig a method runs with; raises ValueError naming a bad setting."""
    if name not in OURS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(OURS)}")
    t = s.tuned.get(tuned_as(name), {})
    total = t.get("total_tokens", s.total_tokens)
    common = dict(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
                  draft_tokens=t.get("draft_tokens", s.draft_tokens))
    p = policy(name)
    if p.plain:
        return DecodeConfig(method=p.growth, **common)
    if p.static:
        tree = static_tree(s.tree, total)
        return DecodeConfig(method=p.growth, tree=tree, total_tokens=len(tree) + 1, **common)
    if p.chain:
        check_number("chain_tokens", s.chain_tokens, *LIMITS["depth"], whole=True)
        return DecodeConfig(method=p.growth, depth=s.chain_tokens, top_k=1, total_tokens=s.chain_tokens + 1,
                            p_min=s.p_min, **common)
    floors = {}
    if is_sized(name):
        keep = t.get("min_prob", SIZED_DEFAULT[0] if s.min_prob is None else s.min_prob)
        grow = t.get("expand_prob", SIZED_DEFAULT[1] if s.expand_prob is None else s.expand_prob)
        if not (keep or grow):
            raise ValueError(f"{name} sizes the tree by confidence: give --min-prob or --expand-prob above 0")
        floors = dict(min_prob=keep, expand_prob=grow)
    return DecodeConfig(method=p.growth, total_tokens=total, depth=t.get("depth", s.depth),
                        top_k=t.get("top_k", s.top_k), lookup=has_lookup(name), lookup_tokens=s.lookup_tokens,
                        **floors, **common)


def settings_of(cfg: DecodeConfig) -> dict:
    """What a config ran with, as plain data for the JSON: only the settings its method uses."""
    out: dict = {"method": cfg.name, "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
                 "top_p": cfg.top_p, "seed": cfg.seed}
    p = policy(cfg.name)
    if p.plain:
        return out
    out["draft_tokens"] = cfg.draft_tokens
    if p.static:
        return {**out, "total_tokens": len(cfg.tree) + 1, "tree": [list(p) for p in cfg.tree]}
    if p.chain:
        return {**out, "chain_tokens": cfg.depth, "p_min": cfg.p_min, "total_tokens": cfg.total_tokens}
    out.update(total_tokens=cfg.total_tokens, depth=cfg.depth, top_k=cfg.top_k)
    if cfg.sized:
        out.update(min_prob=cfg.min_prob, expand_prob=cfg.expand_prob)
    if cfg.lookup:
        out.update(lookup_tokens=cfg.lookup_tokens)
    return out


def tunable(methods: list[str], tree_given: bool) -> list[str]:
    """Which tuned settings `methods` need (`tuned_as`): EAGLE-1's only when its tree is not given."""
    need = {tuned_as(m) for m in methods}
    return [m for m in TUNED if m in need and not (policy(m).static and tree_given)]
