"""CPU matmuls through oneDNN with prepacked weights, for inference.

On CPUs where PyTorch's default float32 BLAS is slow for the shapes decoding uses (one row, or the few
dozen rows of a verified tree), oneDNN with weights reordered once into its blocked layout is much faster
(docs/how-it-works.md has the measured times). The result is the same float32 product up to rounding
order, as with any other kernel. Every user of the patched model (our methods and transformers' own
`generate` in the bench) runs the same kernels, so comparisons stay fair.

Which kernel is faster depends on the CPU and the row count: on some CPUs PyTorch's own kernel streams the
weights faster for one to three rows, on others oneDNN's wins from one row. So `use_onednn` times both over
the model's own layers at load (`stock_rows`) and keeps PyTorch's kernel for inputs up to the last row count
where it was faster: one-token decoding (transformers' `generate` included) never runs the slower kernel.
Where our own row kernel builds (eagle2/rowkernel.py: AVX-512, float32), it is timed the same way against
that choice (`own_rows`) and takes the row counts up to its first loss.

Only inference is patched: when autograd is recording, the original `nn.Linear.forward` runs.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from . import rowkernel

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
    """The largest row count up to which our row kernel (eagle2/rowkernel.py) was at most MARGIN slower
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


def _patched(module: torch.nn.Linear, packed: torch.Tensor, few: int, own: int = 0):
    original = module.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad):
            return original(x)
        n = x.numel()
        if n <= own * x.shape[-1]:  # at most `own` rows: our row kernel was as fast or faster
            return rowkernel.linear(x, module.weight, module.bias)
        if n <= few * x.shape[-1]:  # at most `few` rows: PyTorch's kernel was faster here
            return original(x)
        return packed_linear(x, packed, module.bias)

    forward.eagle2_original = original
    return forward


def patched(module: torch.nn.Module) -> bool:
    """Whether `module` (an nn.Linear) runs through a packed oneDNN kernel."""
    return hasattr(module.forward, "eagle2_original")


def use_onednn(model: torch.nn.Module, few_rows: int | None = None, own: int | None = None) -> int:
    """Route every float32 (or native bfloat16) CPU nn.Linear of `model` through a prepacked oneDNN kernel; returns how many.
    Inputs of at most `few_rows` rows keep PyTorch's kernel (None: `stock_rows` measures it on these layers;
    stored as `model.eagle2_stock_rows`). Inputs of at most `own` rows run our row kernel where it builds
    and every layer is float32 (None: `own_rows` measures it; 0: never; stored as `model.eagle2_own_rows`).
    All weights are packed before any layer is switched, so a failure
    (a RuntimeError from oneDNN) leaves the model untouched. Packing keeps a second copy of each weight.
    Calling twice is harmless."""
    todo = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and available(m.weight) and not patched(m)]
    packed = [pack(m.weight) for m in todo]
    if not todo:
        return 0
    few = stock_rows(todo, packed) if few_rows is None else few_rows
    if own != 0 and not all(rowkernel.usable(m.weight) for m in todo):
        own = 0
    if own is None:
        own = own_rows(todo, packed, few)
    own = min(own, rowkernel.MAX_ROWS)
    for m, p in zip(todo, packed):
        m.forward = _patched(m, p, few, own)
    model.eagle2_stock_rows, model.eagle2_own_rows = few, own
    return len(todo)


def restore(model: torch.nn.Module) -> None:
    """Put PyTorch's own kernels back in every patched layer of `model`, for good."""
    for m in model.modules():
        if patched(m):
            m.forward = m.forward.eagle2_original


@contextlib.contextmanager
def stock(model: torch.nn.Module) -> Iterator[None]:
    """Run `model` with PyTorch's default kernels inside the block (e.g. for a reference decode)."""
    saved = {m: m.forward for m in model.modules() if patched(m)}
    restore(model)
    try:
        yield
    finally:
        for m, f in saved.items():
            m.forward = f
