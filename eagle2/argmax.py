"""The target's greedy tokens without reading its whole float32 lm_head each step, and still exact.

Greedy verification needs only the argmax of h @ W.T for each verified node, not the logits. On a CPU the
49152 x 576 lm_head is 113 MB of float32 streamed through memory at every target forward. `GreedyTokens`
scores all tokens with a bfloat16 copy of W (half the bytes; native bf16 hardware), takes the k best as
candidates, computes their float32 logits exactly, and proves that no other token can win:

for every token t, |h.w_t - a_t| <= E + 2^-7 |a_t|, where a_t is the bf16 score and
E = |h| max_t |w_t - bf16(w_t)| + (|h - bf16(h)| + g |bf16(h)|) max_t |bf16(w_t)|
(rounding of the weights, of the input, of the fp32 accumulation (g = K 2^-24) and of the bf16 output).
x + 2^-7 |x| grows with x, so no token outside the k best scores can reach more than the k-th score's
bound. A row is settled when its best exact candidate beats that bound, and every other candidate, by
more than the float32 rounding of either computation (g sum_i |h_i w_ti|, per candidate); any other row
(about 1% on the embedded model, true near-ties) is scored with the full float32 lm_head, as before. The
tokens are therefore those of the float32 argmax (tests/test_argmax.py). Where it applies (`applies`) it
replaces the lm_head in greedy verification: about 1.3 ms less per target forward on the project's AMX Xeon.
"""
from __future__ import annotations

import torch

from . import kernels

BF16_OUT = 2.0 ** -7   # bf16 output rounding, relative (unit roundoff 2^-8: this holds even for truncation)
SAFETY = 2.0           # the float32 accumulation bounds are taken twice over (kernels may round once more)


def _gamma(k: int) -> float:
    """Bound on float32 accumulation error of a k-term dot product, relative to sum |x_i y_i|."""
    return k * 2.0 ** -24 / (1 - k * 2.0 ** -24)


class GreedyTokens:
    """Exact argmax rows of `lm_head(h)` for a float32, bias-free lm_head, through a bf16 shortlist."""

    def __init__(self, lm_head: torch.nn.Linear, k: int = 16):
        w = lm_head.weight.detach()
        w16 = w.to(torch.bfloat16)
        self.lm_head, self.w, self.k = lm_head, w, k
        self.packed = kernels.pack(w16)
        self.gamma = SAFETY * _gamma(w.shape[1])
        self.resid = float((w - w16.float()).norm(dim=1).max())
        self.norm16 = float(w16.float().norm(dim=1).max())
        self.norm32 = float(w.norm(dim=1).max())
        self.settled = self.rows = 0  # how often the shortlist alone decided (for benchmarks and tests)

    @staticmethod
    def applies(lm_head: torch.nn.Module) -> bool:
        """Float32 CPU lm_head without bias, run by oneDNN on a CPU with native bf16."""
        w = getattr(lm_head, "weight", None)
        return (isinstance(lm_head, torch.nn.Linear) and lm_head.bias is None and w is not None
                and w.dtype == torch.float32 and w.device.type == "cpu" and kernels.patched(lm_head)
                and kernels.supports(torch.bfloat16))

    def __call__(self, h: torch.Tensor) -> list[int]:
        """(N, H) float32 features -> the float32 lm_head's argmax token of each row."""
        h16 = h.to(torch.bfloat16)
        scores = kernels.packed_linear(h16, self.packed, None).float()      # (N, V)
        top, idx = scores.topk(self.k, dim=-1)                             # (N, k)
        h16f = h16.float()
        hn = h.norm(dim=-1)
        err = hn * self.resid + ((h - h16f).norm(dim=-1) + self.gamma * h16f.norm(dim=-1)) * self.norm16
        kth = top[:, -1]
        outside = kth + BF16_OUT * kth.abs() + err                          # no token outside the shortlist beats this
        rows = self.w[idx]                                                  # (N, k, H)
        exact = torch.einsum("nh,nkh->nk", h, rows)                         # float32 logits of the shortlist
        rho = self.gamma * torch.einsum("nh,nkh->nk", h.abs(), rows.abs())  # their float32 rounding, any order
        best, at = exact.max(dim=-1)
        rho_best = rho.gather(-1, at[:, None])[:, 0]
        # the float32 lm_head's value of the best is within 2 rho_best of `best`, each other candidate's within
        # 2 rho of `exact`; tokens outside the shortlist stay below `outside` (+ their own rounding, < err's)
        gap = (best - 2 * rho_best)[:, None] - (exact + 2 * rho)
        gap = gap.scatter(-1, at[:, None], float("inf")).min(dim=-1).values  # inf when k == 1
        ok = (best - 2 * rho_best > outside + self.gamma * hn * self.norm32) & (gap > 0)
        tokens = idx.gather(-1, at[:, None])[:, 0]
        self.rows += h.shape[0]
        self.settled += int(ok.sum())
        if not bool(ok.all()):
            bad = (~ok).nonzero()[:, 0]
            tokens[bad] = self.lm_head(h[bad]).argmax(dim=-1)
        return tokens.tolist()
