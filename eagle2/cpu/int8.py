"""Int8 weight rows with a float32 scale each, multiplied by float32 inputs in our row kernel.

Two users. The draft head (`FastLinear` with int8 rows, `loading.load(draft_dtype="int8")`, the default where
the row kernel builds): drafting only proposes and the target verifies in float32, so the head may read a quarter of its
float32 bytes without changing an output token; a draft forward is a few rows over weights far larger than
the caches, so its time is the weight stream. And the greedy argmax (eagle2/cpu/argmax.py), which bounds every
token's float32 logit from the int8 rows and needs each row's largest rounding (`Rows.resid`).

Each row w_t becomes q_t = round(w_t / s_t) with s_t = max|w_t| / 127, so |w_ti - s_t q_ti| <= s_t / 2.
Inputs of more rows than `rowkernel.MAX_ROWS` (the head reading a whole prompt) keep the float32 weights.
Where the CPU has AVX512-VNNI the kernel rounds each input row to int16 (to 1/32766 of its largest value) and
sums the products exactly in int32, about twice as fast as float32 multiply-adds; the argmax adds that
rounding to its bound, the draft head takes it as it takes the int8 rows themselves.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import rows as rowkernel


@dataclass
class Rows:
    """q (N, K) int8, scale (N,) float32, resid (N,) float64: max_i |w_ti - scale_t q_ti|, exactly."""
    q: torch.Tensor
    scale: torch.Tensor
    resid: torch.Tensor

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return rowkernel.q8_linear(x, self.q, self.scale, bias)


def fits(weight: torch.Tensor) -> bool:
    """Whether the row kernel takes this (N, K) weight: float32 on the CPU, K a multiple of 16, N of 4, built."""
    n, k = weight.shape
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and k % 16 == 0 and n % 4 == 0
            and rowkernel.load() is not None)


def quantize(weight: torch.Tensor) -> Rows:
    w = weight.detach().double()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(2.0 ** -100).float()   # float32, as the kernel reads it
    q = torch.round(w / scale.double()[:, None]).clamp(-127, 127)
    resid = (w - q * scale.double()[:, None]).abs().amax(dim=1)
    return Rows(q.to(torch.int8).contiguous(), scale.contiguous(), resid)
