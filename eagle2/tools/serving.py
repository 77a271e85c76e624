"""Tree shapes as serving engines' settings, each checked against its engine's constraints (no torch).

A shape is EAGLE-2's: `steps` drafted levels, `topk` children per expanded node and `num_draft_tokens`
verified nodes, root included (this project's total_tokens). Option names: SGLang's server flags and vLLM's
`speculative_config` keys as their documentation spells them; TensorRT-LLM's from its `EagleDecodingConfig`
reference (`max_draft_len`, `max_total_draft_tokens`, `use_dynamic_tree`, `dynamic_tree_max_topK`). How
TensorRT-LLM's dynamic tree maps onto EAGLE-2's shape, and the constraints it is checked against beyond the
documented `max_draft_len >= 0`, are this project's reading (`ASSUMED`).
"""
from __future__ import annotations

from dataclasses import dataclass

ASSUMED = ("tensorrt_llm: max_draft_len = drafted levels, max_total_draft_tokens = verified nodes without the root, "
           "dynamic_tree_max_topK = children per expanded node; the constraints checked are the tree's own "
           "(what that many levels of top-k can hold), not quoted from TensorRT-LLM")


class ConstraintError(ValueError):
    """A shape an engine would refuse; the message names the engine and the constraint."""


@dataclass(frozen=True)
class Shape:
    steps: int             # drafted levels (depth)
    topk: int              # children per expanded node
    num_draft_tokens: int  # verified nodes, root included

    @property
    def capacity(self) -> int:
        """Drafted nodes EAGLE-2's growth can hold: topk at the first level, topk^2 at each later one."""
        return self.topk + (self.steps - 1) * self.topk ** 2


def check_sglang(s: Shape) -> None:
    """SGLang's EAGLE constraints on --speculative-num-steps / -eagle-topk / -num-draft-tokens."""
    if s.steps < 1 or s.topk < 1:
        raise ConstraintError("sglang: --speculative-num-steps and --speculative-eagle-topk must be at least 1")
    if s.num_draft_tokens < 2:
        raise ConstraintError("sglang: --speculative-num-draft-tokens must be at least 2 (the root and one draft)")
    if s.topk == 1 and s.num_draft_tokens != s.steps + 1:
        raise ConstraintError(f"sglang: with --speculative-eagle-topk 1, --speculative-num-draft-tokens must equal "
                              f"--speculative-num-steps + 1 ({s.steps + 1}), not {s.num_draft_tokens}")
    if s.num_draft_tokens - 1 > s.capacity:
        raise ConstraintError(f"sglang: --speculative-num-draft-tokens - 1 must be <= topk + (steps - 1) * topk^2 "
                              f"= {s.capacity}, not {s.num_draft_tokens - 1}")


ALGORITHMS = {"eagle1": ("EAGLE", "eagle", "Eagle"), "eagle3": ("EAGLE3", "eagle3", "Eagle3")}  # sglang, vllm, trt


def sglang_flags(s: Shape, head: str = "DRAFT_MODEL_PATH", kind: str = "eagle1") -> str:
    """SGLang's launch flags for a shape; `kind` is the head's ("eagle1": EAGLE-1/2 layout, or "eagle3")."""
    check_sglang(s)
    return (f"--speculative-algorithm {ALGORITHMS[kind][0]} --speculative-draft-model-path {head} --speculative-num-steps {s.steps} "
            f"--speculative-eagle-topk {s.topk} --speculative-num-draft-tokens {s.num_draft_tokens}")


def vllm_config(s: Shape, head: str = "DRAFT_MODEL_PATH", kind: str = "eagle1") -> dict:
    """vLLM's `speculative_config` for EAGLE: a chain of `num_speculative_tokens` draft tokens."""
    if s.topk != 1:
        raise ConstraintError("vllm: speculative_config drafts a chain (num_speculative_tokens); a shape with "
                              f"topk {s.topk} > 1 has no equivalent there: recommend a chain for vLLM")
    if s.steps < 1 or s.num_draft_tokens != s.steps + 1:
        raise ConstraintError("vllm: num_speculative_tokens must be at least 1 and a chain verifies it plus the root")
    return {"method": ALGORITHMS[kind][1], "model": head, "num_speculative_tokens": s.steps}


def tensorrt_llm_config(s: Shape, head: str = "DRAFT_MODEL_PATH", kind: str = "eagle1") -> dict:
    """TensorRT-LLM's EagleDecodingConfig options for a dynamic tree (see ASSUMED)."""
    if s.steps < 1 or s.topk < 1:
        raise ConstraintError("tensorrt_llm: max_draft_len and dynamic_tree_max_topK must be at least 1")
    drafts = s.num_draft_tokens - 1
    if drafts < s.steps:
        raise ConstraintError(f"tensorrt_llm: max_total_draft_tokens ({drafts}) must be at least max_draft_len "
                              f"({s.steps}): a tree that deep needs a node on every level")
    if drafts > s.capacity:
        raise ConstraintError(f"tensorrt_llm: max_total_draft_tokens ({drafts}) must be <= dynamic_tree_max_topK + "
                              f"(max_draft_len - 1) * dynamic_tree_max_topK^2 = {s.capacity}")
    return {"decoding_type": ALGORITHMS[kind][2], "speculative_model": head, "max_draft_len": s.steps,
            "max_total_draft_tokens": drafts, "use_dynamic_tree": True, "dynamic_tree_max_topK": s.topk}


@dataclass(frozen=True)
class Pick:
    """A shape with its predicted τ, cost a step and speed (`unit` says in what)."""

    shape: Shape
    tau: float
    cost: float
    unit: str

    @property
    def speed(self) -> float:
        return self.tau / self.cost

    def to_dict(self) -> dict:
        return {"num_draft_tokens": self.shape.num_draft_tokens, "steps": self.shape.steps, "topk": self.shape.topk,
                "tau": round(self.tau, 4), "cost_per_step": round(self.cost, 4), "cost_unit": self.unit,
                "tokens_per_cost_unit": round(self.speed, 4)}


def fastest(taus: dict[tuple[int, int, int], float], cost, unit: str, margin: float = 0.03) -> Pick:
    """The fewest verified nodes predicted within `margin` of the fastest shape SGLang accepts (as the tuner's
    `choose`: near the top the predictions differ by less than their error), at that size's fastest shape.
    `taus`: (num_draft_tokens, steps, topk) -> τ; `cost(shape)`: cost of one step."""
    picks = []
    for (n, d, k), tau in taus.items():
        shape = Shape(d, k, n)
        try:
            check_sglang(shape)
        except ConstraintError:
            continue
        picks.append(Pick(shape, tau, cost(shape), unit))
    if not picks:
        raise ValueError("no shape to recommend")
    top = max(p.speed for p in picks)
    near = [p for p in picks if p.speed >= (1 - margin) * top]
    fewest = min(p.shape.num_draft_tokens for p in near)
    return max((p for p in near if p.shape.num_draft_tokens == fewest), key=lambda p: p.speed)


def interpolate(ms: dict[int, float], n: int) -> float:
    """ms at n (verified rows, or draft levels) from the timed ones: linear between the nearest two, the ends held."""
    lo = max((k for k in ms if k <= n), default=min(ms))
    hi = min((k for k in ms if k >= n), default=max(ms))
    return ms[lo] if hi == lo else ms[lo] + (ms[hi] - ms[lo]) * (n - lo) / (hi - lo)


def cpu_cost(verify_ms: dict[int, float], draft_ms: dict[int, float]):
    """A step's ms on this machine: verifying its rows (interpolated between the timed sizes) plus the rest of a
    step at its depth (drafting, commit), both as the tuner measures them."""
    return lambda s: interpolate(verify_ms, s.num_draft_tokens) + interpolate(draft_ms, s.steps)


def gpu_cost(flat_rows: int, draft_per_level: float):
    """A step in target forwards on a GPU profile: verification flat up to `flat_rows` rows and growing in
    proportion beyond, plus `draft_per_level` of a forward for each drafted level."""
    return lambda s: max(1.0, s.num_draft_tokens / flat_rows) + draft_per_level * s.steps
