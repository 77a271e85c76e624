"""Greedy tokens through a shortlist of bounds (eagle2/cpu/argmax.py), from int8 rows (our row kernel) or bf16 ones
(oneDNN): always the float32 argmax, settled by the shortlist alone on most rows, and sent to the full float32
lm_head where the cheap copy cannot tell tokens apart."""
from __future__ import annotations

import pytest
import torch

from eagle2 import cpu
from eagle2.cpu import onednn as kernels
from eagle2.cpu import rows as rowkernel
from eagle2.cpu.argmax import GreedyTokens
from eagle2.cpu.linear import FastLinear
from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from tests.conftest import CharTokenizer, tiny_target

pytestmark = pytest.mark.skipif(not kernels.available(torch.zeros(1)), reason="needs oneDNN")
INT8 = pytest.param(8, marks=pytest.mark.skipif(rowkernel.why_not() is not None, reason="needs the row kernel"))
BF16 = pytest.param(16, marks=pytest.mark.skipif(not kernels.native_bf16(), reason="needs native bf16"))


def _lm_head(weight: torch.Tensor) -> FastLinear:
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight
    return FastLinear.from_linear(lin, stock_rows=0, own_rows=0).eval().requires_grad_(False)


def _cheap_scores(lm: torch.nn.Linear, h: torch.Tensor, bits: int) -> torch.Tensor:
    """What the cheap copy alone would score: bf16 products, or the int8 rows times their scales."""
    w = lm.weight
    if bits == 16:
        return (h.bfloat16() @ w.bfloat16().T).float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    return h @ (torch.round(w / scale).clamp(-127, 127) * scale).T


@pytest.mark.parametrize("bits", [INT8, BF16])
def test_the_shortlist_gives_the_float32_argmax_and_settles_most_rows(bits):
    torch.manual_seed(0)
    lm = _lm_head(torch.randn(8000, 96) * 0.05)
    greedy = GreedyTokens(lm, bits=bits)
    assert GreedyTokens.applies(lm) and greedy.bits == bits
    h = torch.randn(300, 96) * 4
    with torch.inference_mode():
        assert greedy(h) == lm(h).argmax(-1).tolist()
    assert greedy.rows == 300 and greedy.settled > 250  # the full lm_head ran for a few rows at most


def _twins(seed: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    # Pairs of tokens whose weights differ below the cheap copy's precision: their cheap scores tie or flip,
    # their float32 logits do not.
    torch.manual_seed(seed)
    base = torch.randn(2000, 64) * 0.05
    lm = _lm_head(torch.cat([base, base + torch.randn_like(base) * 1e-5]))
    return lm, torch.randn(400, 64) * 4


@pytest.mark.parametrize("bits", [INT8, BF16])
def test_rows_the_cheap_copy_cannot_rank_fall_back_to_the_full_lm_head(bits):
    lm, h = _twins(1)
    with torch.inference_mode():
        exact = lm(h).argmax(-1)
        assert bool((_cheap_scores(lm, h, bits).argmax(-1) != exact).any())  # the cheap scores get rows wrong
        greedy = GreedyTokens(lm, k=1, bits=bits)  # a shortlist of one: only the bounds stand in the way
        assert greedy(h) == exact.tolist()
    assert greedy.settled < greedy.rows  # those rows went to the full lm_head


@pytest.mark.skipif(rowkernel.why_not() is not None, reason="needs the row kernel")
def test_without_its_slack_the_int8_bound_would_pick_wrong_tokens():
    # The check above can fail: drop the rounding slack of the int8 rows and a shortlist of one settles rows
    # on the wrong token.
    lm, h = _twins(2)
    with torch.inference_mode():
        exact = lm(h).argmax(-1).tolist()
        greedy = GreedyTokens(lm, k=1, bits=8)
        greedy.bounds.slack.zero_()
        assert greedy(h) != exact


@pytest.mark.skipif(rowkernel.why_not() is not None, reason="needs the row kernel")
def test_the_int8_kernel_bounds_every_exact_score_from_above_as_its_formula_says():
    torch.manual_seed(3)
    w, h = torch.randn(4000, 128) * 0.05, torch.randn(5, 128) * 3
    greedy = GreedyTokens(_lm_head(w), bits=8)
    b = greedy.bounds
    u = b(h).double()
    assert bool((u >= h.double() @ w.double().T).all())
    a = h.double() @ (b.q.double() * b.scale.double()[:, None]).T   # scale_t h.q_t, exactly
    formula = a + a.abs() * 2.0 ** -22 + h.double().abs().sum(1, keepdim=True) * b.slack.double()
    assert torch.allclose(u, formula, rtol=1e-5, atol=1e-5)
    assert float((u - a).max()) < 0.1 * float(a.abs().max())  # the slack is small next to the scores


def _own_head(weight: torch.Tensor) -> FastLinear:
    """An lm_head that runs up to 32 rows through the row kernel (the shortlist is then settled in the kernel)."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight.data = weight
    return FastLinear.from_linear(lin, stock_rows=0, own_rows=32).eval().requires_grad_(False)


@pytest.mark.skipif(rowkernel.why_not() is not None, reason="needs the row kernel")
def test_in_the_kernel_near_ties_settle_on_the_lm_heads_own_logits_and_equal_ones_on_the_lowest_token():
    # Twins differ below the int8 rows' precision, and duplicated rows tie exactly: the shortlist's logits are
    # summed in the lm_head's own order, so the twins are told apart without the full lm_head, and an exact tie
    # goes to the lowest token id as torch.argmax breaks it.
    lm_twins, h = _twins(4)
    base = lm_twins.weight[:2000]
    lm_dup = _own_head(torch.cat([base, base]).contiguous())   # token t and t + 2000: the same logit, always
    lm_twins = _own_head(lm_twins.weight)
    for lm in (lm_twins, lm_dup):
        greedy = GreedyTokens(lm)
        assert greedy.exact_rows == 32
        with torch.inference_mode():
            got = [t for i in range(0, 400, 16) for t in greedy(h[i:i + 16])]
            exact = [int(lm(h[i:i + 1]).argmax()) for i in range(400)]
        assert got == exact
        assert greedy.settled >= 0.95 * greedy.rows   # near ties no longer send rows to the full lm_head
    assert max(exact) < 2000  # every tie went to the first of the pair
    old = GreedyTokens(lm_twins)
    old.exact_rows = 0  # the same bounds through the rounding-gap check of any summation order
    with torch.inference_mode():
        old(h[:64])
    assert old.settled < old.rows  # ... which could not settle the twins


@pytest.mark.skipif(rowkernel.why_not() is not None, reason="needs the row kernel")
def test_in_the_kernel_the_shortlist_bounds_every_token_outside_it_and_needs_its_slack():
    torch.manual_seed(6)
    w, h = torch.randn(4000, 128) * 0.05, torch.randn(12, 128) * 3
    greedy = GreedyTokens(_own_head(w))
    b = greedy.bounds
    tokens, ok, short, bound = rowkernel.q8_greedy(h, b.q, b.scale, b.slack, greedy.w, greedy.k,
                                                   greedy.gamma * greedy.norm32)
    exact = h.double() @ w.double().T
    assert bool(ok.all()) and tokens.tolist() == (h @ w.T).argmax(-1).tolist()
    assert torch.equal(short[:, :-1].sort(-1).values, b(h).topk(greedy.k, dim=-1).indices.sort(-1).values)
    outside = torch.ones_like(exact, dtype=torch.bool).scatter(1, short[:, :-1], False)
    assert bool((exact[outside].view(12, -1) <= bound[:, -1:].double()).all())  # the (k+1)-th bound tops them
    lm, h2 = _twins(7)
    lm = _own_head(lm.weight)
    greedy = GreedyTokens(lm, k=1)
    greedy.bounds.slack.zero_()  # without the int8 rows' slack a shortlist of one settles wrong tokens
    with torch.inference_mode():
        got = [t for i in range(0, 400, 16) for t in greedy(h2[i:i + 16])]
        assert got != lm(h2).argmax(-1).tolist()


@pytest.mark.skipif(rowkernel.why_not() is not None or not rowkernel.int16_sums(128),
                    reason="needs the row kernel on a CPU with AVX512-VNNI")
def test_int16_sums_bound_every_score_and_need_the_inputs_rounding_term():
    # Weights that the int8 rows hold exactly (a power-of-two scale), so the slack is only the float32 sums'
    # rounding, and inputs with an outlier, so rounding them to int16 costs the most: the bounds, summed from
    # int16 inputs, must still top every exact score, and do so only with their term for that rounding.
    torch.manual_seed(8)
    q = torch.randint(-127, 128, (512, 128), dtype=torch.int8)
    q[:, 1] = 127
    w = (q.float() * 2.0 ** -9).contiguous()
    greedy = GreedyTokens(_own_head(w))
    b = greedy.bounds
    assert torch.equal(b.q, q) and float(b.scale.max()) == float(b.scale.min()) == 2.0 ** -9
    h = torch.randn(6, 128)
    h[:, 0] = torch.tensor([1000.0, -700.0, 3.0, 250.0, 1e-3, 0.0])
    exact = h.double() @ w.double().T

    def bounds(l1q: torch.Tensor) -> torch.Tensor:  # every token's bound: a shortlist of all but one, plus that one
        _, _, short, bound = rowkernel.q8_greedy(h, b.q, b.scale, b.slack, greedy.w, 511, greedy.gamma * greedy.norm32,
                                                 l1q)
        return torch.empty_like(exact).scatter_(1, short, bound.double())

    u = bounds(b.l1q)
    assert bool((u >= exact).all())
    assert float((u - exact).max()) < 0.01 * float(exact.abs().max())  # and stay close to them
    assert bool((bounds(torch.zeros_like(b.l1q)) < exact).any())  # without that term some would not
    with torch.inference_mode():
        assert greedy(h) == (h @ w.T).argmax(-1).tolist()


def test_it_applies_to_a_fast_lm_head_only_and_the_output_is_unchanged():
    from eagle2.heads.eagle import new_head

    target = tiny_target(vocab=16, std=0.5)
    head = new_head(target, seed=1)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=30, total_tokens=8, depth=3)
    before = [t for r in Decoder(target, head, CharTokenizer()).run([1, 2, 3], cfg) for t in r.new_tokens]
    assert cpu.exact_greedy(target.get_output_embeddings()) is None  # PyTorch's nn.Linear: the plain argmax
    cpu.accelerate(target, cpu.KernelPlan(onednn=True))
    greedy = cpu.exact_greedy(target.get_output_embeddings())
    dec = Decoder(target, head, CharTokenizer(), greedy=greedy)
    after = [t for r in dec.run([1, 2, 3], cfg) for t in r.new_tokens]
    assert after == before and greedy.rows > 0


@pytest.mark.slow
def test_on_the_real_model_the_shortlist_settles_nearly_every_row(embedded):
    from eagle2.api import decoder_for
    from eagle2.decode.engine import encode_prompt

    dec, greedy = decoder_for(embedded), embedded.greedy
    if greedy is None:
        pytest.skip("the session's bundle does not run oneDNN kernels")
    rows, settled = greedy.rows, greedy.settled
    ids = encode_prompt(embedded.tokenizer, "Name three colours of autumn leaves.")
    recs = list(dec.run(ids, DecodeConfig(method="eagle2", max_new_tokens=32)))
    rows, settled = greedy.rows - rows, greedy.settled - settled
    verified = 1 + sum(1 for r in recs[1:] for n in r.nodes if n.status in ("root", "kept"))  # prefill: 1 row
    assert rows == verified and settled >= 0.9 * rows
