"""Our own float32 matmul for a few rows (eagle2/csrc/rows_linear.cpp), built on first use.

Decoding multiplies one row, and verifying a tree a handful, by weights far larger than the caches. The
kernel streams each weight block once and multiplies it with every row while it is in L1, so a few more
rows cost little more than one; and each output is the same sum in the same order whatever the row count,
so a verified row is bit for bit what a one-row step computes. It needs AVX-512 and a C++ compiler (with
`ninja`, a pinned requirement); it is compiled once (about 30 s) into PyTorch's extension cache
(~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR). Where it cannot be built, `load` says why and the
layers keep PyTorch's and oneDNN's kernels (eagle2/cpu/linear.py).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import torch

MAX_ROWS = 32  # FastLinear never offers it more rows (prefill goes to oneDNN, a blocked GEMM)
SOURCE = Path(__file__).with_name("csrc") / "rows_linear.cpp"
log = logging.getLogger(__name__)

_state: dict[str, object] = {}


def why_not() -> str | None:
    """Why the kernel cannot run here (None when it can be tried)."""
    if os.environ.get("EAGLE2_ROW_KERNEL", "1") == "0":
        return "turned off by EAGLE2_ROW_KERNEL=0"
    cap = torch.backends.cpu.get_cpu_capability()
    if "AVX512" not in cap.upper():
        return f"needs AVX-512 (this CPU: {cap})"
    return None


def load():
    """The compiled module, or None (and the reason in `failure()`); built once per process."""
    if "module" in _state:
        return _state["module"]
    module, reason = None, why_not()
    if reason is None:
        try:
            from torch.utils import cpp_extension
            start = time.perf_counter()
            module = cpp_extension.load(name="eagle2_rows", sources=[str(SOURCE)],
                                        extra_cflags=["-O3", "-mavx512f", "-fopenmp"],
                                        extra_ldflags=["-fopenmp"], verbose=False)
            took = time.perf_counter() - start
            if took > 3:  # a build, not a cached load: say where the time went
                print(f"eagle2: built the row kernel in {took:.0f} s (once per machine)", file=sys.stderr)
        except Exception as e:  # no compiler, no ninja, a failed build: keep the stock kernels
            reason = f"could not be built ({type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''})"
    _state["module"], _state["failure"] = module, reason
    if reason:
        log.warning("row kernel off: %s", reason)
    return module


def failure() -> str | None:
    """Why `load` returned None (after it ran)."""
    return _state.get("failure")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) through the row kernel; float32 CPU, weight contiguous, `load()` not None."""
    return load().rows_linear(x, weight, bias)


def q8_upper(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """(M, K) float32 x and int8 rows q (N, K) with per-row scale and slack (N,) -> (M, N) upper bounds
    scale_t x.q_t + 2^-22 |that| + |x|_1 slack_t (eagle2/cpu/argmax.py); `load()` not None."""
    return load().q8_upper(x, q, scale, slack)


def q8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 x @ (scale[:, None] * q).T (+ bias) for int8 rows q (eagle2/cpu/int8.py); `load()` not None."""
    return load().q8_linear(x, q, scale, bias)


def usable(weight: torch.Tensor) -> bool:
    """Whether this weight can go through the kernel (float32, CPU, contiguous) and the kernel is built."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.is_contiguous()
            and load() is not None)
