"""The target's greedy tokens without reading its whole float32 lm_head each step, and still exact.

Greedy verification needs only the argmax of h @ W.T for each verified node, not the logits. On a CPU the
49152 x 576 lm_head is 113 MB of float32 streamed through memory at every target forward. `GreedyTokens`
scores all tokens with a cheaper copy of W, which gives for every token t an upper bound u_t on its exact
score h.w_t; it computes the float32 logits of the tokens with the highest bounds exactly and proves that
no other token can win. Two copies, each with a bound that holds whatever the data:

- int8 rows (our row kernel, `rowkernel.q8_upper`; a quarter of the bytes): w_t = s_t q_t + d_t with
  |d_ti| <= D_t (measured per row), so |h.w_t - s_t h.q_t| <= |h|_1 D_t, plus the float32 rounding of the
  sum (g = K 2^-24, over |h|_1 127 s_t) and of the scaling (2^-22 |a_t|): u_t = a_t + 2^-22|a_t| + |h|_1 c_t.
  Where the CPU has AVX512-VNNI the kernel sums h rounded to int16 instead (h = s z + e, |e_i| <= E), exactly
  in int32, and adds that rounding's share: u_t = a_t + 2^-22|a_t| + |h|_1 c_t + s_t E |q_t|_1 (`l1q`).
- bfloat16 rows (oneDNN; half the bytes; on CPUs with native bf16 where the row kernel is missing):
  |h.w_t - a_t| <= E + 2^-7 |a_t|, E = |h| max_t |w_t - bf16(w_t)| + (|h - bf16(h)| + g |bf16(h)|) max_t
  |bf16(w_t)| (rounding of the weights, of the input, of the fp32 accumulation and of the bf16 output).

The shortlist is the k tokens of highest bound (16). A row is settled when its best exact candidate beats
the (k+1)-th bound, and every other candidate, by more than the float32 rounding of either computation
(g sum_i |h_i w_ti|, per token); any other row (true near-ties) is scored with the full float32 lm_head.
The tokens are therefore those of the float32 argmax (tests/test_argmax.py).
"""
from __future__ import annotations

import torch

from . import int8, onednn
from . import rows as rowkernel
from .linear import FastLinear

BF16_OUT = 2.0 ** -7   # bf16 output rounding, relative (unit roundoff 2^-8: this holds even for truncation)
SAFETY = 2.0           # the float32 accumulation bounds are taken twice over (kernels may round once more)


def _gamma(k: int) -> float:
    """Bound on float32 accumulation error of a k-term dot product, relative to sum |x_i y_i|."""
    return k * 2.0 ** -24 / (1 - k * 2.0 ** -24)


class _Int8Bounds:
    """u = upper bounds on h @ W.T from int8 rows with a scale each (the row kernel)."""

    def __init__(self, w: torch.Tensor, gamma: float):
        rows = int8.quantize(w)
        slack = (rows.resid + gamma * 127 * rows.scale.double()) * (1 + 2.0 ** -10)  # and |h|_1's own rounding
        self.q, self.scale, self.slack = rows.q, rows.scale, slack.float().contiguous()
        self.l1q = rows.q.to(torch.int32).abs().sum(dim=1).float().contiguous()  # |q_t|_1 (int8 abs(-128) wraps)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return rowkernel.q8_upper(h, self.q, self.scale, self.slack)


class _Bf16Bounds:
    """u = upper bounds on h @ W.T from a bf16 copy of W (oneDNN's packed bf16 matmul)."""

    def __init__(self, w: torch.Tensor, gamma: float):
        w16 = w.to(torch.bfloat16)
        self.packed, self.gamma = onednn.pack(w16), gamma
        self.resid = float((w - w16.float()).norm(dim=1).max())
        self.norm16 = float(w16.float().norm(dim=1).max())

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        h16 = h.to(torch.bfloat16)
        a = onednn.packed_linear(h16, self.packed, None).float()           # (N, V)
        h16f = h16.float()
        err = h.norm(dim=-1) * self.resid + ((h - h16f).norm(dim=-1) + self.gamma * h16f.norm(dim=-1)) * self.norm16
        return a.add_(a.abs().mul_(BF16_OUT)).add_(err[:, None])


class GreedyTokens:
    """Exact argmax rows of `lm_head(h)` for a float32, bias-free lm_head, through a shortlist of bounds."""

    def __init__(self, lm_head: torch.nn.Module, k: int = 16, bits: int | None = None):
        w = lm_head.weight.detach()
        self.lm_head, self.w, self.k = lm_head, w, k
        self.gamma = SAFETY * _gamma(w.shape[1])
        if bits is None:
            bits = 8 if int8.fits(w) else 16
        self.bits = bits
        self.bounds = _Int8Bounds(w, self.gamma) if bits == 8 else _Bf16Bounds(w, self.gamma)
        self.norm32 = float(w.norm(dim=1).max())
        # rows the lm_head runs through our row kernel, summing each logit in the kernel's own order
        self.exact_rows = getattr(lm_head, "own_rows", 0) if bits == 8 and w.is_contiguous() else 0
        self.settled = self.rows = 0  # how often the shortlist alone decided (for benchmarks and tests)

    @staticmethod
    def applies(lm_head: torch.nn.Module) -> bool:
        """Float32 CPU lm_head without bias, run by oneDNN (or our row kernel), with int8 or native bf16 bounds."""
        w = getattr(lm_head, "weight", None)
        return (isinstance(lm_head, FastLinear) and lm_head.bias is None and w is not None
                and w.dtype == torch.float32 and w.device.type == "cpu"
                and (onednn.supports(torch.bfloat16) or int8.fits(w)))

    def _exact(self, h: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 logits of tokens idx (N, k) and their rounding bound, whatever order a kernel sums in."""
        rows = self.w[idx]                                                  # (N, k, H)
        exact = torch.einsum("nh,nkh->nk", h, rows)
        rho = self.gamma * torch.einsum("nh,nkh->nk", h.abs(), rows.abs())
        return exact, rho

    def _in_kernel(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Tokens and which rows are settled, all in the row kernel (`rows.q8_greedy`), where the lm_head sums
        these rows as that kernel does (its own rows: the shortlist's exact logits are then its own, bit for bit,
        and only the bound on the tokens outside the shortlist can leave a row unsettled); else None."""
        if self.bits != 8 or not self.exact_rows or h.shape[0] > self.exact_rows or h.dtype != torch.float32:
            return None
        b = self.bounds
        tokens, ok, _, _ = rowkernel.q8_greedy(h, b.q, b.scale, b.slack, self.w, self.k, self.gamma * self.norm32,
                                               b.l1q)
        return tokens, ok

    def __call__(self, h: torch.Tensor) -> list[int]:
        """(N, H) float32 features -> the float32 lm_head's argmax token of each row."""
        tokens, ok = self._in_kernel(h) or self._shortlisted(h)
        self.rows += h.shape[0]
        self.settled += int(ok.sum())
        if not bool(ok.all()):  # rows the shortlist could not settle: the full float32 lm_head
            bad = (~ok).nonzero()[:, 0]
            tokens[bad] = self.lm_head(h[bad]).argmax(dim=-1)
        return tokens.tolist()

    def _shortlisted(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and which rows are settled, in PyTorch: whatever order the lm_head sums in, a settled row's
        best candidate beats every other by more than either's float32 rounding."""
        u = self.bounds(h)                                                  # (N, V) upper bounds
        k = min(self.k, u.shape[1])
        top, idx = u.topk(min(k + 1, u.shape[1]), dim=-1)
        # no token outside the shortlist gets more than this from the float32 lm_head (its own rounding added)
        outside = top[:, k] + self.gamma * h.norm(dim=-1) * self.norm32 if k < u.shape[1] else top[:, 0] - float("inf")
        idx = idx[:, :k]
        exact, rho = self._exact(h, idx)
        best, at = exact.max(dim=-1)
        rho_best = rho.gather(-1, at[:, None])[:, 0]
        # the float32 lm_head's value of the best is within 2 rho_best of `best`, each other candidate's within
        # 2 rho of `exact`; tokens outside the shortlist stay below `outside`
        gap = (best - 2 * rho_best)[:, None] - (exact + 2 * rho)
        gap = gap.scatter(-1, at[:, None], float("inf")).min(dim=-1).values  # inf when k == 1
        ok = (best - 2 * rho_best > outside) & (gap > 0)
        return idx.gather(-1, at[:, None])[:, 0], ok
