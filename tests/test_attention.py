"""Tree attention over grouped key/value heads (eagle2/attention.py): the same numbers as transformers' SDPA,
without its per-layer copy of the cache."""
from __future__ import annotations

import pytest
import torch
from transformers.integrations import sdpa_attention

from eagle2.cpu.attention import NAME, use_tree_sdpa
from eagle2.decode.cache import new_cache
from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.heads.eagle import new_head
from eagle2.decode.tree import tree_inputs
from tests.conftest import CharTokenizer, tiny_target


@pytest.fixture
def copies(monkeypatch):
    """How many times transformers' SDPA copied key/value heads (`repeat_kv` with groups > 1)."""
    count = {"n": 0}
    original = sdpa_attention.repeat_kv

    def counting(x, n_rep):
        count["n"] += n_rep > 1
        return original(x, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting)
    return count


def _forwards(target) -> list[torch.Tensor]:
    """Prefill, a one-token step and a masked 8-node tree verify over the same cache."""
    body = target.model
    ids = (torch.arange(20)[None] * 7) % target.config.vocab_size
    cache = new_cache(target.config)
    out = [body(input_ids=ids, cache=cache, use_cache=True).last_hidden_state,
           body(input_ids=ids[:, :1], cache=cache, use_cache=True).last_hidden_state]
    ti = tree_inputs([-1, 0, 0, 1, 1, 2, 3, 3], 21, target.dtype, torch.device("cpu"))
    out.append(body(input_ids=ids[:, :8], attention_mask=ti.mask, position_ids=ti.position_ids, cache=cache,
                    use_cache=True).last_hidden_state)
    return out


def test_tree_attention_gives_the_same_bits_without_copying_the_cache(copies):
    target = tiny_target(vocab=16, std=0.5)
    assert target.config.num_attention_heads > target.config.num_key_value_heads  # grouped heads
    with torch.inference_mode():
        stock = _forwards(target)
        assert copies["n"] > 0  # the stock path copies key/value heads for the masked tree
        copies["n"] = 0
        assert use_tree_sdpa(target) and target.config._attn_implementation == NAME
        assert not use_tree_sdpa(target)  # only a model on "sdpa" is switched
        ours = _forwards(target)
    assert copies["n"] == 0
    assert all(torch.equal(a, b) for a, b in zip(stock, ours))


def test_decoding_with_tree_attention_matches_plain_greedy():
    target = tiny_target(vocab=16, std=0.5)
    head = new_head(target, seed=1)
    use_tree_sdpa(target)
    assert use_tree_sdpa(head) and head.config._attn_implementation == NAME
    dec = Decoder(target, head, CharTokenizer())
    plain = [t for r in dec.run([1, 2, 3], DecodeConfig(method="vanilla", max_new_tokens=30)) for t in r.new_tokens]
    for method in ("eagle2", "eagle1"):
        out = [t for r in dec.run([1, 2, 3], DecodeConfig(method=method, max_new_tokens=30)) for t in r.new_tokens]
        assert out == plain, method
