"""How close is the target's forward to this machine's memory limit? Milliseconds per verify forward at the row
counts decoding uses, beside the time it takes just to read the weights once at the memory bandwidth measured
here (`python -m eagle2.tools.forward`).

A one-row forward of a small model on a CPU is bound by memory: every weight is read once, so the forward cannot
take less than (bytes of weights read) / (bytes per second the memory delivers). The report times the engine's
own verify (tree mask, the stock model over its cache, the head's features; `autotune.time_verify`, the sizes
taking turns in each round, medians, made non-decreasing) and measures the bandwidth as the median of repeated
sums over a buffer far larger than the caches, with this process's threads.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ..api import decoder_for
from ..decode.engine import encode_prompt
from ..loading import load
from .autotune import VERIFY_CONTEXT, time_verify, warmup_texts

ROWS = (1, 2, 4, 5, 6, 8, 16, 26, 32)
BUFFER_MB = 1024


def bandwidth_gbs(mb: int = BUFFER_MB, reps: int = 7) -> float:
    """GB/s that a sum over `mb` MB of float32 reads at (median of `reps`, after one warm-up)."""
    x = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        x.sum()
        if i:
            times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(bundle, stock: bool = False) -> int:
    """Bytes one greedy target forward reads: every weight its layers multiply by (the buffers its kernels read,
    such as int8 rows or exact four-bit codes, in place of the float32 one they replace), the embedding row aside;
    with the bounded argmax (`bundle.greedy`), its int8 (or bf16) bounds in place of the lm_head. `stock`: the
    float32 weights of every layer and of the lm_head instead, as a stock forward reads them."""
    if stock:  # every 2-D weight a layer multiplies by (the lm_head's too), the embedding aside
        return sum(m.weight.numel() * m.weight.element_size() for m in bundle.target.modules()
                   if not isinstance(m, torch.nn.Embedding) and isinstance(getattr(m, "weight", None), torch.Tensor)
                   and m.weight.dim() == 2)
    total = 0
    head = bundle.target.get_output_embeddings()
    bounds = getattr(getattr(bundle.greedy, "bounds", None), "q", None)
    if bounds is None:
        bounds = getattr(getattr(bundle.greedy, "bounds", None), "packed", None)
    if bounds is not None:
        total += bounds.numel() * bounds.element_size()
    for module in bundle.target.modules():
        if isinstance(module, torch.nn.Embedding) or (bounds is not None and module is head):
            continue
        own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        tensors = {n: t for n, t in own if t is not None}
        if "q" in tensors or "codes" in tensors:  # an int8 FastLinear reads its int8 rows, a four-bit one its codes
            tensors.pop("weight", None)
        tensors.pop("packed", None)  # oneDNN's packed copy serves prefill; decoding's rows read the weight
        total += sum(t.numel() * t.element_size() for t in tensors.values() if t.dtype.is_floating_point
                     or t.dtype in (torch.int8, torch.uint8))
    return total


def report(bundle, rows=ROWS) -> dict:
    """ms per verify forward at each row count, the bandwidth, and each forward's share of the memory limit."""
    dec = decoder_for(bundle)
    ids = encode_prompt(bundle.tokenizer, warmup_texts(1)[0])
    ms = time_verify(dec, ids, tuple(rows))
    gbs = bandwidth_gbs()
    nbytes, stock = weight_bytes(bundle), weight_bytes(bundle, stock=True)
    limit_ms, stock_ms = nbytes / (gbs * 1e9) * 1e3, stock / (gbs * 1e9) * 1e3
    return {"device": bundle.describe(), "context": VERIFY_CONTEXT, "bandwidth_gbs": round(gbs, 1),
            "weight_mb": round(nbytes / 2**20, 1), "limit_ms": round(limit_ms, 2),
            "float32_weight_mb": round(stock / 2**20, 1), "float32_limit_ms": round(stock_ms, 2),
            "rows": {str(n): {"ms": round(t, 2), "of_limit": round(limit_ms / t, 3),
                              "of_float32_limit": round(stock_ms / t, 3)} for n, t in ms.items()}}


def format_report(r: dict) -> str:
    lines = [r["device"],
             f"memory read at {r['bandwidth_gbs']} GB/s; the weights one forward reads, {r['weight_mb']} MB, "
             f"take {r['limit_ms']} ms at that rate (the limit); the float32 weights, {r['float32_weight_mb']} MB, "
             f"{r['float32_limit_ms']} ms; cache of {r['context']} tokens",
             "rows  ms/forward  limit/actual  float32 limit/actual"]
    lines += [f"{n:>4}  {v['ms']:>10.2f}  {v['of_limit']:>12.0%}  {v['of_float32_limit']:>20.0%}"
              for n, v in r["rows"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2.tools.forward", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--head", default=None)
    ap.add_argument("--kernels", default="auto", help="auto (this machine's plan) or torch (stock kernels only)")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    bundle = load(args.model, args.head, "cpu", kernels=args.kernels)
    emit(report(bundle), format_report, args.json)
    return 0


def emit(r: dict, format_report, json_path: str | None) -> None:
    """A report printed in words, and written as JSON where asked (this one and the drafting report)."""
    print(format_report(r))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
