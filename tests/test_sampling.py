"""Sampling is lossless: tokens drawn through the EAGLE-2 tree follow the target's own distribution.

A chi-square test compares the empirical distribution of the 2nd and 3rd generated tokens (both decided
by tree verification) with the exact target distribution computed by enumeration. The same test is run
on a deliberately wrong acceptance rule to show that it has the power to fail.
"""
from __future__ import annotations


import pytest
import torch

import eagle2.decode.engine as engine
from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.heads.eagle import new_head
from eagle2.decode.verify import Decision, target_probs
from tests.conftest import CharTokenizer, tiny_target

pytestmark = pytest.mark.statistical

V, PROMPT, N = 8, [1, 5, 2], 1500
CFG = DecodeConfig(method="eagle2", max_new_tokens=3, temperature=1.0, top_p=1.0, total_tokens=8, depth=3, top_k=3)


def exact_marginals(target, prompt=PROMPT) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t2) and P(t3) under plain sampling from the target, by enumerating t1 and t2."""
    with torch.no_grad():
        p1 = target_probs(target(torch.tensor([prompt])).logits[0, -1:], 1.0, 1.0)[0]
        seq2 = torch.tensor([prompt + [a] for a in range(V)])
        p2 = target_probs(target(seq2).logits[:, -1], 1.0, 1.0)  # (t1, t2)
        seq3 = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3 = target_probs(target(seq3).logits[:, -1], 1.0, 1.0).view(V, V, V)  # (t1, t2, t3)
    joint12 = p1[:, None] * p2
    return joint12.sum(0), (joint12[:, :, None] * p3).sum((0, 1))


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def sample_counts(target, head, prompt=PROMPT, cfg=CFG, sources=None) -> tuple[torch.Tensor, torch.Tensor]:
    dec = Decoder(target, head, CharTokenizer())
    c2, c3 = torch.zeros(V), torch.zeros(V)
    for seed in range(N):
        recs = list(dec.run(prompt, DecodeConfig(**{**cfg.__dict__, "seed": seed})))
        out = [t for r in recs for t in r.new_tokens]
        c2[out[1]] += 1
        c3[out[2]] += 1
        if sources is not None:
            sources.update(n.source for r in recs for n in r.nodes)
    return c2, c3


def wrong_rule(parents, tokens, logits, temperature, top_p, gen):
    """A plausible bug: after rejections the bonus is drawn from p itself, not from the residual."""
    probs = target_probs(logits, temperature, top_p)
    kids = [[i for i in range(1, len(parents)) if parents[i] == p] for p in range(len(parents))]
    path, cur = [], 0
    while True:
        nxt = next((c for c in kids[cur] if float(torch.rand((), generator=gen)) < probs[cur, tokens[c]]), None)
        if nxt is None:
            bonus = int(torch.multinomial(probs[cur], 1, generator=gen))
            return Decision(accepted=path, bonus=bonus, verdicts=[None] * len(parents), target_tokens=None)
        path.append(nxt)
        cur = nxt


@pytest.fixture(scope="module")
def setup():
    target = tiny_target(vocab=V, std=0.4, seed=5)
    return target, new_head(target, seed=3), exact_marginals(target)


def test_eagle2_sampling_matches_target_distribution(setup):
    target, head, (p2, p3) = setup
    assert p2.max() > 0.2  # a peaked distribution: drafts are accepted and rejected, both matter
    c2, c3 = sample_counts(target, head)
    assert chi2_pvalue(c2, p2) > 1e-3 and chi2_pvalue(c3, p3) > 1e-3


def test_the_test_rejects_a_wrong_acceptance_rule(setup, monkeypatch):
    target, head, (p2, p3) = setup
    monkeypatch.setattr(engine, "accept_sampling", wrong_rule)
    c2, c3 = sample_counts(target, head)
    assert min(chi2_pvalue(c2, p2), chi2_pvalue(c3, p3)) < 1e-3


def test_prompt_lookup_branch_keeps_the_target_distribution(setup):
    """The lookup branch is one more deterministic proposal per node: the point-mass rule must stay exact."""
    target, head, _ = setup
    prompt = [1, 5, 2, 1, 5]  # its suffix [1, 5] occurred before: lookup proposes [2, 1, 5, ...]
    p2, p3 = exact_marginals(target, prompt)
    seen: set[str] = set()
    c2, c3 = sample_counts(target, head, prompt, DecodeConfig(**{**CFG.__dict__, "lookup": True}), seen)
    assert "lookup" in seen  # the branch really took part
    assert chi2_pvalue(c2, p2) > 1e-3 and chi2_pvalue(c3, p3) > 1e-3


def test_seed_reproducible(setup):
    target, head, _ = setup
    dec = Decoder(target, head, CharTokenizer())
    cfg = DecodeConfig(**{**CFG.__dict__, "max_new_tokens": 12, "seed": 7})
    a = [t for r in dec.run(PROMPT, cfg) for t in r.new_tokens]
    b = [t for r in dec.run(PROMPT, cfg) for t in r.new_tokens]
    c = [t for r in dec.run(PROMPT, DecodeConfig(**{**cfg.__dict__, "seed": 8})) for t in r.new_tokens]
    assert a == b and len(a) == 12 and c != a  # the seed decides the draw


def test_tree_sized_by_confidence_keeps_the_target_distribution(setup):
    """A tree whose size follows the draft's confidence is still a function of the context alone, so
    verification must stay exact."""
    target, head, (p2, p3) = setup
    cfg = DecodeConfig(**{**CFG.__dict__, "min_prob": 0.1, "expand_prob": 0.2})
    c2, c3 = sample_counts(target, head, cfg=cfg)
    assert chi2_pvalue(c2, p2) > 1e-3 and chi2_pvalue(c3, p3) > 1e-3
