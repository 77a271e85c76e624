"""Float32 weights that are exactly four-bit codes: the same values in a fifth of the bytes, found at load.

A model dequantised from a GGUF Q4_1 file (the embedded SmolLM2 is one) holds, in every block of 32 weights of
a row, only values of the form (d * j) + m for j in 0..15, each computed in float32 (a product, then a sum,
each rounded once). `recode` finds d and m for every block and checks that every weight is exactly one of the
sixteen values; if any weight of the matrix is not, it returns None and the layer keeps its float32 kernels.
Where it succeeds, the row kernel (eagle2/cpu/csrc/rows_linear.cpp, `q4_linear`) rebuilds those float32
weights in L1 and runs the very sums `rows_linear` runs, so the outputs are bit for bit the same; a one-row
forward reads about 19% of the float32 bytes (0.5 byte of codes and 8 bytes of d and m per 32 weights).
Any other model (bf16 or float32 checkpoints) has no such structure and is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import rows as rowkernel

BLOCK = 32


@dataclass
class Codes:
    """codes (N, K/2) uint8 (weight 32b+i in the low nibble of byte 16b+i, 32b+16+i in its high nibble),
    d and m (N, K/32) float32: weight = (d * code) + m in float32."""
    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return rowkernel.q4_linear(x, self.codes, self.d, self.m, bias)

    def weight(self) -> torch.Tensor:
        """The float32 weight the codes stand for, as torch computes it (tests compare it with the original)."""
        n, half = self.codes.shape
        c = self.codes.view(n, -1, 16).to(torch.int32)
        j = torch.cat([c & 15, c >> 4], dim=2).float()                       # (N, K/32, 32)
        return ((self.d[..., None] * j) + self.m[..., None]).reshape(n, half * 2)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.d, self.m))


def fits(weight: torch.Tensor) -> bool:
    """Shapes the kernel takes: float32 (N, K) on the CPU, K a multiple of 32, N of 4; the kernel built."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    n, k = weight.shape
    return k % BLOCK == 0 and n % 4 == 0 and n * k > 0 and rowkernel.load() is not None


def recode(weight: torch.Tensor) -> Codes | None:
    """The four-bit codes of `weight` (module docstring), or None when any weight is not exactly one. d is tried
    as (largest - least) / 15 in half precision (as GGUF stores it), its half-precision neighbours and in float32,
    then the same with 14, 13 ... 1 steps (a block whose largest weight is not code 15); the row kernel checks every weight (about 2 s for the embedded model's 135M weights on two cores)."""
    if not fits(weight):
        return None
    codes, d, m = rowkernel.q4_recode(weight.detach())
    return None if codes.numel() == 0 else Codes(codes, d, m)
