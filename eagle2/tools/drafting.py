"""How close is drafting to its limits, and the target's extra rows to the CPU's arithmetic peak?
(`python -m eagle2.tools.drafting`, beside `python -m eagle2.tools.forward`.)

Drafting: ms of a step outside verify (drafting, commit, the record: `autotune.time_drafting_by_width`, every
level drafted in full) at depths 1-6 and top-k 1, 4 and 10, the same prompt and cache for all, the settings taking
turns in each round; a level's share is the step's ms over its depth. A level reads the head's own weights (its
fc and decoder layer, as int8 rows or float32) and its lm_head rows once, so it cannot take less than their bytes
over the memory bandwidth measured here (the limit).

The target's extra verified rows: each row past the first does the target's float32 multiply-adds once more (two
flops per weight of every layer; the argmax reads int8 bounds instead of the float32 lm_head). Their cost (the
second and third rows, which the page's small trees add, and the slope of the engine's verify between 1 and 8
rows) is set against the CPU's fused-multiply-add peak, measured here by the row kernel (`fma_peak`: independent
multiply-adds on every thread, nothing read from memory), and beside it this process's float32 matrix-multiply
rate on a large product (PyTorch's own GEMM), which says how much of that peak a library reaches here.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ..api import decoder_for
from ..cpu import rows as rowkernel
from ..config import DecodeConfig
from ..decode.engine import encode_prompt
from ..loading import load
from .autotune import time_drafting_by_width, time_verify, warmup_texts
from .forward import bandwidth_gbs, emit

DEPTHS = (1, 2, 3, 4, 5, 6)
WIDTHS = (1, 4, 10)


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes a forward of `module` reads from its weights: int8 rows where a layer keeps them, else its float
    weights (oneDNN's packed copies and embeddings aside)."""
    total = 0
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding):
            continue
        own = {n: t for n, t in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
               if t is not None}
        if "q" in own or "codes" in own:
            own.pop("weight", None)
        own.pop("packed", None)
        total += sum(t.numel() * t.element_size() for t in own.values()
                     if t.dtype.is_floating_point or t.dtype in (torch.int8, torch.uint8))
    return total


def draft_bytes(bundle, draft_tokens: int = 0) -> int:
    """Bytes one draft level reads: the head's fc and layer, and its lm_head rows (`Decoder.draft_rows`)."""
    head = module_bytes(bundle.head.fc) + module_bytes(bundle.head.layers)
    rows = decoder_for(bundle).draft_rows(draft_tokens)
    if isinstance(rows.logits, torch.nn.Module):  # our kernels' layer over the rows (int8 where it keeps them)
        return head + module_bytes(rows.logits)
    n = len(rows.ids) if rows.ids is not None else bundle.target.get_output_embeddings().weight.shape[0]
    return head + n * bundle.target.config.hidden_size * torch.finfo(bundle.head.dtype).bits // 8


def gemm_gflops(n: int = 1536, reps: int = 5) -> float:
    """GFLOP/s of this process's float32 n x n x n matrix product (median of `reps`, after one warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        torch.mm(a, b)
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def fma_gflops(rounds: int = 20_000_000, reps: int = 3) -> float | None:
    """The CPU's fused-multiply-add peak in GFLOP/s with this process's threads (the best of `reps` runs of the row
    kernel's `fma_peak`), or None where the kernel is not built."""
    module = rowkernel.load()
    return None if module is None else max(module.fma_peak(rounds) for _ in range(reps))


def target_macs_per_row(bundle) -> int:
    """Multiply-adds one row of the target's layers does (every 2-D weight but the embedding and the lm_head)."""
    head = bundle.target.get_output_embeddings()
    return sum(m.weight.shape[0] * m.weight.shape[1] for m in bundle.target.modules()
               if m is not head and not isinstance(m, torch.nn.Embedding)
               and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2)


def report(bundle, depths=DEPTHS, widths=WIDTHS, draft_tokens: int = 0, rounds: int = 3) -> dict:
    dec = decoder_for(bundle)
    ids = encode_prompt(bundle.tokenizer, warmup_texts(1)[0])
    cfg = DecodeConfig(total_tokens=2, draft_tokens=draft_tokens)
    ms = time_drafting_by_width(dec, ids, cfg, tuple(depths), tuple(widths), rounds=rounds)
    gbs = bandwidth_gbs()
    nbytes = draft_bytes(bundle, draft_tokens)
    limit = nbytes / (gbs * 1e9) * 1e3
    verify = time_verify(dec, ids, (1, 2, 3, 8))
    row_ms = (verify[8] - verify[1]) / 7
    macs, gemm, peak = target_macs_per_row(bundle), gemm_gflops(), fma_gflops()

    def of_peak(ms: float):  # the rate of a row's 2 * macs flops in `ms`, as a share of the FMA peak
        return round(2 * macs / (ms / 1e3) / 1e9 / peak, 3) if peak and ms > 0 else None

    rows_ms = {"2": round(verify[2] - verify[1], 3), "3": round(verify[3] - verify[2], 3), "1-8": round(row_ms, 3)}
    return {"device": bundle.describe(), "bandwidth_gbs": round(gbs, 1), "draft_mb": round(nbytes / 2**20, 2),
            "level_limit_ms": round(limit, 3), "draft_tokens": draft_tokens or "all",
            "drafting": {str(w): {str(d): {"step_ms": round(t, 3), "per_level_ms": round(t / d, 3),
                                           "of_limit": round(limit * d / t, 3)} for d, t in by.items()}
                         for w, by in ms.items()},
            "verify_ms": {str(n): round(t, 3) for n, t in verify.items()}, "extra_row_ms": round(row_ms, 3),
            "extra_rows_ms": rows_ms, "target_mmac_per_row": round(macs / 1e6, 1),
            "fma_peak_gflops": round(peak, 1) if peak else None, "gemm_gflops": round(gemm, 1),
            "gemm_of_fma_peak": round(gemm / peak, 3) if peak else None,
            "extra_rows_of_fma_peak": {k: of_peak(v) for k, v in rows_ms.items()},
            "extra_row_of_gemm_rate": round(2 * macs / (row_ms / 1e3) / 1e9 / gemm, 3) if row_ms > 0 else None}


def format_report(r: dict) -> str:
    lines = [r["device"],
             f"a draft level reads {r['draft_mb']} MB (the head's fc and layer, and its lm_head rows over "
             f"{r['draft_tokens']} tokens): {r['level_limit_ms']} ms at {r['bandwidth_gbs']} GB/s (the limit)",
             "top-k  depth  step ms  ms/level  limit/actual"]
    for w, by in r["drafting"].items():
        lines += [f"{w:>5}  {d:>5}  {v['step_ms']:>7.2f}  {v['per_level_ms']:>8.2f}  {v['of_limit']:>12.0%}"
                  for d, v in by.items()]
    v, extra, share = r["verify_ms"], r["extra_rows_ms"], r["extra_rows_of_fma_peak"]
    lines.append(f"target: verify {v['1']} ms at 1 row, {v['2']} at 2, {v['3']} at 3, {v['8']} at 8; each row does "
                 f"{r['target_mmac_per_row']} M multiply-adds")
    if r["fma_peak_gflops"]:
        lines.append(f"fused-multiply-add peak here {r['fma_peak_gflops']} GFLOP/s; PyTorch's float32 GEMM "
                     f"{r['gemm_gflops']} GFLOP/s ({r['gemm_of_fma_peak']:.0%} of it)")
        at_peak = 2 * r["target_mmac_per_row"] * 1e6 / (r["fma_peak_gflops"] * 1e9) * 1e3
        lines.append(f"a row's multiply-adds take {at_peak:.3f} ms at that peak; each extra row (over 100%: it "
                     "overlaps the weights' stream):")
        lines += [f"  row {k}: {extra[k]} ms more, {share[k]:.0%} of the peak's rate" if share[k] is not None
                  else f"  row {k}: {extra[k]} ms more" for k in extra]
    else:
        lines.append(f"{r['extra_row_ms']} ms a row more (1 to 8 rows); float32 GEMM here {r['gemm_gflops']} "
                     f"GFLOP/s (the row kernel, which measures the FMA peak, is not built)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2.tools.drafting", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--head", default=None)
    ap.add_argument("--draft-tokens", type=int, default=0, help="the draft vocabulary (0: the head's whole one)")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    bundle = load(args.model, args.head, "cpu")
    emit(report(bundle, draft_tokens=args.draft_tokens), format_report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
