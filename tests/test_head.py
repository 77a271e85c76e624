"""Draft head checkpoints: official EAGLE layout round trip, .bin loading, and refusal of a misfit."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle2.heads.eagle import load_head, new_head, save_head
from tests.conftest import tiny_target


def head_output(head, target):
    torch.manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (1, 5))
    feats = torch.randn(1, 5, target.config.hidden_size)
    mask = torch.zeros(1, 1, 5, 5).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    with torch.no_grad():
        return head(ids, feats, mask, torch.arange(5)[None])


def test_safetensors_round_trip_official_layout(tmp_path):
    target = tiny_target(vocab=32)
    head = new_head(target, seed=4)
    save_head(head, tmp_path, dtype=torch.float32)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any(k.startswith(("embed_tokens", "lm_head", "norm", "rotary")) or "input_layernorm" in k
                   for k in keys)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == 64 and cfg["bias"] is True
    back = load_head(tmp_path, target)
    assert torch.equal(head_output(head, target), head_output(back, target))


def test_official_bin_with_embed_tokens_loads(tmp_path):
    target = tiny_target(vocab=32)
    head = new_head(target, seed=5)
    save_head(head, tmp_path, dtype=torch.float32)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone() * 2
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    back = load_head(tmp_path, target)
    assert torch.equal(back.embed_tokens.weight, state["embed_tokens.weight"])  # the head's own embedding wins


def test_misfit_head_is_refused_naming_both_values(tmp_path):
    save_head(new_head(tiny_target(vocab=32)), tmp_path)
    with pytest.raises(ValueError, match=r"head vocab_size=32, target vocab_size=48"):
        load_head(tmp_path, tiny_target(vocab=48))


def test_missing_or_corrupt_head(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_head(tmp_path, tiny_target())
    save_head(new_head(tiny_target()), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="unreadable"):
        load_head(tmp_path, tiny_target())


def test_models_with_sliding_window_attention_are_refused():
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    from eagle2.loading import check_full_attention

    for ok in (LlamaConfig(), Qwen2Config()):  # Qwen2's layers all attend fully unless it says otherwise
        check_full_attention(ok)
    for windowed in (MistralConfig(), Gemma2Config(), Qwen2Config(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"])):
        with pytest.raises(ValueError, match="sliding window"):
            check_full_attention(windowed)
