"""This machine's profile for the page: the paper's EAGLE-2 tuned to its fastest size here, and the measured
costs behind that choice (a verify of n rows, a step's drafting at each depth), cached per machine.

The page compares both trees at this size on a CPU, and draws the costs as the break-even accept length each
tree size needs. Tuning takes up to a minute on 2 CPU cores, once: the result is kept in the cache folder
under a key naming the machine, the software and the model, and is reused until one of them changes. On CUDA
the page uses the paper's settings instead, and no profile is needed.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..api import decoder_for, run
from .autotune import NARROW_DRAFT, tune, warmup_texts
from ..config import DecodeConfig, cache_dir
from ..cpu.plan import cpu_name
from ..decode.engine import encode_prompt
from ..loading import Bundle
from ..policies import DYNAMIC, PLAIN, STATIC

# From 3 nodes (2 drafted: EAGLE-1 always verifies the draft's top two children of the root, EAGLE-2 the best two
# of everything it drafted, a fork or a chain as the draft's confidence says; at 2 both verify the draft's top token
# alone, the same algorithm) up to EAGLE-1's whole tree; from depth 2, so that EAGLE-2 can grow a tree of more than
# one level. On a CPU whose one-row step is cheap, 3 nodes is often the fastest tree (a fourth node costs about
# as much as it gains).
PAGE_SIZES = (3, 4, 5, 6, 8, 10, 12, 16, 20, 26)
PAGE_DEPTHS = (2, 3, 4, 5, 6)
PAGE_PROMPTS = 4  # tuning prompts warmed up on (the tuner's first four kinds of task)
# 8: a draft level in one call, the target's codes streamed; 7: sizes from 3 nodes; 6: int8 rows times int16
# inputs; 5: weights fetched ahead, eight rows in registers; 4: the layers in one call
VERSION = 8
HOW = ("verify timed at each size in 8 interleaved rounds (the first a warm-up) and drafting at each depth in 3, "
       "as a chain and at full width, each cost the median of its rounds, made non-decreasing in rows and depth")
RECHECK = 0.2  # a run whose verify cost differs from the profile's by more than this share has it measured again


def machine_key(bundle: Bundle) -> dict:
    """What the measurements depend on: the processor, its cores, the software, the model, head and kernels."""
    return {"version": VERSION, "cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "device": bundle.device.type, "model": bundle.model_name, "setup": bundle.describe()}


def _path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"profile-{digest}.json"


def warm_up(bundle: Bundle) -> None:
    """Run each method once briefly, so that a visitor's first run does not pay for first-use costs, then freeze
    the objects that exist now out of the garbage collector's way (it would walk them inside timed phases)."""
    ids = encode_prompt(bundle.tokenizer, warmup_texts(1)[0])
    for method in (DYNAMIC, STATIC, PLAIN):  # what the page runs: both panels and plain decoding
        run(bundle, ids, DecodeConfig(method=method, max_new_tokens=8, total_tokens=6))
    gc.collect()
    gc.freeze()


def load_profile(bundle: Bundle) -> dict | None:
    """The cached profile of this machine and model, or None when there is none yet."""
    key = machine_key(bundle)
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if data.get("key") == key else None


def machine_profile(bundle: Bundle, progress=None) -> dict:
    """This machine's profile (`load_profile`), tuning it first when there is none (up to a minute on a CPU)."""
    cached = load_profile(bundle)
    if cached is not None:
        return cached
    dec = decoder_for(bundle)
    prompts = [encode_prompt(bundle.tokenizer, t) for t in warmup_texts(PAGE_PROMPTS)]
    vocab = (0, NARROW_DRAFT) if dec.draft_ids is not None and len(dec.draft_ids) > NARROW_DRAFT else (0,)
    t0 = time.perf_counter()
    tuning = tune(dec, prompts, DecodeConfig(), methods=("eagle2",), sizes=PAGE_SIZES, depths=PAGE_DEPTHS,
                  progress=progress, draft_tokens=vocab)
    best = tuning.chosen["eagle2"]
    profile = {
        "key": machine_key(bundle), "measured": time.strftime("%Y-%m-%d %H:%M"), "how": HOW,
        "tuning_s": round(time.perf_counter() - t0, 1),
        "eagle2": {"total_tokens": best.total_tokens, "depth": best.depth, "top_k": best.top_k,
                   "draft_tokens": tuning.draft_tokens, "tau": round(best.tau, 3),
                   "tokens_per_s": round(best.tokens_per_s, 2)},
        "verify_ms": {str(n): round(ms, 2) for n, ms in tuning.verify_ms.items()},
        "rest_ms": {str(d): round(ms, 2) for d, ms in tuning.rest_ms.items()},
    }
    path = _path(profile["key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(profile, indent=1))
    tmp.replace(path)  # atomic: two processes tuning at once both leave a whole file
    return profile


def tuned_config(profile: dict, cfg: DecodeConfig) -> DecodeConfig:
    """`cfg` with the profile's EAGLE-2 size, depth, top-k and draft vocabulary."""
    e = profile["eagle2"]
    return replace(cfg, total_tokens=e["total_tokens"], depth=e["depth"], top_k=e["top_k"],
                   draft_tokens=e["draft_tokens"])


def forget_profile(bundle: Bundle) -> None:
    """Drop the cached profile of this machine and model, so that the next use measures it again."""
    _path(machine_key(bundle)).unlink(missing_ok=True)


def check_profile(profile: dict, records: list, total_tokens: int, plain: list | None = None) -> dict | None:
    """How a run's own EAGLE-2 verify cost compares with the profile's prediction for that many rows: the median
    of the run's drafted steps' verify ms, the profile's ms at `total_tokens` rows, their ratio, and whether it is
    within RECHECK of 1 (None when the run has no drafted step or the profile no verify costs).

    With `plain` (the same run's plain decoding records) and a one-row cost in the profile, what must hold is the
    shape: the tree's verify against plain decoding's one-row step, measured and predicted ("shape", their
    ratio). The sizes follow from costs relative to a step, so a machine that is slower or faster throughout
    (another tenant, a clock) leaves the choice standing and does not make the next visitor wait for a new
    profile."""
    from .serving import interpolate

    ms = sorted(r.verify_ms for r in records if r.nodes)
    costs = {int(n): float(v) for n, v in (profile.get("verify_ms") or {}).items()}
    if not ms or not costs:
        return None
    measured = ms[len(ms) // 2]
    predicted = interpolate(costs, total_tokens)
    ratio = measured / predicted if predicted > 0 else float("inf")
    out = {"measured_ms": round(measured, 2), "predicted_ms": round(predicted, 2), "rows": total_tokens,
           "ratio": round(ratio, 3), "ok": abs(ratio - 1) <= RECHECK}
    one = sorted(r.verify_ms for r in plain or () if r.step > 0)
    if one and costs.get(1, 0) > 0 and one[len(one) // 2] > 0:
        plain_ms = one[len(one) // 2]
        shape = (measured / plain_ms) / (predicted / costs[1])
        out.update(plain_ms=round(plain_ms, 2), predicted_plain_ms=round(costs[1], 2), shape=round(shape, 3),
                   ok=abs(shape - 1) <= RECHECK)
    return out
