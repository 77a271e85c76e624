"""`FastLinear`: an nn.Linear for CPU inference that picks its kernel by the number of rows it is given.

Swapped in for `nn.Linear` at load (`eagle2.cpu.accelerate`), the way gpt-fast swaps in its int8 linear: the
module tree shows it (`print(model)`), its state dict is an nn.Linear's (`weight`, `bias`), and no forward is
patched. Up to `own_rows` rows it runs our row kernel (eagle2/cpu/rows.py), up to `stock_rows` PyTorch's own
kernel, beyond that oneDNN with the weight prepacked once (eagle2/cpu/onednn.py); with int8 rows (a draft head:
it only proposes, the target verifies in float32) it multiplies float32 inputs of up to rows.MAX_ROWS rows by
int8 weight rows with a scale each (eagle2/cpu/int8.py). A float32 weight that is exactly four-bit codes (a
model dequantised from GGUF Q4_1: eagle2/cpu/q4.py) goes through the row kernel from those codes, the same sums
over the same values from a fifth of the bytes. While autograd records, it is a plain nn.Linear.
"""
from __future__ import annotations

import torch

from . import int8, onednn, q4
from . import rows as rowkernel


DERIVED = [0]  # how many times any FastLinear derived its kernels' copies: a fused stack rebuilt after any change


class FastLinear(torch.nn.Module):
    """y = x @ weight.T + bias, through the kernel that was fastest on this machine for the row count."""

    def __init__(self, weight: torch.nn.Parameter | torch.Tensor, bias: torch.Tensor | None, stock_rows: int,
                 own_rows: int, packed: bool = True, int8_rows: bool = False, four_bit: bool = True):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, torch.nn.Parameter) else torch.nn.Parameter(weight, False)
        self.bias = bias
        self.stock_rows = stock_rows
        self._asked = (own_rows, packed, int8_rows, four_bit)  # the kernels asked for; `_derive` keeps those that apply
        for name in ("packed", "q", "scale", "codes", "d", "m"):
            self.register_buffer(name, None, persistent=False)
        self._derive(packed)

    def _derive(self, packed: bool) -> None:
        """The kernels' own copies of the weight as it is now (prepacked, int8 rows, four-bit codes) and the
        row-kernel limit."""
        own_rows, _, int8_rows, four_bit = self._asked
        DERIVED[0] += 1
        weight = self.weight
        self.own_rows = min(own_rows, rowkernel.MAX_ROWS) if own_rows and rowkernel.usable(weight) else 0
        self.packed = onednn.pack(weight) if packed else None
        q8 = int8.quantize(weight) if int8_rows and int8.fits(weight) else None
        self.q, self.scale = (None, None) if q8 is None else (q8.q, q8.scale)
        q4s = q4.recode(weight) if four_bit and self.own_rows and q8 is None else None
        self.codes, self.d, self.m = (None, None, None) if q4s is None else (q4s.codes, q4s.d, q4s.m)
        # the same tensors as one plain attribute: a forward runs hundreds of times a step, and reading
        # parameters and buffers through nn.Module's attribute lookup cost about 1% of a decode here
        self.__dict__["_fast"] = (self.weight, self.bias, self.packed, self.q, self.scale,
                                  None if q4s is None else (q4s.codes, q4s.d, q4s.m))

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.double()` and the like convert the weight and bias only; the kernels' copies are derived
        again from them (converting those would leave them stale, or fail on a packed weight)."""
        self.packed = self.q = self.scale = self.codes = self.d = self.m = None
        super()._apply(fn, recurse)
        self._derive(self._asked[1] and onednn.available(self.weight))
        return self

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, stock_rows: int, own_rows: int, packed: bool = True,
                    int8_rows: bool = False, four_bit: bool = True) -> "FastLinear":
        return cls(linear.weight, linear.bias, stock_rows, own_rows, packed, int8_rows, four_bit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias, packed, q, scale, codes = self._fast
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return torch.nn.functional.linear(x, weight, bias)
        rows = x.numel() // x.shape[-1]
        if q is not None and rows <= rowkernel.MAX_ROWS and x.dtype == torch.float32:
            return rowkernel.q8_linear(x, q, scale, bias)
        if rows <= self.own_rows:
            if codes is not None:
                return rowkernel.q4_linear(x, *codes, bias)
            return rowkernel.linear(x, weight, bias)
        if packed is None or rows <= self.stock_rows:
            return torch.nn.functional.linear(x, weight, bias)
        return onednn.packed_linear(x, packed, bias)

    def extra_repr(self) -> str:
        kinds = [f"int8 rows up to {rowkernel.MAX_ROWS} rows"] if self.q is not None else []
        four = " from four-bit codes" if self.codes is not None else ""
        kinds += [f"row kernel{four} up to {self.own_rows} rows"] if self.own_rows else []
        kinds += [f"PyTorch up to {self.stock_rows} rows"] if self.stock_rows else []
        kinds += ["oneDNN packed beyond"] if self.packed is not None else ["PyTorch beyond"]
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                + ", ".join(kinds))
