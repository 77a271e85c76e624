"""CPU matmuls through oneDNN with prepacked weights, for inference, and the timings that choose between kernels.

On CPUs where PyTorch's default float32 BLAS is slow for the shapes decoding uses (one row, or the few
dozen rows of a verified tree), oneDNN with weights reordered once into its blocked layout is much faster
(docs/how-it-works.md has the measured times). The result is the same float32 product up to rounding
order, as with any other kernel. Every user of the model (our methods and transformers' own `generate` in
the bench) runs the same layers (eagle2/cpu/linear.py), so comparisons stay fair.

Which kernel is faster depends on the CPU and the row count: on some CPUs PyTorch's own kernel streams the
weights faster for one to three rows, on others oneDNN's wins from one row. So `stock_rows` times both over
the model's own layers and finds the last row count where PyTorch's was faster; where our own row kernel
builds (eagle2/cpu/rows.py: AVX-512, float32), `own_rows` times it the same way against that choice. The
plan (eagle2/cpu/plan.py) does this once per machine and keeps the answer.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from . import rows as rowkernel

ROWS_HINT = 32  # oneDNN picks its blocked layout for about this many rows; any row count works
CALIBRATE_ROWS = (1, 2, 3, 4, 6, 8)  # row counts `stock_rows` times, in order, stopping at the first oneDNN win
OWN_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # row counts `own_rows` times (up to rowkernel.MAX_ROWS)
MARGIN = 0.05  # PyTorch's kernel is kept only where it was at least this much faster


def supports(dtype: torch.dtype, device: str = "cpu") -> bool:
    """oneDNN's packed linear applies to float32 weights on the CPU (and bfloat16 ones where the CPU has
    native bf16 instructions, see `native_bf16`)."""
    ops = torch.ops.mkldnn
    dtype_ok = dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())
    return (device == "cpu" and dtype_ok and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def available(weight: torch.Tensor) -> bool:
    """Whether `weight` can be packed for oneDNN (`supports` its dtype and device)."""
    return supports(weight.dtype, weight.device.type)


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX); elsewhere bf16 is emulated."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(bool(f()) for f in checks if f is not None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) float32 (or bfloat16) weight -> oneDNN's blocked copy of it."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _best_ms(f: Callable[[], object], reps: int) -> float:
    f()  # warm: the first pass may allocate or page in
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def stock_rows(layers: list[torch.nn.Linear], packed: list[torch.Tensor], rows=CALIBRATE_ROWS, reps: int = 3) -> int:
    """The largest row count up to which PyTorch's own kernel beat the packed one (by MARGIN) at every
    count timed; 0 when oneDNN won at one row. Each timing is one pass over all `layers`, streaming their
    weights as a forward does, so memory traffic counts as it does in decoding. Takes about a second for
    the embedded model; a wrong answer costs only speed (both kernels give the same products)."""
    best = 0
    with torch.inference_mode():
        for r in rows:
            xs = {m.in_features: torch.randn(r, m.in_features, dtype=m.weight.dtype, device=m.weight.device)
                  for m in layers}
            own = _best_ms(lambda: [torch.nn.functional.linear(xs[m.in_features], m.weight, m.bias)
                                    for m in layers], reps)
            fast = _best_ms(lambda: [packed_linear(xs[m.in_features], p, m.bias)
                                     for m, p in zip(layers, packed)], reps)
            if own * (1 + MARGIN) > fast:
                break
            best = r
    return best


def own_rows(layers: list[torch.nn.Linear], packed: list[torch.Tensor], few: int, rows=OWN_ROWS,
             reps: int = 3) -> int:
    """The largest row count up to which our row kernel (eagle2/cpu/rows.py) was at most MARGIN slower
    than the kernel it would replace (PyTorch's up to `few` rows, the packed one beyond) at every count
    timed; 0 when it lost at one row. Ties go to ours, whose rows do not depend on each other. Timed like
    `stock_rows`, one pass over all `layers` per timing; a loss counts only when a second timing repeats it."""
    best = 0
    with torch.inference_mode():
        for r in rows:
            xs = {m.in_features: torch.randn(r, m.in_features, dtype=m.weight.dtype, device=m.weight.device)
                  for m in layers}

            def ours():
                return [rowkernel.linear(xs[m.in_features], m.weight, m.bias) for m in layers]

            def other():
                if r <= few:
                    return [torch.nn.functional.linear(xs[m.in_features], m.weight, m.bias) for m in layers]
                return [packed_linear(xs[m.in_features], p, m.bias) for m, p in zip(layers, packed)]

            # a loss is timed twice before it counts: one noisy timing should not cost every larger row count
            if all(_best_ms(other, reps) * (1 + MARGIN) < _best_ms(ours, reps) for _ in range(2)):
                break
            best = r
    return best
