"""The sampling acceptance rule on fixed trees and distributions, without a model: 100,000 two-token draws.

The engine's `accept_sampling` decides a step from the target's logits at every tree node. Here the logits
are fixed tables (a first-token row, and a second-token row for each first token), so the exact joint
distribution of two consecutive tokens is known in closed form: p(x1) p(x2 | x1), with temperature and
top-p applied by an independent NumPy implementation. The two tokens come from one tree step when it
produces two or more, else from a second step rooted at the first token. A chi-square test compares the
counts with that joint. The same test must reject four plausible wrong rules, each the engine's rule with
one bug (the faithful copy is checked draw for draw against the engine first).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle2.decode.verify import Decision, accept_sampling, target_probs

pytestmark = pytest.mark.statistical

V, T, TOP_P, DRAWS = 5, 0.7, 0.9, 100_000
ROOT = torch.tensor([1.0, 0.6, 0.2, -0.3, -1.5])        # first-token logits
NEXT = torch.tensor([[0.1, 1.2, -0.4, 0.5, -1.0],       # second-token logits after each first token
                     [1.4, -0.2, 0.3, -1.2, 0.2],
                     [-0.5, 0.4, 1.1, 0.0, -0.8],
                     [0.3, 0.3, -0.9, 1.0, 0.6],
                     [0.0, -0.6, 0.8, 0.4, 1.3]])
# root -> [0, 1]; 0 -> [1, 3]; 1 -> [3] (token 3 after token 1 lies outside the top-p nucleus: never accepted)
PARENTS = [-1, 0, 0, 1, 1, 2]
TOKENS = [2, 0, 1, 1, 3, 3]
Q = [1.0, 0.55, 0.3, 0.5, 0.35, 0.4]  # the draft's own probability of each node (what a wrong rule might use)


def exact_joint() -> np.ndarray:
    """p(x1, x2) with temperature T and nucleus TOP_P, computed independently of eagle2.decode.verify."""
    def probs(logits: np.ndarray) -> np.ndarray:
        p = np.exp(logits / T - np.max(logits / T))
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # mass strictly before each token in sorted order
        keep = np.zeros(V, dtype=bool)
        keep[order[before < TOP_P]] = True
        p = np.where(keep, p, 0.0)
        return p / p.sum()

    p1 = probs(ROOT.numpy().astype(np.float64))
    return np.stack([p1[a] * probs(NEXT[a].numpy().astype(np.float64)) for a in range(V)])


def rule(parents, tokens, logits, temperature, top_p, gen, q=None, bonus_from_p=False, keep_rejected=False,
         use_q=False, child_row=False) -> Decision:
    """The engine's rule written out again, with one bug switched on by each flag (all off: the engine's)."""
    probs = target_probs(logits, temperature, top_p)
    kids = [[i for i in range(1, len(parents)) if parents[i] == p] for p in range(len(parents))]
    path, cur = [], 0
    while True:
        residual, nxt = probs[cur].clone(), None
        for c in kids[cur]:
            row = probs[c] if child_row else residual           # bug: the child's distribution, not the parent's
            x, total = tokens[c], row.sum()
            u = torch.rand((), generator=gen)
            ratio = row[x] / total / (q[c] if use_q else 1.0)  # bug: divided by the draft's soft q(x)
            if total > 0 and u < ratio:
                nxt = c
                break
            if not keep_rejected:                              # bug: a rejected sibling stays in the residual
                residual[x] = 0.0
        if nxt is None:
            dist = probs[cur] if bonus_from_p else residual    # bug: the bonus drawn from p itself
            bonus = int(torch.multinomial(dist / dist.sum(), 1, generator=gen))
            return Decision(accepted=path, bonus=bonus, verdicts=[None] * len(parents), target_tokens=None)
        path.append(nxt)
        cur = nxt


def step_logits() -> torch.Tensor:
    """The target's logits at each node of the first step's tree: the row after the node's own token."""
    rows = [ROOT] + [NEXT[t] for t in TOKENS[1:3]] + [torch.zeros(V)] * 3  # depth-2 rows decide only third tokens
    return torch.stack(rows)


def draw_pairs(accept, n: int = DRAWS, seed: int = 0) -> np.ndarray:
    """Counts of (x1, x2) over n two-token draws, each from a first tree step and, when that step produced one
    token only, a second step rooted at it (a one-child tree proposing token 0)."""
    gen = torch.Generator().manual_seed(seed)
    logits, counts = step_logits(), np.zeros((V, V))
    for _ in range(n):
        d = accept(PARENTS, TOKENS, logits, T, TOP_P, gen)
        out = [TOKENS[i] for i in d.accepted] + [d.bonus]
        if len(out) == 1:
            d2 = accept([-1, 0], [out[0], 0], torch.stack([NEXT[out[0]], torch.zeros(V)]), T, TOP_P, gen)
            out.append(([0] if d2.accepted else [d2.bonus])[0])
        counts[out[0], out[1]] += 1
    return counts


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit over the cells the target can produce; a count where p = 0 fails outright."""
    expected = probs * counts.sum()
    if counts[probs == 0].sum() > 0:
        return 0.0
    keep = probs > 0
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return float(torch.special.gammaincc(torch.tensor((keep.sum() - 1) / 2.0), torch.tensor(stat / 2.0)))


@pytest.fixture(autouse=True)
def one_thread():
    """Ops on 5-element tensors: a thread pool only adds overhead (about 60x here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def joint() -> np.ndarray:
    p = exact_joint()
    assert p[1, 3] == 0 and p[1].sum() > 0.2  # the nucleus cuts a drafted token; the root's children matter
    return p


def test_the_copy_is_the_engines_rule_draw_for_draw():
    logits = step_logits()
    for seed in range(300):
        a = accept_sampling(PARENTS, TOKENS, logits, T, TOP_P, torch.Generator().manual_seed(seed))
        b = rule(PARENTS, TOKENS, logits, T, TOP_P, torch.Generator().manual_seed(seed))
        assert (a.accepted, a.bonus) == (b.accepted, b.bonus)


def test_the_engines_rule_samples_the_targets_joint_distribution(joint):
    counts = draw_pairs(accept_sampling)
    assert chi2_pvalue(counts, joint) > 1e-4
    assert np.abs(counts / counts.sum() - joint).max() < 0.006


@pytest.mark.parametrize("bug", ["bonus_from_p", "keep_rejected", "use_q", "child_row"])
def test_each_wrong_rule_fails_the_same_test(joint, bug):
    def wrong(*args):
        return rule(*args, q=Q, **{bug: True})

    assert chi2_pvalue(draw_pairs(wrong), joint) < 1e-6
