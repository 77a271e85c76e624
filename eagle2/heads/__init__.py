"""The draft heads, one module per layout they load: `eagle` (the EAGLE-1/2 head: fc over [token embedding;
target feature] and one decoder layer) and `eagle3` (the EAGLE-3 head: the target's hidden states from three
layers, fused, with its own draft vocabulary). `eagle.load_head` reads either layout from disk. Both kinds
offer the decoder the same small interface, `Head`; `head_kind` says which one a head is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from transformers import LlamaConfig


class Head(Protocol):
    """What the decoder asks of a draft head, whatever its kind."""

    kind: str                               # "eagle1" (the EAGLE-1/2 layout, both papers) or "eagle3"
    config: LlamaConfig                     # its one layer's shapes (the decoder sizes the head's cache by it)
    feature_layers: tuple[int, ...] | None  # the target hidden states it reads; None: the last, after the final norm
    draft_vocab: torch.Tensor | None        # target ids it drafts over, preferred first; None: all, in id order

    @property
    def dtype(self) -> torch.dtype:
        """The dtype it computes in."""

    def __call__(self, token_ids: torch.Tensor, features: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """token_ids (B, T), features (B, T, F), additive mask (B, 1, T, keys) -> its features (B, T, H)."""

    def target_features(self, out) -> torch.Tensor:
        """Its input feature (B, T, F) from a target forward's output (with `hidden_states` when
        `feature_layers` is set)."""

    def draft_weight(self, lm_head: torch.Tensor, n: int) -> torch.Tensor:
        """The (n, H) rows scoring the first n tokens of its draft vocabulary (`lm_head`: the target's)."""

    def scorer(self, rows: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Its draft logits from its features (Q, H) -> (Q, n), given `rows`: the layer over `draft_weight`."""


def head_kind(head: Head) -> str:
    """"eagle3" or "eagle1" (the EAGLE-1/2 head: one layout for both papers)."""
    return head.kind
