"""Greedy tokens through a bf16 shortlist (eagle2/argmax.py): always the float32 argmax, settled by the shortlist
alone on most rows, and sent to the full float32 lm_head where bf16 cannot tell tokens apart."""
from __future__ import annotations

import pytest
import torch

from eagle2 import kernels
from eagle2.argmax import GreedyTokens
from eagle2.config import DecodeConfig
from eagle2.engine import Decoder
from tests.conftest import CharTokenizer, tiny_target

pytestmark = pytest.mark.skipif(not (kernels.available(torch.zeros(1)) and kernels.native_bf16()),
                                reason="needs oneDNN and a CPU with native bf16")


def _lm_head(weight: torch.Tensor) -> torch.nn.Linear:
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight
    kernels.use_onednn(lin)
    return lin.eval().requires_grad_(False)


def test_the_shortlist_gives_the_float32_argmax_and_settles_most_rows():
    torch.manual_seed(0)
    lm = _lm_head(torch.randn(8000, 96) * 0.05)
    greedy = GreedyTokens(lm)
    assert GreedyTokens.applies(lm)
    h = torch.randn(300, 96) * 4
    with torch.inference_mode():
        assert greedy(h) == lm(h).argmax(-1).tolist()
    assert greedy.rows == 300 and greedy.settled > 250  # the full lm_head ran for a few rows at most


def test_rows_bf16_cannot_rank_fall_back_to_the_full_lm_head():
    # Pairs of tokens whose weights differ below bf16's precision: their bf16 scores tie or flip, their float32
    # logits do not. With a shortlist of one, only the error bound stands between the shortlist and a wrong token.
    torch.manual_seed(1)
    base = torch.randn(2000, 64) * 0.05
    twin = base + torch.randn_like(base) * 1e-5
    lm = _lm_head(torch.cat([base, twin]))
    h = torch.randn(400, 64) * 4
    with torch.inference_mode():
        exact = lm(h).argmax(-1)
        bf16 = (h.bfloat16() @ lm.weight.bfloat16().T).float().argmax(-1)
        assert bool((bf16 != exact).any())  # the bf16 scores alone get some rows wrong
        greedy = GreedyTokens(lm, k=1)
        assert greedy(h) == exact.tolist()
    assert greedy.settled < greedy.rows  # those rows went to the full lm_head


def test_the_decoder_uses_it_only_with_onednn_and_the_output_is_unchanged():
    from eagle2.head import new_head

    target = tiny_target(vocab=16, std=0.5)
    head = new_head(target, seed=1)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=30, total_tokens=8, depth=3)
    before = [t for r in Decoder(target, head, CharTokenizer()).run([1, 2, 3], cfg) for t in r.new_tokens]
    assert Decoder(target, head, CharTokenizer()).greedy_head is None  # PyTorch's kernels: the plain argmax
    kernels.use_onednn(target)
    dec = Decoder(target, head, CharTokenizer())
    assert dec.greedy_head is not None
    after = [t for r in dec.run([1, 2, 3], cfg) for t in r.new_tokens]
    assert after == before and dec.greedy_head.rows > 0


@pytest.mark.slow
def test_on_the_real_model_the_shortlist_settles_nearly_every_row(embedded):
    from eagle2.api import decoder_for
    from eagle2.engine import encode_prompt

    dec = decoder_for(embedded)
    if dec.greedy_head is None:
        pytest.skip("the session's bundle does not run oneDNN kernels")
    rows, settled = dec.greedy_head.rows, dec.greedy_head.settled
    ids = encode_prompt(embedded.tokenizer, "Name three colours of autumn leaves.")
    recs = list(dec.run(ids, DecodeConfig(method="eagle2", max_new_tokens=32)))
    rows, settled = dec.greedy_head.rows - rows, dec.greedy_head.settled - settled
    verified = 1 + sum(1 for r in recs[1:] for n in r.nodes if n.status in ("root", "kept"))  # prefill: 1 row
    assert rows == verified and settled >= 0.9 * rows
