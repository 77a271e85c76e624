"""The page's inputs as one request, checked and turned into the three DecodeConfigs (no gradio here).

Widget bounds come from eagle2.config.LIMITS, and DecodeConfig checks them again, so a value that
slips past a widget (an API call, an edited request) is refused with the same message.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from eagle2.config import ASSETS, LIMITS, DecodeConfig, load_tree_presets, parse_tree

CUSTOM = "custom"
MAX_PROMPT_CHARS = 20_000
RANK_LIMIT = LIMITS["top_k"][1]  # a static tree may use child ranks up to the largest allowed top-k


@dataclass(frozen=True)
class RunRequest:
    """Everything the Generate button sends."""

    prompt: str
    preset: str
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    total_tokens: int = 26
    depth: int = 5
    top_k: int = 8
    tree_choice: str = "mc_sim_7b_63"
    tree_json: str = ""
    with_vanilla: bool = True
    lookup: bool = False   # EAGLE-2 gets a prompt-lookup branch
    min_prob: float = 0.0     # EAGLE-2 sizes its tree per step: keep floor (0 = none; total_tokens stays the cap)
    expand_prob: float = 0.0  # and expand floor (0 = none; depth stays the cap)


def tree_choices() -> list[str]:
    """Static tree presets from assets/trees.json, then 'custom'."""
    return [*load_tree_presets(), CUSTOM]


def static_tree(choice: str, tree_json: str) -> tuple[tuple[int, ...], ...]:
    """The static tree's paths from the dropdown (or the custom JSON); raises ValueError with the reason."""
    if choice == CUSTOM:
        if not (tree_json or "").strip():
            raise ValueError("custom static tree: enter a JSON list of paths such as [[0], [1], [0, 0]]")
        try:
            spec = json.loads(tree_json)
        except json.JSONDecodeError as e:
            raise ValueError(f"custom static tree is not valid JSON: {e}") from None
        return parse_tree(spec, RANK_LIMIT)
    if choice not in load_tree_presets():
        raise ValueError(f"unknown static tree {choice!r}; choose one of {', '.join(tree_choices())}")
    return parse_tree(choice, RANK_LIMIT)


def _number(name: str, value: object, kind: type) -> int | float:
    """A widget value as int/float; None or text gives a ValueError naming the setting."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    if kind is int:
        if v != int(v):
            raise ValueError(f"{name} must be a whole number, not {value!r}")
        return int(v)
    return v


def check_prompt(prompt: str | None) -> str:
    """The prompt, or a ValueError when it is empty or too long to be a prompt."""
    if prompt is None or not prompt.strip():
        raise ValueError("the prompt is empty: type something or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are accepted")
    return prompt


def configs(req: RunRequest) -> dict[str, DecodeConfig]:
    """DecodeConfigs for eagle2, eagle1 and vanilla sharing every setting; raises ValueError naming the bad one."""
    common = dict(max_new_tokens=_number("max new tokens", req.max_new_tokens, int),
                  temperature=_number("temperature", req.temperature, float),
                  top_p=_number("top-p", req.top_p, float), seed=_number("seed", req.seed, int),
                  total_tokens=_number("total tokens", req.total_tokens, int),
                  depth=_number("depth", req.depth, int), top_k=_number("top-k", req.top_k, int),
                  tree=static_tree(req.tree_choice, req.tree_json))
    if not isinstance(req.lookup, bool):
        raise ValueError(f"prompt-lookup branch must be true or false, not {req.lookup!r}")
    floors = dict(min_prob=_number("keep floor", req.min_prob, float),
                  expand_prob=_number("expand floor", req.expand_prob, float))
    return {m: DecodeConfig(method=m, lookup=req.lookup and m == "eagle2", **common,
                            **(floors if m == "eagle2" else {}))
            for m in ("eagle2", "eagle1", "vanilla")}


def budget_markdown(total_tokens: object, tree_choice: str, tree_json: str, lookup: bool = False,
                    depth: object = 0, min_prob: object = 0.0, expand_prob: object = 0.0) -> str:
    """Verified nodes per step for each tree (root included), and whether the budgets match."""
    try:
        static = len(static_tree(tree_choice, tree_json)) + 1
    except ValueError as e:
        return f"⚠ Static tree: {e}"
    try:
        dynamic = _number("total tokens", total_tokens, int)
    except ValueError as e:
        return f"⚠ {e}"
    line = (f"Nodes verified per step, root included: EAGLE-2 **{dynamic}** · EAGLE-1 **{static}** "
            f"({static - 1} tree nodes + root).")
    try:
        floor = _number("keep floor", min_prob or 0.0, float)
        grow = _number("expand floor", expand_prob or 0.0, float)
    except ValueError as e:
        return f"⚠ {e}"
    if floor > 0 or grow > 0:
        line = (f"Nodes verified per step, root included: EAGLE-2 **up to {dynamic}**, sized per step (nodes the draft"
                f" gives at least {floor:g} cumulative probability, expanded from {grow:g}) · EAGLE-1 **{static}**"
                f" ({static - 1} tree nodes + root). ⚠ EAGLE-2's budget changes from step to step, so the comparison"
                f" is not like for like.")
    elif dynamic != static:
        line += " ⚠ The budgets differ, so the comparison is not like for like."
    if lookup:
        n = DecodeConfig.lookup_tokens  # the field's default, without building (and validating) a config
        line += (f" The prompt-lookup branch (up to {n} tokens copied from the text so far, on steps where it offers"
                 f" a match; the first {depth} scored by the draft) is verified on top of EAGLE-2's tree: up to"
                 f" {n} more nodes on those steps.")
    return line


def sglang_flags(depth: object, top_k: object, total_tokens: object) -> str:
    """SGLang launch flags that serve the same dynamic tree shape."""
    return (f"--speculative-algorithm EAGLE --speculative-num-steps {depth} "
            f"--speculative-eagle-topk {top_k} --speculative-num-draft-tokens {total_tokens}")


def load_examples() -> list[dict[str, str]]:
    """Example prompts of several kinds from assets/examples.json."""
    return json.loads((ASSETS / "examples.json").read_text())


def settings_meta(cfgs: dict[str, DecodeConfig], req: RunRequest) -> dict:
    """The settings of a run as plain data for the trace."""
    c = cfgs["eagle2"]
    return {"max_new_tokens": c.max_new_tokens, "temperature": c.temperature, "top_p": c.top_p,
            "seed": c.seed, "total_tokens": c.total_tokens, "depth": c.depth, "top_k": c.top_k, "lookup": c.lookup,
            "min_prob": c.min_prob, "expand_prob": c.expand_prob,
            "static_tree": req.tree_choice, "static_paths": [list(p) for p in c.tree]}
