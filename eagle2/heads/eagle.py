"""The EAGLE-1/2 draft head: fc(concat(token embedding, target feature)) -> one Llama decoder layer.

Layout of the official checkpoints (config.json + pytorch_model.bin or model.safetensors): `fc.weight`,
`fc.bias`, `layers.0.*` and optionally `embed_tokens.weight`. The layer's input_layernorm is not used,
there is no final norm, and logits come from the target's own lm_head.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from . import eagle3 as head3
from . import head_kind  # noqa: F401  (defined once in heads/, importable from here as before)
from ..config import LIMITS

DRAFT_VOCAB = "draft_vocab.safetensors"
CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "rms_norm_eps", "max_position_embeddings", "head_dim", "rope_theta", "rope_scaling",
               "rope_parameters", "hidden_act")


class DraftHead(nn.Module):
    """Predicts the target's next feature from (next token, current feature)."""

    kind = "eagle1"
    feature_layers = None  # it reads the target's last hidden state, after the final norm

    def __init__(self, config: LlamaConfig, bias: bool = True):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE drops it: fc output feeds attention directly
        self.rotary = LlamaRotaryEmbedding(config=config)
        self.embed_tokens: nn.Embedding | None = None  # set from the checkpoint or shared with the target
        self.draft_vocab: torch.Tensor | None = None    # token ids the draft scores; None = all

    def forward(self, token_ids: torch.Tensor, features: torch.Tensor, mask: torch.Tensor,
                position_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """token_ids (B, T), features (B, T, H), additive mask (B, 1, T, past+T) -> predicted features (B, T, H)."""
        dtype = self.fc.weight.dtype  # the head may run in another dtype than the target (a bf16 draft)
        x = self.fc(torch.cat((self.embed_tokens(token_ids).to(dtype), features.to(dtype)), dim=-1))
        pos_emb = self.rotary(x, position_ids=position_ids)
        return self.layers[0](x, attention_mask=mask, position_ids=position_ids, cache=cache,
                              use_cache=cache is not None, position_embeddings=pos_emb)

    def target_features(self, out) -> torch.Tensor:
        """Its input feature from a target forward: the last hidden state, after the final norm (B, T, H)."""
        return out.last_hidden_state

    def draft_weight(self, lm_head: torch.Tensor, n: int) -> torch.Tensor:
        """The target's own lm_head rows for the first n tokens of the draft vocabulary (n, H)."""
        if self.draft_vocab is None:
            return lm_head if n == lm_head.shape[0] else lm_head[:n]
        return lm_head.index_select(0, self.draft_vocab[:n].to(lm_head.device))

    def scorer(self, rows: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """The rows' layer itself: there is no final norm, the target's lm_head reads the layer's output as it is."""
        return rows

    @property
    def bias(self) -> bool:
        return self.fc.bias is not None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the head computes in (its fc and layer)."""
        return self.fc.weight.dtype

    def cast(self, dtype: torch.dtype) -> "DraftHead":
        """Compute in `dtype` from now on. Only the head's own fc and layer change: `embed_tokens` is usually
        the target's (tied) embedding, which must stay as it is, and the rotary frequencies keep float32."""
        self.fc.to(dtype)
        self.layers.to(dtype)
        return self


def head_config_for(target_config) -> dict:
    """A head config.json matching a target's shapes (for a new, untrained head)."""
    cfg = {k: getattr(target_config, k) for k in CONFIG_KEYS if getattr(target_config, k, None) is not None}
    cfg.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], model_type="llama", bias=True)
    return cfg


def _to_llama_config(cfg: dict) -> LlamaConfig:
    lc = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("bias", "qkv_bias", "architectures")})
    lc.attention_bias = bool(cfg.get("qkv_bias", False))
    lc._attn_implementation = "sdpa"
    return lc


def new_head(target, seed: int = 0) -> DraftHead:
    """A randomly initialised head shaped for `target` (a stand-in until a trained one exists)."""
    torch.manual_seed(seed)
    head = DraftHead(_to_llama_config(head_config_for(target.config)), bias=True)
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    head.embed_tokens = target.get_input_embeddings()
    head.source = "random (untrained)"
    return head.to(dtype=target.dtype, device=target.device).eval().requires_grad_(False)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    st, pt = directory / "model.safetensors", directory / "pytorch_model.bin"
    if st.exists():
        return load_file(str(st))
    if pt.exists():
        return torch.load(str(pt), map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {directory}")


def load_head(directory: str | Path, target) -> DraftHead:
    """Load an official-layout EAGLE-1/2 or EAGLE-3 head (told apart by its config and weight names); refuse
    one that does not fit `target`."""
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"draft head directory {directory} has no config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
        weights = _read_weights(directory)
    except (json.JSONDecodeError, OSError, RuntimeError, ValueError, SafetensorError, EOFError) as e:
        raise ValueError(f"draft head in {directory} is unreadable: {e}") from None
    tc = target.config
    if head3.is_eagle3(cfg, set(weights)):
        return _load_eagle3(directory, cfg, weights, target)
    for key in ("hidden_size", "vocab_size"):
        if cfg.get(key) != getattr(tc, key):
            raise ValueError(f"draft head does not fit the target: head {key}={cfg.get(key)}, "
                             f"target {key}={getattr(tc, key)}")
    head = DraftHead(_to_llama_config(cfg), bias=bool(cfg.get("bias", True)))
    embed = weights.pop("embed_tokens.weight", None)
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.") and "input_layernorm" not in k]
    unexpected = [k for k in unexpected if "input_layernorm" not in k]
    if missing or unexpected:
        raise ValueError(f"draft head weights in {directory} do not match the EAGLE layout: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if embed is not None:
        head.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
    else:
        head.embed_tokens = target.get_input_embeddings()
    head.draft_vocab = _read_draft_vocab(directory, tc.vocab_size)
    head.source = str(directory)
    return head.to(dtype=target.dtype, device=target.device).eval().requires_grad_(False)


def _load_eagle3(directory: Path, cfg: dict, weights: dict, target) -> head3.Eagle3Head:
    """An official-layout EAGLE-3 head; refuse one that does not fit `target`."""
    tc = target.config
    fits = {"vocab_size": (cfg.get("vocab_size"), tc.vocab_size),
            "target_hidden_size": (cfg.get("target_hidden_size") or cfg.get("hidden_size"), tc.hidden_size)}
    for key, (mine, theirs) in fits.items():
        if mine != theirs:
            raise ValueError(f"EAGLE-3 head does not fit the target: head {key}={mine}, target has {theirs}")
    head = head3.build(cfg, _to_llama_config(cfg), tc)
    head3.from_weights(head, weights, str(directory))
    if head.embed_tokens is None:
        head.embed_tokens = target.get_input_embeddings()
    ids = head.token_ids()
    if int(ids.min()) < 0 or int(ids.max()) >= tc.vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"EAGLE-3 head in {directory}: d2t maps outside the target's vocabulary or twice")
    head.set_vocab_order(_read_draft_vocab(directory, tc.vocab_size))
    head.source = str(directory)
    return head.to(dtype=target.dtype, device=target.device).eval().requires_grad_(False)


def _read_draft_vocab(directory: Path, vocab_size: int) -> torch.Tensor | None:
    """Optional `draft_vocab.safetensors` (`token_ids`): the subset of the vocabulary the draft scores."""
    path = directory / DRAFT_VOCAB
    if not path.exists():
        return None
    try:
        ids = load_file(str(path))["token_ids"].long()
    except (OSError, KeyError, SafetensorError) as e:
        raise ValueError(f"{path} is unreadable: {e}") from None
    if ids.ndim != 1 or ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{path}: token ids must be a non-empty 1-D list inside 0..{vocab_size - 1}")
    if ids.numel() < LIMITS["top_k"][1] or ids.unique().numel() != ids.numel():
        raise ValueError(f"{path}: needs at least {LIMITS['top_k'][1]} distinct token ids (the largest top-k), "
                         f"has {ids.unique().numel()}")
    return ids


def save_draft_vocab(token_ids: torch.Tensor, directory: str | Path) -> None:
    """Store the draft's reduced vocabulary beside a head (most frequent tokens first)."""
    save_file({"token_ids": token_ids.to(torch.int64).contiguous()}, str(Path(directory) / DRAFT_VOCAB))


def save_head(head: DraftHead, directory: str | Path, dtype: torch.dtype = torch.float16,
              extra_config: dict | None = None) -> None:
    """Save in the official layout (config.json + model.safetensors, no embed_tokens)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in head.config.to_dict().items() if k in CONFIG_KEYS and v is not None}
    cfg.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], model_type="llama", bias=head.bias,
               torch_dtype=str(dtype).removeprefix("torch."))
    cfg.update(extra_config or {})
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()
             if not k.startswith(("embed_tokens", "rotary"))}
    save_file(state, str(directory / "model.safetensors"))
