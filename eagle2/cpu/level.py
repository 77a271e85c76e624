"""`FusedDraft`: one level of an EAGLE-1/2 draft head in one kernel call, for the decoder's drafter.

A draft level is the head's forward over a few nodes (embedding, concatenation, fc, rotary, its decoder layer)
and their scores over the draft vocabulary (the lm_head rows, log-softmax, top-k): about fifteen PyTorch
operations and the Python between them, which on a CPU cost more than the level's arithmetic. Here the row
kernel's `DraftLevel` runs them in one call (eagle2/cpu/csrc/rows_linear.cpp), through the same kernels the
separate calls use, so the features and the logits are the same bits; the log-softmax and the top-k are the
kernel's own (they may differ from PyTorch's in the last bits and in the order of exact ties: the draft only
proposes, and the target verifies every token). It applies to an EAGLE-1/2 head whose fc, layer and lm_head rows
are int8 rows (`accelerate(..., int8_rows=True)`) with a fused layer (`swap_layers`); anything else (a first step
longer than the kernel's rows, a cache without room) returns None and the drafter takes its usual path.
"""
from __future__ import annotations

import torch

from . import rows as rowkernel
from .layer import LeanLlamaLayer
from .linear import FastLinear

_NONE_F32, _NONE_BOOL = torch.empty(0), torch.empty(0, dtype=torch.bool)


class FusedDraft:
    """A head and one draft vocabulary's lm_head rows as one kernel call per level (module docstring)."""

    def __init__(self, head: torch.nn.Module, rows: FastLinear):
        self.head, self.rows = head, rows
        self.__dict__["_built"] = None  # the kernel's DraftLevel, built on first use

    @staticmethod
    def head_applies(head: torch.nn.Module) -> bool:
        """An EAGLE-1/2 head (it reads the target's last features, no norm before the lm_head rows) with an int8
        fc and a fused int8 layer without input norm, over a float32 embedding: what the kernel takes."""
        layers, fc = getattr(head, "layers", None), getattr(head, "fc", None)
        return (rowkernel.load() is not None and getattr(head, "feature_layers", 0) is None
                and callable(getattr(head, "scorer", None)) and head.scorer(fc) is fc
                and layers is not None and len(layers) == 1
                and isinstance(layers[0], LeanLlamaLayer) and layers[0].fused and not layers[0]._input_norm
                and isinstance(fc, FastLinear) and fc.q is not None
                and getattr(head, "embed_tokens", None) is not None
                and head.embed_tokens.weight.dtype == torch.float32)

    @staticmethod
    def applies(head: torch.nn.Module, rows) -> bool:
        """`head_applies`, and lm_head rows that are int8 rows without a bias."""
        return (FusedDraft.head_applies(head) and isinstance(rows, FastLinear) and rows.q is not None
                and rows.bias is None)

    def _level(self):
        if self.__dict__["_built"] is None:
            head, layer = self.head, self.head.layers[0]
            lins = layer._linears()
            if lins is None:
                return None
            attn, cfg = layer.self_attn, layer.self_attn.config
            positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or 4096
            probe = torch.zeros(1, 1, cfg.hidden_size)
            cos, sin = head.rotary(probe, position_ids=torch.arange(positions)[None])  # (1, P, D) each
            fc = head.fc
            self.__dict__["_built"] = rowkernel.load().DraftLevel(
                head.embed_tokens.weight.detach().contiguous(), fc.q, fc.scale,
                _NONE_F32 if fc.bias is None else fc.bias.detach().float().contiguous(),
                layer.post_attention_layernorm.weight.detach().contiguous(),
                layer.post_attention_layernorm.variance_epsilon, lins, attn.scaling, cfg.num_attention_heads,
                cfg.num_key_value_heads, cos[0].float().contiguous(), sin[0].float().contiguous(),
                self.rows.q, self.rows.scale)
        return self.__dict__["_built"]

    def __call__(self, tokens: list[int], feats: torch.Tensor, visible: torch.Tensor | None, committed: int,
                 positions: list[int], cache, last: bool, k: int):
        """Nodes `tokens` with features (M, H) at `positions`, over a head cache whose first `committed` positions
        are committed (every row sees them) and the rest this step's drafts; `visible` (M, drafts + M) bool which
        of those each row sees, None for causal rows. -> (log-probs (S, n), features (M, H), top-k log-probs
        (S, k), their columns (S, k)) for every row, or the last only (`last`); None where it does not apply."""
        rows = len(tokens)
        if rows > rowkernel.MAX_ROWS or torch.is_grad_enabled() or cache is None or not hasattr(cache, "layers"):
            return None
        layer = cache.layers[0]
        space = layer.room(rows) if hasattr(layer, "room") else None
        level = self._level() if space is not None else None
        if level is None:
            return None
        kbuf, vbuf, past = space
        if visible is not None and visible.shape != (rows, past - committed + rows):
            return None
        out, logp, top_lp, top_ix = level.run(
            torch.tensor(tokens), feats.reshape(rows, -1).float().contiguous(), torch.tensor(positions), kbuf[0],
            vbuf[0], past, committed, _NONE_BOOL if visible is None else visible.contiguous(), rows - 1 if last else 0,
            k)
        layer.filled(past + rows)
        return logp, out, top_lp, top_ix

