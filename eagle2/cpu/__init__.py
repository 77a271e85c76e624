"""Faster CPU kernels, swapped in at load through one entry point; the engine imports none of this.

`accelerate(model, plan)` replaces every float32 `nn.Linear` of a model with a `FastLinear` (the module tree
shows it); `swap_layers(model)` its stock Llama decoder layers with `LeanLlamaLayer`s (the same operations, less
Python); `draft_linear`, `draft_level`, `exact_greedy` and `fused_stack` give the decoder the layer that scores
the draft's lm_head rows, a draft level in one kernel call, the target's argmax and its decoder layers in one
kernel call, which it takes as plain callables. `plan_for` chooses the kernels once per machine.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .argmax import GreedyTokens
from .attention import use_tree_sdpa
from .layer import FusedStack, LeanLlamaLayer, swap_layers
from .level import FusedDraft
from .linear import FastLinear
from .onednn import available
from .plan import KERNELS, KernelPlan, plan_for
from .rows import failure as row_kernel_failure
from .rows import in_background as build_in_background

__all__ = ["KERNELS", "FastLinear", "FusedDraft", "KernelPlan", "LeanLlamaLayer", "accelerate",
           "build_in_background", "describe", "draft_level", "draft_linear", "exact_greedy", "four_bit_layers",
           "fused_stack", "plan_for", "row_kernel_failure", "swap_layers", "use_tree_sdpa"]


def accelerate(model: torch.nn.Module, plan: KernelPlan, int8_rows: bool = False, four_bit: bool = True) -> int:
    """Swap every float32 (or native bf16) CPU nn.Linear of `model` for a FastLinear following `plan` (with int8
    weight rows: a draft head; with `four_bit`, weights that are exactly four-bit codes run from them: see
    `four_bit_layers`); returns how many. All weights are packed before any layer is swapped, so a
    oneDNN failure (a RuntimeError) leaves the model as it was."""
    if not plan.onednn and not int8_rows:
        return 0
    todo = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is torch.nn.Linear and available(child.weight)]
    fast = [FastLinear.from_linear(c, plan.stock_rows, plan.own_rows, packed=plan.onednn, int8_rows=int8_rows,
                                   four_bit=four_bit) for _, _, c in todo]
    for (parent, name, _), f in zip(todo, fast):
        setattr(parent, name, f)
    return len(fast)


def four_bit_layers(model: torch.nn.Module) -> tuple[int, int]:
    """(how many of `model`'s FastLinears run from exact four-bit codes, the bytes those codes take)."""
    fast = [m for m in model.modules() if isinstance(m, FastLinear) and m.codes is not None]
    return len(fast), sum(t.numel() * t.element_size() for m in fast for t in (m.codes, m.d, m.m))


def describe(plan: KernelPlan, target: torch.nn.Module, lean: int, stacked: bool = False,
             draft_levels: bool = False) -> str:
    """The kernels in words: the plan, the layer kind (`lean`: how many were swapped; `stacked`: all of them in
    one call, `fused_stack`), the four-bit layers and whether a draft level is one call (`draft_level`)."""
    fused = lean and all(getattr(layer, "fused", False) for layer in target.model.layers)
    four, four_bytes = four_bit_layers(target)
    layers = "; fused Llama layers" + (" in one call" if stacked else "") + " (1 to 32 rows)"
    return (plan.describe() + (layers if fused else "; lean Llama layers" if lean else "")
            + (f"; {four} layers from exact four-bit codes (+{four_bytes / 1e6:.0f} MB)" if four else "")
            + ("; a draft level in one call" if draft_levels else ""))


def draft_linear(plan: KernelPlan, int8_rows: bool = False) -> Callable[[torch.Tensor], torch.nn.Module]:
    """For the decoder: the layer that scores a (M, H) block of lm_head rows for the draft."""
    return lambda w: FastLinear(w, None, plan.stock_rows, plan.own_rows, packed=plan.onednn, int8_rows=int8_rows)


def draft_level(head: torch.nn.Module, rows: torch.nn.Module) -> Callable | None:
    """For the decoder: `head`'s levels over the lm_head rows `rows` (a `draft_linear` layer) in one kernel call
    each, where they apply (an EAGLE-1/2 head with int8 rows and a fused layer), else None."""
    return FusedDraft(head, rows) if FusedDraft.applies(head, rows) else None


def exact_greedy(lm_head: torch.nn.Module) -> Callable[[torch.Tensor], list[int]] | None:
    """For the decoder: the target's exact argmax through a shortlist of int8 (or bf16) bounds, where it applies."""
    return GreedyTokens(lm_head) if GreedyTokens.applies(lm_head) else None


def fused_stack(target: torch.nn.Module) -> Callable | None:
    """For the decoder: the target body's fused layers in one kernel call for a few rows, where every layer is
    fused (`swap_layers`), else None."""
    body = getattr(target, getattr(target, "base_model_prefix", "model"), None)
    return FusedStack(body) if body is not None and FusedStack.applies(body) else None
