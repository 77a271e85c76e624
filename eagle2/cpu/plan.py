"""Which kernel runs which row count on this machine: timed once, kept in the cache folder, shown at load.

The first time a model with these layer shapes loads on this machine, `plan_for` times PyTorch's kernel
against oneDNN's prepacked one over the model's own linear layers (`onednn.stock_rows`), then our row kernel
against that choice (`onednn.own_rows`), and writes the answer under a key naming the processor, its cores,
the software and the shapes. Later loads read it, so two runs dispatch alike; EAGLE2_KERNELS_RETIME=1 times
again. A wrong answer costs only speed: every kernel computes the same products.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..config import cache_dir
from ..files import write_atomic
from . import onednn
from . import rows as rowkernel

KERNELS = ("auto", "onednn", "torch")


@dataclass(frozen=True)
class KernelPlan:
    """oneDNN's prepacked matmul beyond `stock_rows` rows (PyTorch's up to there); our row kernel up to
    `own_rows` rows (0: not built here, or not faster)."""

    onednn: bool = False
    stock_rows: int = 0
    own_rows: int = 0

    def describe(self) -> str:
        if not self.onednn:
            return "torch matmuls"
        own = f" (our row kernel up to {self.own_rows} row{'s' * (self.own_rows > 1)})" if self.own_rows else ""
        return f"onednn matmuls{own}"


def cpu_name() -> str:
    """The processor's model name (what per-machine measurements are kept under)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and onednn.available(m.weight)]


def plan_for(models: list[torch.nn.Module], kernels: str = "auto") -> KernelPlan:
    """The kernel plan for these models' linear layers on this machine (`kernels`: auto, onednn or torch)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
    layers = [m for model in models for m in _layers(model)]
    if kernels == "torch" or not layers:
        if kernels == "onednn":
            raise ValueError("kernels=onednn needs float32 weights on a CPU with oneDNN; use kernels=torch")
        return KernelPlan()
    key = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
           "row_kernel": "built" if rowkernel.load() is not None else rowkernel.failure(),
           "shapes": sorted({(m.out_features, m.in_features, str(m.weight.dtype)) for m in layers})}
    path = cache_dir() / f"kernels-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]}.json"
    if os.environ.get("EAGLE2_KERNELS_RETIME") != "1":
        try:
            return KernelPlan(**json.loads(path.read_text())["plan"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    mains = [m for m in _layers(models[0])] or layers  # timed over the target's layers: they dominate a step
    packed = [onednn.pack(m.weight) for m in mains]
    few = onednn.stock_rows(mains, packed)
    own = onednn.own_rows(mains, packed, few) if all(rowkernel.usable(m.weight) for m in mains) else 0
    plan = KernelPlan(onednn=True, stock_rows=few, own_rows=min(own, rowkernel.MAX_ROWS))
    write_atomic(path, json.dumps({"key": key, "plan": asdict(plan)}, indent=1))  # whole or not at all
    return plan
