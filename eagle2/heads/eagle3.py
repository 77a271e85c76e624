"""The EAGLE-3 draft head (arXiv 2503.01840), in the layout of the public EAGLE-3 checkpoints.

The target's hidden states entering a low, a middle and a high layer (by default layers 2, L//2 and L-3, as
the serving engines capture them) are concatenated and fused: fc (3 H_target -> H, no bias). One decoder
layer, the "midlayer", reads [norm(token embedding); norm(feature)] (2H) into attention and keeps the
un-normed feature as its residual. Its output is what the next draft step reads as its feature (as it is: the
fc applies to the target's fused features only), and `norm` + the head's own `lm_head` score the next token
over the head's draft vocabulary, mapped to the target's by d2t (target id = draft id + d2t[draft id]). There
is no feature regression: EAGLE-3 heads learn from the token loss alone, unrolled over their own steps.

Official layout: config.json (`architectures: ["LlamaForCausalLMEagle3"]`, Llama fields, `draft_vocab_size`,
optional `target_hidden_size` and `eagle_aux_hidden_state_layer_ids`, the latter as indices into the
target's hidden states, 0 being the embedding) and model.safetensors or pytorch_model.bin with `fc.weight`,
`midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`, `midlayer.self_attn.{q,k,v,o}_proj
.weight`, `midlayer.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d` and
optionally `embed_tokens.weight`. A `draft_vocab.safetensors` beside it (this project's) orders the draft
vocabulary most frequent first, so that a run can draft over its first N tokens only.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

ARCHITECTURE = "LlamaForCausalLMEagle3"
KIND = "eagle3"


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """Indices into the target's hidden states (0 = embedding, i = entering layer i): 2, L//2, L-3."""
    return min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)


class Rows(nn.Module):
    """The head's own lm_head (V_draft, H): a plain weight (not an nn.Linear, so no kernel swap reaches it;
    the decoder scores these rows with its draft layer)."""

    def __init__(self, rows: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Attention(nn.Module):
    """Llama attention whose q/k/v read 2H inputs. Keys come from a cache (drafting) or from `past`, a list of
    the earlier unrolled steps' keys and values (training), or from this call alone."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or h // heads
        bias = bool(getattr(cfg, "attention_bias", False))
        self.q_proj = nn.Linear(2 * h, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * h, kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * h, kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                cache=None, past: list | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, heads, T, D)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, kv, T, D)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys, values = k, v
        if cache is not None:
            keys, values = cache.update(k, v, 0)
        elif past is not None:
            keys, values = torch.cat([p[0] for p in past] + [k], 2), torch.cat([p[1] for p in past] + [v], 2)
            past.append((k, v))
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.to(q.dtype),
                                           enable_gqa=keys.shape[1] != q.shape[1])  # (B, heads, T, D)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class MidLayer(nn.Module):
    """The draft's one decoder layer: attention over [norm(embedding); norm(feature)], residual the feature."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)

    def forward(self, emb, hidden, cos, sin, mask, cache=None, past=None) -> torch.Tensor:
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(hidden)), dim=-1)  # (B, T, 2H)
        hidden = hidden + self.self_attn(x, cos, sin, mask, cache, past)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """Predicts the next draft feature from (next token, feature); scores tokens with its own norm + lm_head."""

    kind = KIND

    def __init__(self, config: LlamaConfig, target_hidden: int, draft_vocab_size: int,
                 feature_layers: tuple[int, ...]):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(3 * target_hidden, h, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = Rows(draft_vocab_size, h)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.rotary = LlamaRotaryEmbedding(config=config)
        self.feature_layers = tuple(feature_layers)
        self.embed_tokens: nn.Embedding | None = None  # the target's (or the checkpoint's), frozen
        self.draft_vocab: torch.Tensor | None = None    # target ids the draft scores, preferred order
        self.vocab_rows: torch.Tensor | None = None     # the lm_head row of each draft_vocab entry

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor, mask: torch.Tensor,
                position_ids: torch.Tensor, cache=None, past: list | None = None) -> torch.Tensor:
        """token_ids (B, T); features (B, T, 3 H_target) from the target or (B, T, H) from the head itself;
        additive mask (B, 1, T, keys) -> the head's features (B, T, H), before its final norm."""
        dtype = self.fc.weight.dtype
        hidden = features.to(dtype)
        if hidden.shape[-1] == self.fc.in_features:
            hidden = self.fc(hidden)
        emb = self.embed_tokens(token_ids).to(dtype)
        cos, sin = self.rotary(hidden, position_ids=position_ids)
        return self.midlayer(emb, hidden, cos.to(dtype), sin.to(dtype), mask, cache, past)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft logits over the head's vocabulary, in lm_head row order."""
        return self.lm_head(self.norm(out))

    def token_ids(self) -> torch.Tensor:
        """The target id of each lm_head row."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def target_features(self, out) -> torch.Tensor:
        """Its input from a target forward's output (output_hidden_states=True): three layers' hidden states
        side by side (B, T, 3H), fused by `fc` in `forward`."""
        return torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1)

    def draft_weight(self, lm_head: torch.Tensor, n: int) -> torch.Tensor:
        """Its own lm_head rows (not the target's `lm_head`) for the first n tokens of its draft vocabulary."""
        rows = self.vocab_rows if self.vocab_rows is not None else torch.arange(len(self.d2t))
        return self.lm_head.weight.index_select(0, rows[:n].to(self.lm_head.weight.device))

    def scorer(self, rows: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Its final norm, then the rows' layer."""
        norm = self.norm
        return lambda out: rows(norm(out))

    @property
    def bias(self) -> bool:
        return False

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def cast(self, dtype: torch.dtype) -> "Eagle3Head":
        """Compute in `dtype`: fc, midlayer, norm and lm_head (the embedding and rotary frequencies stay)."""
        for m in (self.fc, self.midlayer, self.norm, self.lm_head):
            m.to(dtype)
        return self

    def set_vocab_order(self, order: torch.Tensor | None) -> None:
        """Prefer `order` (target ids, most frequent first; a permutation of the head's vocabulary) for drafting
        over a prefix of the vocabulary; None keeps lm_head row order."""
        ids = self.token_ids()
        if order is None:
            self.draft_vocab, self.vocab_rows = ids, torch.arange(len(ids), device=ids.device)
            return
        order = order.to(ids.device).long()
        if order.numel() != ids.numel() or not torch.equal(order.sort().values, ids.sort().values):
            raise ValueError("the draft vocabulary order must list exactly the head's own vocabulary")
        row_of = {t: r for r, t in enumerate(ids.tolist())}
        self.draft_vocab, self.vocab_rows = order, torch.tensor([row_of[t] for t in order.tolist()], device=ids.device)


def is_eagle3(cfg: dict, keys: set[str] | None = None) -> bool:
    """Whether a head's config (or weight names) are EAGLE-3's."""
    if any("Eagle3" in a for a in cfg.get("architectures") or []) or "draft_vocab_size" in cfg:
        return True
    return bool(keys) and any(k.startswith("midlayer.") for k in keys)


def layer_ids(cfg: dict, num_layers: int) -> tuple[int, ...]:
    """The target hidden states the head reads: the config's, else the default."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    if not ids:
        return default_layers(num_layers)
    if len(ids) != 3 or not all(isinstance(i, int) and 0 <= i <= num_layers for i in ids):
        raise ValueError(f"eagle_aux_hidden_state_layer_ids must be 3 indices in 0..{num_layers}, not {ids}")
    return tuple(ids)


def build(cfg: dict, llama: LlamaConfig, target_config) -> Eagle3Head:
    """An empty head for a config dict (already checked against the target)."""
    return Eagle3Head(llama, int(cfg.get("target_hidden_size") or target_config.hidden_size),
                      int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
                      layer_ids(cfg, target_config.num_hidden_layers))


def from_weights(head: Eagle3Head, weights: dict[str, torch.Tensor], where: str) -> None:
    """Fill a head from official-layout weights (t2d is implied by d2t and dropped); raises on a mismatch."""
    weights = dict(weights)
    weights.pop("t2d", None)
    embed = weights.pop("embed_tokens.weight", None)
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.")]
    if missing or unexpected:
        raise ValueError(f"EAGLE-3 head weights in {where} do not match the official layout: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if embed is not None:
        head.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)


def config_for(head: Eagle3Head, target_config, dtype: torch.dtype) -> dict:
    """config.json in the official layout."""
    c = head.config
    cfg = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "hidden_act": c.hidden_act,
           "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
           "vocab_size": target_config.vocab_size, "draft_vocab_size": len(head.d2t),
           "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch.")}
    for key in ("head_dim", "rope_theta", "rope_scaling", "rope_parameters"):
        if getattr(c, key, None) is not None:
            cfg[key] = getattr(c, key)
    if head.fc.in_features != 3 * c.hidden_size:
        cfg["target_hidden_size"] = head.fc.in_features // 3
    if head.feature_layers != default_layers(target_config.num_hidden_layers):
        cfg["eagle_aux_hidden_state_layer_ids"] = list(head.feature_layers)
    return cfg


def save(head: Eagle3Head, directory: str | Path, target_config, dtype: torch.dtype = torch.float16,
         extra_config: dict | None = None) -> None:
    """Save in the official layout: config.json + model.safetensors (with d2t and t2d, without embed_tokens)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = config_for(head, target_config, dtype)
    cfg.update(extra_config or {})
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()
             if not k.startswith(("embed_tokens", "rotary")) and k != "d2t"}
    t2d = torch.zeros(target_config.vocab_size, dtype=torch.bool)
    t2d[head.token_ids().cpu()] = True
    state.update(d2t=head.d2t.detach().cpu().contiguous(), t2d=t2d)
    save_file(state, str(directory / "model.safetensors"))
