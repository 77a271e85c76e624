"""The page's inputs as one request, checked and turned into the three DecodeConfigs (no gradio here).

Widget bounds come from eagle2.config.LIMITS, and DecodeConfig checks them again, so a value that
slips past a widget (an API call, an edited request) is refused with the same message.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from eagle2.tools.profile import tuned_config
from eagle2.tools.serving import Shape, sglang_flags
from eagle2.config import ASSETS, LIMITS, STATIC_PRESET, DecodeConfig, cut_tree, load_tree_presets, parse_tree
from eagle2.decode.methods import LABELS as METHOD_LABELS
from eagle2.decode.methods import Shared
from eagle2.policies import CHAIN, DYNAMIC, PANELS, PLAIN, STATIC, policy
from eagle2.tools.engines import engine_config
from eagle2.inputs import check_number, check_text, load_json, shown
from eagle2.inputs import kind as kind_of

CUSTOM = "custom"
CUT = "mc_sim_7b_63 cut to the budget"  # EAGLE-1's tree cut breadth first to EAGLE-2's node budget
MAX_PROMPT_CHARS = 20_000
RANK_LIMIT = LIMITS["top_k"][1]  # a static tree may use child ranks up to the largest allowed top-k
PAGE_MAX_NEW = 64  # shorter answers than the command line's default: a visitor waits for three decodes
# How long one Generate may decode, all its methods together (each gets an equal share of what is left), so that
# no visitor holds the shared model for long; EAGLE2_RUN_BUDGET_S overrides. On a ZeroGPU Space the whole Generate
# runs in one GPU slot, and SLOT_MARGIN_S of it stays for loading the model and drawing.
RUN_BUDGET_S = 120.0
SLOT_MARGIN_S = 60.0
# How the page sizes the trees: the paper's EAGLE-2 at its fastest size on this machine (both trees at that
# budget), the paper's own settings, or the sliders.
SIZINGS = {"tuned": "same budget, the fastest for this machine",
           "paper": "the paper's settings (EAGLE-2 60 nodes, depth 6, top-k 10; EAGLE-1 mc_sim_7b_63)",
           "custom": "my settings below"}
PAPER = {"total_tokens": 60, "depth": 6, "top_k": 10}
_D = DecodeConfig()
# What each tree panel can run: the page's own EAGLE-2 or EAGLE-1 (sized by the controls above), a chain, or
# whatever an engine's flags describe (eagle2/tools/engines.py). The panels default to EAGLE-2 beside EAGLE-1.
ENGINE = "engine"
PANEL_POLICIES = {DYNAMIC: "EAGLE-2 (the sizing above)", STATIC: "EAGLE-1 (the tree above)",
                  CHAIN: "chain of N (the draft's top-1 N times)", ENGINE: "an engine's flags"}
CHAIN_DEFAULT = 3


@dataclass(frozen=True)
class RunRequest:
    """Everything the Generate button sends."""

    prompt: str
    preset: str
    max_new_tokens: int = PAGE_MAX_NEW
    temperature: float = _D.temperature
    top_p: float = _D.top_p
    seed: int = _D.seed
    total_tokens: int = _D.total_tokens
    depth: int = _D.depth
    top_k: int = _D.top_k
    tree_choice: str = CUT
    tree_json: str = ""
    with_vanilla: bool = True
    lookup: bool = False   # EAGLE-2 gets a prompt-lookup branch (eagle2_lookup, ours)
    min_prob: float = 0.0     # EAGLE-2 sizes its tree per step (eagle2_sized, ours): keep floor (0 = none)
    expand_prob: float = 0.0  # and expand floor (0 = none; depth stays the cap)
    sizing: str = "custom"    # one of SIZINGS; the page starts on "tuned" (CPU) or "paper" (CUDA)
    left_policy: str = DYNAMIC   # what the left tree panel runs (PANEL_POLICIES)
    left_arg: str = ""           # its chain length, or its engine flags
    right_policy: str = STATIC   # and the right one
    right_arg: str = ""


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable `name`, else `default`; ValueError naming it."""
    raw = os.environ.get(name, "")
    try:
        seconds = float(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {raw!r}") from None
    if not seconds > 0:
        raise ValueError(f"{name} must be positive, not {raw!r}")
    return seconds


def run_budget_s(slot_s: float | None = None) -> float:
    """Seconds one Generate may decode: EAGLE2_RUN_BUDGET_S, else RUN_BUDGET_S; within a GPU slot of `slot_s`
    seconds, never more than the slot less SLOT_MARGIN_S (past the slot the platform, not the page, ends it)."""
    budget = env_seconds("EAGLE2_RUN_BUDGET_S", RUN_BUDGET_S)
    if slot_s is not None:
        budget = min(budget, max(slot_s - SLOT_MARGIN_S, slot_s / 2))
    return budget


def tree_choices() -> list[str]:
    """EAGLE-1's tree cut to the budget, the static tree presets from assets/trees.json, then 'custom'."""
    return [CUT, *load_tree_presets(), CUSTOM]


def static_tree(choice: str, tree_json: str, total_tokens: int = _D.total_tokens) -> tuple[tuple[int, ...], ...]:
    """The static tree's paths from the dropdown (or the custom JSON); raises ValueError with the reason."""
    check_text("static tree", choice, MAX_PROMPT_CHARS, tree_choices())
    if choice == CUT:
        return cut_tree(parse_tree(STATIC_PRESET, RANK_LIMIT), total_tokens)
    if choice == CUSTOM:
        if not (check_text("custom static tree", tree_json or "", MAX_PROMPT_CHARS)).strip():
            raise ValueError("custom static tree: enter a JSON list of paths such as [[0], [1], [0, 0]]")
        return parse_tree(load_json(tree_json, "the custom static tree"), RANK_LIMIT)
    return parse_tree(choice, RANK_LIMIT)


def _number(name: str, value: object, kind: type) -> int | float:
    """A widget value as int/float; None or text gives a ValueError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number, not {shown(value)} ({kind_of(value)})")
    if isinstance(value, int):  # exact, however large: the range check names the limit
        if kind is int or abs(value) < 2**1000:
            return value if kind is int else float(value)
        raise ValueError(f"{name} must be a number of ordinary size, not {shown(value)}")
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {shown(value)}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, not {shown(value)}")
    if kind is int:
        if v != int(v):
            raise ValueError(f"{name} must be a whole number, not {shown(value)}")
        return int(v)
    return v


def check_prompt(prompt: str | None) -> str:
    """The prompt, or a ValueError when it is empty or too long to be a prompt."""
    if prompt is None or isinstance(prompt, str) and not prompt.strip():
        raise ValueError("the prompt is empty: type something or pick an example")
    return check_text("the prompt", prompt, MAX_PROMPT_CHARS)


def sizes(req: RunRequest, profile: dict | None = None) -> tuple[dict, tuple[tuple[int, ...], ...]]:
    """EAGLE-2's size ({total_tokens, depth, top_k, draft_tokens}) and EAGLE-1's tree for the request's sizing.
    "tuned" takes the machine's profile (eagle2/tools/profile.py; the paper's settings where there is none, as on
    CUDA) with EAGLE-1 cut to the same budget; "paper" the paper's settings against the whole mc_sim_7b_63."""
    check_text("sizing", req.sizing, MAX_PROMPT_CHARS, SIZINGS)
    for name, label in (("total_tokens", "total tokens"), ("depth", "depth"), ("top_k", "top-k")):
        check_number(name, _number(label, getattr(req, name), int), *LIMITS[name], whole=True)  # even unused
    check_text("static tree", req.tree_choice, MAX_PROMPT_CHARS, tree_choices())
    if req.sizing == "tuned" and profile is not None:
        tuned = tuned_config(profile, _D)
        size = {k: getattr(tuned, k) for k in ("total_tokens", "depth", "top_k", "draft_tokens")}
        return size, static_tree(CUT, "", size["total_tokens"])
    if req.sizing in ("tuned", "paper"):
        return {**PAPER, "draft_tokens": 0}, static_tree(STATIC_PRESET, "")
    size = {"total_tokens": _number("total tokens", req.total_tokens, int), "depth": _number("depth", req.depth, int),
            "top_k": _number("top-k", req.top_k, int), "draft_tokens": 0}
    return size, static_tree(req.tree_choice, req.tree_json, size["total_tokens"])


def configs(req: RunRequest, profile: dict | None = None) -> dict[str, DecodeConfig]:
    """DecodeConfigs for eagle2 (or our variant the floors and lookup box ask for), eagle1 and vanilla sharing
    every other setting, the draft vocabulary included; raises ValueError naming the bad one."""
    size, tree = sizes(req, profile)
    common = dict(max_new_tokens=_number("max new tokens", req.max_new_tokens, int),
                  temperature=_number("temperature", req.temperature, float),
                  top_p=_number("top-p", req.top_p, float), seed=_number("seed", req.seed, int),
                  draft_tokens=size["draft_tokens"])
    if not isinstance(req.with_vanilla, bool):
        raise ValueError(f"also run plain decoding (with_vanilla) must be true or false, not {shown(req.with_vanilla)}")
    if not isinstance(req.lookup, bool):
        raise ValueError(f"prompt-lookup branch must be true or false, not {shown(req.lookup)}")
    floors = dict(min_prob=_number("keep floor", req.min_prob, float),
                  expand_prob=_number("expand floor", req.expand_prob, float))
    page = {DYNAMIC: DecodeConfig(method=DYNAMIC, lookup=req.lookup, total_tokens=size["total_tokens"],
                                  depth=size["depth"], top_k=size["top_k"], **floors, **common),
            STATIC: DecodeConfig(method=STATIC, tree=tree, total_tokens=len(tree) + 1, **common)}
    left, right = PANELS
    return {left: panel_config(req.left_policy, req.left_arg, page, common, "left")[0],
            right: panel_config(req.right_policy, req.right_arg, page, common, "right")[0],
            PLAIN: DecodeConfig(method=PLAIN, **common)}


def panel_config(choice: str, arg: str, page: dict[str, DecodeConfig], common: dict,
                 side: str) -> tuple[DecodeConfig, str | None]:
    """A tree panel's config and, where it is not the page's own EAGLE-2 or EAGLE-1, its name in its own terms
    ("chain of 3", "SGLang: steps 3, ..."); ValueError naming the panel and what is wrong."""
    check_text(f"the {side} panel's policy", choice, MAX_PROMPT_CHARS, PANEL_POLICIES)
    text = check_text(f"the {side} panel's chain length or engine flags", arg or "", MAX_PROMPT_CHARS).strip()
    if choice in page:
        return page[choice], None
    shared = Shared(max_new_tokens=common["max_new_tokens"], temperature=common["temperature"],
                    top_p=common["top_p"], seed=common["seed"], draft_tokens=common["draft_tokens"])
    if choice == CHAIN:
        n = _number(f"the {side} panel's chain length", text or CHAIN_DEFAULT, int)
        check_number(f"the {side} panel's chain length", n, *LIMITS["depth"], whole=True)
        return DecodeConfig(method=CHAIN, depth=n, top_k=1, total_tokens=n + 1, **common), f"chain of {n}"
    if not text:
        raise ValueError(f"the {side} panel runs an engine's flags: paste them, e.g. --speculative-num-steps 3 "
                         "--speculative-eagle-topk 4 --speculative-num-draft-tokens 8")
    try:
        run, cfg = engine_config(text, shared)
    except ValueError as e:
        raise ValueError(f"the {side} panel's engine flags: {e}") from None
    return cfg, run.terms


def panels_meta(cfgs: dict[str, DecodeConfig], req: RunRequest) -> dict[str, dict]:
    """Each tree panel's policy as it ran, its label in its own terms and its verified nodes a step (root
    included; "up to N" where confidence sizes the tree), for the trace and the page's views."""
    out = {}
    for slot, choice, arg, side in ((PANELS[0], req.left_policy, req.left_arg, "left"),
                                    (PANELS[1], req.right_policy, req.right_arg, "right")):
        cfg = cfgs[slot]
        terms = None if choice in (DYNAMIC, STATIC) else panel_config(choice, arg, {}, _common(cfg), side)[1]
        p = policy(cfg.name)
        nodes = len(cfg.tree) + 1 if p.static else cfg.total_tokens
        out[slot] = {"policy": cfg.name, "label": terms, "nodes": f"up to {nodes}" if cfg.sized else nodes}
    return out


def _common(cfg: DecodeConfig) -> dict:
    return dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                draft_tokens=cfg.draft_tokens)


def budget_markdown(total_tokens: object, tree_choice: str, tree_json: str, lookup: bool = False,
                    depth: object = 0, min_prob: object = 0.0, expand_prob: object = 0.0, sizing: str = "custom",
                    profile: dict | None = None, left_policy: str = DYNAMIC, left_arg: str = "",
                    right_policy: str = STATIC, right_arg: str = "") -> str:
    """Which comparison the page shows: verified nodes per step for each tree (root included), whether the
    budgets match, and which EAGLE-2 runs (the paper's, or our variant); each panel's policy where one was
    picked."""
    req = RunRequest(prompt="", preset="", total_tokens=total_tokens, depth=depth or _D.depth,
                     tree_choice=tree_choice, tree_json=tree_json, lookup=bool(lookup),
                     min_prob=min_prob or 0.0, expand_prob=expand_prob or 0.0, sizing=sizing,
                     left_policy=left_policy, left_arg=left_arg or "", right_policy=right_policy,
                     right_arg=right_arg or "")
    try:
        cfg = configs(req, profile)
        if (left_policy, right_policy) != PANELS:
            return _panels_line(cfg, req)
    except ValueError as e:
        return f"⚠ {e}"
    dynamic, static = cfg["eagle2"].total_tokens, len(cfg["eagle1"].tree) + 1
    name = METHOD_LABELS[cfg["eagle2"].name]
    if sizing == "tuned":
        head = (f"Comparing at the budget tuned for this machine (measured {profile['measured']}; "
                f"{profile.get('how', 'timed once')}): " if profile else
                "Comparing at the budget tuned for this machine (measured on the first Generate, up to a minute; "
                "the paper's settings where nothing is measured, as on a GPU): ")
    elif sizing == "paper":
        head = "Comparing at the paper's settings: "
    else:
        head = "Comparing at your settings: "
    line = (f"{head}{name} **{dynamic}** nodes verified per step, depth {cfg['eagle2'].depth}, top-k "
            f"{cfg['eagle2'].top_k} · EAGLE-1 **{static}** ({static - 1} tree nodes + root).")
    if cfg["eagle2"].sized:
        line = (f"{head}{name} **up to {dynamic}** nodes, sized per step (nodes the draft gives at least "
                f"{cfg['eagle2'].min_prob:g} cumulative probability, expanded from {cfg['eagle2'].expand_prob:g})"
                f" · EAGLE-1 **{static}** ({static - 1} tree nodes + root). ⚠ EAGLE-2's budget changes from step "
                "to step, so the comparison is not like for like.")
    elif sizing == "tuned" and not profile:  # nothing measured yet: the numbers above are a GPU's fallback
        line = (f"{head}both methods then get the same number of nodes. Where nothing is measured, as on a GPU: "
                f"{name} {dynamic} nodes, depth {cfg['eagle2'].depth}, top-k {cfg['eagle2'].top_k} against EAGLE-1's "
                f"whole {static}-node tree.")
    elif dynamic != static:
        line += " ⚠ The budgets differ, so the comparison is not like for like."
    if lookup:
        n = DecodeConfig.lookup_tokens
        line += (f" The prompt-lookup branch (ours: up to {n} tokens copied from the text so far, on steps where it"
                 f" offers a match; the first {cfg['eagle2'].depth} scored by the draft) joins EAGLE-2's pool:"
                 f" its nodes compete for the budget, and those left out are verified on top, up to {n} more.")
    return line


def _panels_line(cfgs: dict[str, DecodeConfig], req: RunRequest) -> str:
    """The budget line when the panels run policies of the visitor's choosing."""
    panels = panels_meta(cfgs, req)
    parts = []
    for side, slot in zip(("Left", "Right"), PANELS):
        p = panels[slot]
        name = p["label"] or METHOD_LABELS.get(p["policy"], p["policy"])
        parts.append(f"{side} panel: {name}, **{p['nodes']}** nodes verified per step (root included)")
    line = "Comparing " + " · ".join(parts) + "."
    a, b = (panels[s]["nodes"] for s in PANELS)
    if a != b:
        line += (" ⚠ The two panels do not verify the same number of nodes, so their τ is not a like-for-like "
                 "comparison.")
    return line


def page_flags(preset, depth: object, top_k: object, total_tokens: object, bundle=None) -> str:
    """SGLang launch flags that serve the same dynamic tree shape with the preset's head (the paper's EAGLE-2:
    SGLang has no floors), checked as `diagnose` checks them; the head kind is the loaded bundle's, else the
    preset's. A shape SGLang would refuse gives the reason instead."""
    kind = bundle.head_kind if bundle is not None else getattr(preset, "head_kind", "eagle1")
    head = (getattr(preset, "head", None) or "DRAFT_MODEL_PATH") if preset is not None else "DRAFT_MODEL_PATH"
    try:
        shape = Shape(steps=_number("depth", depth, int), topk=_number("top-k", top_k, int),
                      num_draft_tokens=_number("total tokens", total_tokens, int))
        return sglang_flags(shape, head=head, kind=kind)
    except ValueError as e:  # ConstraintError included: say which constraint, as diagnose does
        return f"# no SGLang flags for this shape: {e}"


def load_examples() -> list[dict[str, str]]:
    """Example prompts of several kinds from assets/examples.json."""
    return json.loads((ASSETS / "examples.json").read_text())


def settings_meta(cfgs: dict[str, DecodeConfig], req: RunRequest) -> dict:
    """The settings of a run as plain data for the trace, with the name of the EAGLE-2 method that ran."""
    c, s = cfgs["eagle2"], cfgs["eagle1"]
    static = {"tuned": CUT, "paper": STATIC_PRESET}.get(req.sizing, req.tree_choice)
    return {"eagle2_method": c.name, "sizing": req.sizing,
            "max_new_tokens": c.max_new_tokens, "temperature": c.temperature, "top_p": c.top_p,
            "seed": c.seed, "total_tokens": c.total_tokens, "depth": c.depth, "top_k": c.top_k, "lookup": c.lookup,
            "min_prob": c.min_prob, "expand_prob": c.expand_prob, "draft_tokens": c.draft_tokens,
            "static_tree": static, "static_nodes": len(s.tree) + 1, "static_paths": [list(p) for p in s.tree],
            "panels": panels_meta(cfgs, req)}
