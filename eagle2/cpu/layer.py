"""`LeanLlamaLayer`: a Llama decoder layer that computes exactly what the stock one computes, in fewer Python steps.

transformers' `LlamaDecoderLayer` reaches its sums through five submodule calls, two keyword-deprecation wrappers
and an attention-interface lookup per layer; for a 30-layer model's few-row forward on a CPU that Python is
about a tenth of the time. The lean layer holds the stock layer's own submodules (the same weights and the same
state-dict keys) and runs the same tensor operations in the same order: norm, q/k/v, rotary, the cache update,
the model's own attention function, o_proj, the residual, norm, gate/up/act/down, the residual. So its output
is the stock layer's bit for bit (tests/test_kernels.py). It is swapped in at load (`swap_layers`, through
`eagle2.cpu`), shows in `print(model)`, is a `LlamaDecoderLayer` to transformers (its hidden-state recording
still finds it), and hands autograd (training) back to the stock forward.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, eager_attention_forward, rotate_half


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """LlamaRMSNorm's own operations, in its order (float32 throughout here, so its casts are no-ops)."""
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


class LeanLlamaLayer(LlamaDecoderLayer):
    """A LlamaDecoderLayer over another one's submodules, with its forward's Python trimmed (module docstring)."""

    def __init__(self, stock: LlamaDecoderLayer):
        nn.Module.__init__(self)  # not LlamaDecoderLayer's: that would build new weights
        self.hidden_size = stock.hidden_size
        self.gradient_checkpointing = False
        self.self_attn, self.mlp = stock.self_attn, stock.mlp
        self.input_layernorm, self.post_attention_layernorm = stock.input_layernorm, stock.post_attention_layernorm

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache=None, use_cache: bool | None = False,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, past_key_values=None,
                **kwargs) -> torch.Tensor:
        cache = cache if cache is not None else past_key_values
        if torch.is_grad_enabled():
            return super().forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                   cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        attn, mlp = self.self_attn, self.mlp
        x = hidden_states                                        # (B, T, H)
        h = _rms_norm(x, self.input_layernorm)
        shape = (*x.shape[:-1], -1, attn.head_dim)
        q = attn.q_proj(h).view(shape).transpose(1, 2)           # (B, heads, T, D)
        k = attn.k_proj(h).view(shape).transpose(1, 2)           # (B, kv_heads, T, D)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager_attention_forward)
        o, _ = attend(attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling)
        x = x + attn.o_proj(o.reshape(*x.shape[:-1], -1).contiguous())
        h = _rms_norm(x, self.post_attention_layernorm)
        return x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))


def swappable(layer: nn.Module) -> bool:
    """A stock LlamaDecoderLayer (not a subclass, not a head's trimmed layer) with float32 CPU weights."""
    if type(layer) is not LlamaDecoderLayer:
        return False
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(hasattr(n, "variance_epsilon") and hasattr(n, "weight") for n in norms):
        return False
    w = layer.self_attn.q_proj.weight
    return w.dtype == torch.float32 and w.device.type == "cpu"


def swap_layers(model: nn.Module) -> int:
    """Replace every swappable decoder layer of `model` by a LeanLlamaLayer over its submodules; returns how many."""
    todo = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if swappable(child)]
    for parent, name, child in todo:
        setattr(parent, name, LeanLlamaLayer(child))
    return len(todo)
