"""`LeanLlamaLayer`: a Llama decoder layer that computes exactly what the stock one computes, in fewer Python steps.

transformers' `LlamaDecoderLayer` reaches its sums through five submodule calls, two keyword-deprecation wrappers
and an attention-interface lookup per layer; for a 30-layer model's few-row forward on a CPU that Python is
about a tenth of the time. The lean layer holds the stock layer's own submodules (the same weights and the same
state-dict keys) and runs the same tensor operations in the same order: norm, q/k/v, rotary, the cache update,
the model's own attention function, o_proj, the residual, norm, gate/up/act/down, the residual. So its output
is the stock layer's bit for bit (tests/test_kernels.py). It is swapped in at load (`swap_layers`, through
`eagle2.cpu`), shows in `print(model)`, is a `LlamaDecoderLayer` to transformers (its hidden-state recording
still finds it), and hands autograd (training) back to the stock forward.

With `fused` (the default where the row kernel builds), a forward of 1 to 32 rows over a cache with room
(eagle2/decode/cache.py, `RoomyLayer.room`) runs the whole layer in one call of the row kernel's extension
(`llama_layer` in eagle2/cpu/csrc/rows_linear.cpp): the same weights and the same linear sums (float32 rows or
their exact four-bit codes), with the norms, rotary, softmax and attention sums in float32 in an order of their
own, so its output can differ from the stock layer's in the last bits; greedy output is checked against
transformers' on every bench prompt. An EAGLE-1/2 head's layer (no input norm, int8 rows) is swapped and fused
too. Anything else (prefill, autograd, a batch, a cache without room) takes the lean path above.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, eager_attention_forward, rotate_half

from . import linear
from . import rows as rowkernel
from .linear import FastLinear

_NONE_U8, _NONE_F32 = torch.empty(0, dtype=torch.uint8), torch.empty(0)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """LlamaRMSNorm's own operations, in its order (float32 throughout here, so its casts are no-ops)."""
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


class LeanLlamaLayer(LlamaDecoderLayer):
    """A LlamaDecoderLayer over another one's submodules, with its forward's Python trimmed (module docstring)."""

    def __init__(self, stock: LlamaDecoderLayer, fused: bool = False):
        nn.Module.__init__(self)  # not LlamaDecoderLayer's: that would build new weights
        self.hidden_size = stock.hidden_size
        self.gradient_checkpointing = False
        self.self_attn, self.mlp = stock.self_attn, stock.mlp
        self.input_layernorm, self.post_attention_layernorm = stock.input_layernorm, stock.post_attention_layernorm
        self._input_norm = not isinstance(stock.input_layernorm, nn.Identity)  # an EAGLE head's layer has none
        cfg = stock.self_attn.config
        self.fused = (fused and rowkernel.load() is not None and getattr(cfg, "hidden_act", None) == "silu"
                      and float(getattr(cfg, "attention_dropout", 0.0) or 0.0) == 0.0)
        self.__dict__["_pack"] = (None, None)  # (the FastLinears' kernel tuples it was built from, the tensors)

    def extra_repr(self) -> str:
        return "fused: 1 to 32 rows in one kernel call" if self.fused else ""

    def _linears(self) -> list[torch.Tensor] | None:
        """q, k, v, o, gate, up, down as the fused kernel takes them (weight, codes, d, m), or None when one of
        them is not a bias-free float32 FastLinear. Rebuilt when a FastLinear derived its kernels again."""
        attn, mlp = self.self_attn, self.mlp
        lins = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        fast = tuple(getattr(lin, "_fast", None) for lin in lins)
        built, tensors = self.__dict__["_pack"]
        if built is not None and all(a is b for a, b in zip(built, fast)):
            return tensors
        tensors = []
        for lin, f in zip(lins, fast):  # f: (weight, bias, packed, int8 rows, their scales, four-bit codes)
            if not isinstance(lin, FastLinear) or f[1] is not None or f[0].dtype != torch.float32:
                tensors = None
                break
            codes = f[5] or ((f[3], f[4], _NONE_F32) if f[3] is not None else (_NONE_U8, _NONE_F32, _NONE_F32))
            tensors += [f[0].detach().contiguous(), *codes]
        self.__dict__["_pack"] = (fast, tensors)
        return tensors

    def _fused(self, x: torch.Tensor, mask: torch.Tensor | None, cache, position_embeddings) -> torch.Tensor | None:
        """The layer in one kernel call (module docstring), or None where it does not apply."""
        rows = x.shape[1]
        if x.shape[0] != 1 or rows > rowkernel.MAX_ROWS or x.dtype != torch.float32 or position_embeddings is None:
            return None
        attn = self.self_attn
        layer = cache.layers[attn.layer_idx] if cache is not None and hasattr(cache, "layers") else None
        if layer is None or not hasattr(layer, "room"):
            return None
        lins = self._linears()
        if lins is None:
            return None
        fits, mask = _kernel_mask(mask, rows)
        if not fits:
            return None
        space = layer.room(rows)
        if space is None:
            return None
        kbuf, vbuf, past = space
        if mask is not None and mask.shape[-1] != past + rows:
            return None
        cos, sin = position_embeddings
        cfg = attn.config
        out = rowkernel.load().llama_layer(
            x[0].contiguous(), self.input_layernorm.weight if self._input_norm else _NONE_F32,
            self.post_attention_layernorm.weight, self.post_attention_layernorm.variance_epsilon, lins,
            cos[0].contiguous(), sin[0].contiguous(), kbuf[0], vbuf[0],
            past, _NONE_F32 if mask is None else mask, attn.scaling, cfg.num_attention_heads,
            cfg.num_key_value_heads)
        layer.filled(past + rows)
        return out[None]

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache=None, use_cache: bool | None = False,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, past_key_values=None,
                **kwargs) -> torch.Tensor:
        cache = cache if cache is not None else past_key_values
        if torch.is_grad_enabled():
            return super().forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                   cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        if self.fused:
            out = self._fused(hidden_states, attention_mask, cache, position_embeddings)
            if out is not None:
                return out
        attn, mlp = self.self_attn, self.mlp
        x = hidden_states                                        # (B, T, H)
        h = _rms_norm(x, self.input_layernorm) if self._input_norm else x
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


def _kernel_mask(mask: torch.Tensor | None, rows: int) -> tuple[bool, torch.Tensor | None]:
    """(whether the fused kernel takes this mask, the (rows, keys) mask it reads: None for causal): a
    (1, 1, rows, keys) bool or additive float32 mask, or None."""
    if mask is None:
        return True, None
    if mask.dim() != 4 or mask.shape[:3] != (1, 1, rows) or mask.dtype not in (torch.bool, torch.float32):
        return False, None
    return True, mask[0, 0].contiguous()


def swappable(layer: nn.Module) -> bool:
    """A stock LlamaDecoderLayer (not a subclass; an EAGLE head's, without its input norm, too) with float32 CPU
    weights."""
    if type(layer) is not LlamaDecoderLayer:
        return False
    norms = (layer.post_attention_layernorm,) + (
        () if isinstance(layer.input_layernorm, nn.Identity) else (layer.input_layernorm,))  # an EAGLE head's
    if not all(hasattr(n, "variance_epsilon") and hasattr(n, "weight") for n in norms):
        return False
    w = layer.self_attn.q_proj.weight
    return w.dtype == torch.float32 and w.device.type == "cpu"


def swap_layers(model: nn.Module, fused: bool = True) -> int:
    """Replace every swappable decoder layer of `model` by a LeanLlamaLayer over its submodules (`fused`: with
    its one-call path for few rows, where the row kernel builds); returns how many."""
    todo = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if swappable(child)]
    for parent, name, child in todo:
        setattr(parent, name, LeanLlamaLayer(child, fused))
    return len(todo)


class FusedStack:
    """A Llama body's decoder layers for a few rows in one kernel call (`rows_linear.cpp`, `LlamaStack`): the
    embedding, the rotary tables and the final norm stay PyTorch's, the layers run one after another in the
    kernel, each exactly as its own fused call would run it (the same bits), without going back to Python thirty
    times a forward. `__call__` returns None where it does not apply (more rows, a batch, a cache without room,
    a layer that is not fused); the caller then runs the body as usual."""

    def __init__(self, body: nn.Module):
        self.body = body
        self.__dict__["_built"] = (None, None)  # (what it was built from: `_stack`, the LlamaStack or None)

    @staticmethod
    def applies(body: nn.Module) -> bool:
        """A Llama body whose every decoder layer is a fused LeanLlamaLayer."""
        layers = getattr(body, "layers", None)
        return (layers is not None and len(layers) > 0 and hasattr(body, "embed_tokens") and hasattr(body, "norm")
                and hasattr(body, "rotary_emb") and all(isinstance(l, LeanLlamaLayer) and l.fused for l in layers))

    def _stack(self):
        """The kernel's stack (None: a layer is not fused or not all float32 FastLinears), built again when a layer
        was replaced or turned off, or a FastLinear derived its kernels again."""
        key = (linear.DERIVED[0], tuple((id(layer), layer.fused) for layer in self.body.layers))
        built, stack = self.__dict__["_built"]
        if built == key:
            return stack
        packs = [layer._linears() if layer.fused else None for layer in self.body.layers]
        if any(p is None for p in packs):
            self.__dict__["_built"] = (key, None)
            return None
        layers = [[l.input_layernorm.weight if l._input_norm else _NONE_F32, l.post_attention_layernorm.weight, *p]
                  for l, p in zip(self.body.layers, packs)]
        first = self.body.layers[0]
        attn, cfg = first.self_attn, first.self_attn.config
        stack = rowkernel.load().LlamaStack(layers, first.post_attention_layernorm.variance_epsilon, attn.scaling,
                                            cfg.num_attention_heads, cfg.num_key_value_heads)
        self.__dict__["_built"] = (key, stack)
        return stack

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                 cache) -> torch.Tensor | None:
        """The body's post-norm features (1, T, H) for input_ids (1, T) at position_ids, with attention_mask
        (1, 1, T, past + T) additive or None (causal), keys and values written into `cache`; or None."""
        rows = input_ids.shape[-1]
        if (input_ids.dim() != 2 or input_ids.shape[0] != 1 or rows > rowkernel.MAX_ROWS or torch.is_grad_enabled()
                or cache is None or not hasattr(cache, "layers") or len(cache.layers) != len(self.body.layers)):
            return None
        fits, mask = _kernel_mask(attention_mask, rows)
        if not fits:
            return None
        stack = self._stack()
        if stack is None:
            return None
        spaces = [layer.room(rows) if hasattr(layer, "room") else None for layer in cache.layers]
        if any(s is None for s in spaces) or len({s[2] for s in spaces}) != 1:
            return None
        past = spaces[0][2]
        if mask is not None and mask.shape[-1] != past + rows:
            return None
        body = self.body
        x = body.embed_tokens(input_ids)                         # (1, T, H)
        cos, sin = body.rotary_emb(x, position_ids)
        out = stack.run(x[0].contiguous(), cos[0].contiguous(), sin[0].contiguous(), [s[0][0] for s in spaces],
                        [s[1][0] for s in spaces], past, _NONE_F32 if mask is None else mask)
        for layer in cache.layers:
            layer.filled(past + rows)
        return body.norm(out[None])
