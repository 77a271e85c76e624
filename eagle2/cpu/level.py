"""`FusedDraft`: one level of an EAGLE-1/2 draft head in one kernel call, for the decoder's drafter.

A draft level is the head's forward over a few nodes (embedding, concatenation, fc, rotary, its decoder layer)
and their scores over the draft vocabulary (the lm_head rows, log-softmax, top-k): about fifteen PyTorch
operations and the Python between them, which on a CPU cost more than the level's arithmetic. Here the row
kernel's `DraftLevel` runs them in one call (eagle2/cpu/csrc/rows_linear.cpp), through the same kernels the
separate calls use, so the features and the logits are the same bits; the log-softmax and the top-k are the
kernel's own (they may differ from PyTorch's in the last bits and in the order of exact ties: the draft only
proposes, and the target verifies every token). It applies to an EAGLE-1/2 head whose fc, layer and lm_head rows
are int8 rows (`accelerate(..., int8_rows=True)`) with a fused layer (`swap_layers`); a run's first step, the
whole prompt's pairs, goes in pieces of the kernel's rows; anything else (a cache without room) returns None
and the drafter takes its usual path.

`grow` goes further for the paper's EAGLE-2 (no sizing floors, no lookup branch): the whole step's growth in
one call, the committed pairs, every level and the rerank, so the Python between levels goes too (the tuner's
timing of every level in full, `prune=False`, goes through it as well). It grows
the tree `DraftTree.grow_dynamic` grows, node for node (tests/test_fused_draft.py).
"""
from __future__ import annotations

import torch

from . import rows as rowkernel
from .layer import LeanLlamaLayer
from .linear import FastLinear

_NONE_F32, _NONE_BOOL, _NONE_I64 = torch.empty(0), torch.empty(0, dtype=torch.bool), torch.empty(0, dtype=torch.long)


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

    GROW = True  # off (tests, ablate): EAGLE-2's growth in Python around one call per level

    def __call__(self, tokens: list[int], feats: torch.Tensor, visible: torch.Tensor | None, committed: int,
                 positions: list[int], cache, last: bool, k: int):
        """Nodes `tokens` with features (M, H) at `positions`, over a head cache whose first `committed` positions
        are committed (every row sees them) and the rest this step's drafts; `visible` (M, drafts + M) bool which
        of those each row sees, None for causal rows. -> (log-probs (S, n), features (M, H), top-k log-probs
        (S, k), their columns (S, k)) for every row, or the last only (`last`); None where it does not apply.
        Causal rows beyond the kernel's (a run's first step feeds the head the whole prompt) go in pieces of
        its rows, each over the keys the pieces before it wrote, so only the last row needs scoring."""
        rows = len(tokens)
        if torch.is_grad_enabled() or cache is None or not hasattr(cache, "layers"):
            return None
        if rows > rowkernel.MAX_ROWS:
            if visible is not None or not last:
                return None
            outs, step, layer = [], rowkernel.MAX_ROWS, cache.layers[0]
            before = layer.get_seq_length() if getattr(layer, "is_initialized", False) else 0
            for a in range(0, rows, step):
                got = self(tokens[a:a + step], feats.reshape(rows, -1)[a:a + step], None, committed + a,
                           positions[a:a + step], cache, True, k)
                if got is None:  # the pieces' keys leave again, and the caller's usual path takes all the rows
                    if outs:
                        layer.filled(before)
                    return None
                outs.append(got[1])
            return got[0], torch.cat(outs), got[2], got[3]
        space = self._space(cache, rows)
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
        cache.layers[0].filled(past + rows)
        return logp, out, top_lp, top_ix

    def grow(self, tokens: torch.Tensor, feats: torch.Tensor, ids: torch.Tensor | None, root: int, cache,
             depth: int, k: int, keep: int, prune: bool = True) -> list[torch.Tensor] | None:
        """One step of EAGLE-2's growth in one kernel call (`DraftLevel::grow`, the rule of
        eagle2/decode/draft.py's `grow_dynamic`, `prune` as there): the pairs `tokens` (T,) with features
        (T, H) committed to the head cache, then the tree drafted over them and left out of the cache again.
        -> (parent, token, depth, rank, logp, score, expanded, kept) tensors; None where it does not apply."""
        if not self.GROW or torch.is_grad_enabled() or cache is None or not hasattr(cache, "layers"):
            return None
        rows = tokens.numel()
        space = self._space(cache, rows + (depth - 1) * k)
        level = self._level() if space is not None else None
        if level is None:
            return None
        kbuf, vbuf, past = space
        got = level.grow(tokens.reshape(-1), feats.reshape(rows, -1).float().contiguous(),
                         _NONE_I64 if ids is None else ids, kbuf[0], vbuf[0], past, root, depth, k, keep, prune)
        cache.layers[0].filled(past + rows)
        return got

    def _space(self, cache, rows: int):
        """The head cache's buffers with room for `rows` more positions, and how many are filled (a fresh cache
        gets its empty keys and values first); None for a cache without room."""
        layer = cache.layers[0]
        if not hasattr(layer, "room"):
            return None
        if not getattr(layer, "is_initialized", True):
            cfg = self.head.layers[0].self_attn.config
            d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            empty = torch.empty(1, cfg.num_key_value_heads, 0, d)
            layer.update(empty, empty.clone())
        return layer.room(rows)
