"""Tree attention that reads grouped key/value heads in place.

transformers' SDPA attention (`integrations/sdpa_attention.py`) copies every key/value head once per query
head (`repeat_kv`: the whole cache, in every layer) whenever several query rows come with a mask, which is
every tree verify and every draft level. PyTorch's SDPA can read the grouped heads directly
(`enable_gqa=True`). `tree_sdpa` does that for masked multi-row queries and hands every other call to
transformers' own function, so prefill and one-token steps are untouched. The result is the same to the bit
(tests/test_attention.py); what it saves per verify is in docs/how-it-works.md.

`use_tree_sdpa(model)` registers the function under NAME, for attention and for mask building (the same
masks as "sdpa"), and switches a model that runs "sdpa" to it.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "eagle2_tree_sdpa"


def tree_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs) -> tuple[torch.Tensor, None]:
    """(B, heads, Q, D) queries over (B, kv_heads, K, D) keys/values -> (B, Q, heads, D), as `sdpa`."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    special = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
    if not grouped or attention_mask is None or query.shape[2] == 1 or dropout or special:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    AttentionInterface.register(NAME, tree_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_tree_sdpa(model: torch.nn.Module) -> bool:
    """Switch `model` (a transformers model, or our draft head) from "sdpa" to `tree_sdpa`; returns whether it
    did. Any other attention implementation is left alone."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    config._attn_implementation = NAME
    return True
