"""The model card (README.md) written next to an exported draft head."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

from .data import read_manifest


def hardware() -> str:
    """A one-line description of where training ran."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return (f"CPU only ({platform.machine()}, {os.cpu_count()} cores shared with other jobs, "
            f"{torch.get_num_threads()} torch thread(s))")


def write_card(out: Path, data_dir: str | Path | list, state: dict, report: dict) -> None:
    """Write README.md: data and licence, token counts, steps, wall time, hardware, held-out agreement."""
    dirs = [data_dir] if isinstance(data_dir, (str, Path)) else list(data_dir)
    manifests = [read_manifest(d) for d in dirs]
    own = [m for m in manifests if not m.get("config", {}).get("teacher")]
    gen = own[0].get("config", {}) if own else {}
    resp = sum(v["response_tokens"] for m in own for v in m["shards"].values())
    seqs = sum(v["sequences"] for m in own for v in m["shards"].values())
    ref = [m for m in manifests if m.get("config", {}).get("teacher")]
    ref_tokens = sum(v["response_tokens"] for m in ref for v in m["shards"].values())
    ref_seqs = sum(v["sequences"] for m in ref for v in m["shards"].values())
    teacher = (f"\n- Also {ref_seqs} Alpaca reference answers ({ref_tokens:,} tokens) read by the target "
               "(teacher-forced): the head's inputs are then Alpaca's words, but its targets are still the "
               "target's own features and greedy tokens." if ref_seqs else "")
    init = state.get("init")
    warm = ""
    if init and init.get("head"):
        warm = f"\n- Warm-started from the exported head `{init['head']}`; the numbers above are this run's."
    elif init:
        warm = (f"\n- Warm-started from an earlier run of the same recipe ({init['step']} steps, "
                f"{init['tokens_seen']:,} positions, {init['seconds'] / 60:.0f} min); the numbers above are this run's.")
    h = report.get("heldout", {})
    sampled = ", some sampled" if gen.get("sample_every") else ""
    cfg = state.get("config", {})
    every = cfg.get("heldout_every", "?")
    deep = cfg.get("unroll", 1)
    unroll = (f"depth{'s 2 to ' if deep > 2 else ' '}{deep} unrolled on the head's own features "
              f"(weight {cfg.get('unroll_weight')})" if deep > 1 else "depth 1 only")
    depth3 = f"; at depth 3, fed its own depth-2 feature: {h['depth3_top1']:.3f}" if "depth3_top1" in h else ""
    temp = cfg.get("ce_temperature", 1.0)
    soft_t = f" at temperature {temp}" if cfg.get("ce_target") == "soft" and temp != 1.0 else ""
    epochs = state.get("tokens_seen", 0) / max(state.get("train_tokens", 1), 1)
    args = [Path(a).name if a.startswith("/") else a for a in sys.argv[1:]]  # no machine paths in the card
    command = " ".join(["python -m eagle2.train.cli"] + args)
    card = f"""---
license: cc-by-nc-4.0
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
tags: [eagle, speculative-decoding, draft-head]
---
# EAGLE-1/2 draft head for SmolLM2-135M-Instruct

One-layer EAGLE draft head (official layout: `config.json` + `model.safetensors`, float16, no `embed_tokens`:
the target's embedding and `lm_head` are used). Load with `eagle2.head.load_head(dir, target)`.

## Data

- Prompts: a 5,000-row subset of Stanford Alpaca (tatsu-lab/stanford_alpaca), **CC BY-NC 4.0**: this head is a
  derivative of that data and is for non-commercial use.
- Responses: self-distilled, i.e. written by SmolLM2-135M-Instruct itself (greedy{sampled};
  at most {gen.get("max_new_tokens", "?")} new tokens), formatted with its chat template. The targets are its
  post-norm last hidden states at each position (kept while it generated, or from one teacher-forced pass) and
  its greedy next tokens.
- Self-distilled: {seqs} sequences, {resp:,} response tokens; every {every}-th greedy sequence held out
  ({report.get("heldout_sequences", "?")} sequences, {h.get("positions", "?")} positions).{teacher}

## Training

- Loss: smooth L1 on the next feature (1.0) + {cfg.get("ce_weight", "?")} x cross-entropy against the target's
  token ({cfg.get("ce_target", "?")} labels{soft_t}, {cfg.get("ce_vocab", "?")} vocabulary);
  feature noise {cfg.get("noise", "?")};
  {unroll}.
- AdamW, peak lr {cfg.get("lr", "?")}, warm-up + cosine, grad clip {cfg.get("grad_clip", "?")},
  about {cfg.get("batch_tokens", "?")} tokens per step; {state.get("step", "?")} steps,
  {epochs:.1f} epochs over {state.get("train_tokens", 0):,} training positions,
  wall time {state.get("seconds", 0) / 60:.0f} min.
- Hardware: {hardware()}.{warm}

## Held-out agreement (depth 1, full vocabulary)

How often the target's next token is the head's top-1 / in its top-3 / top-10:

| top-1 | top-3 | top-10 |
| --- | --- | --- |
| {h.get("top1", float("nan")):.3f} | {h.get("top3", float("nan")):.3f} | {h.get("top10", float("nan")):.3f} |

At depth 2, fed its own depth-1 feature: top-1 {h.get("depth2_top1", float("nan")):.3f}{depth3}.

## Reproduce

```
python -m eagle2 train generate --prompts alpaca_5000.json --out SELF --skip 256
python -m eagle2 train generate --prompts alpaca_5000.json --out REF --skip 2500 --teacher --batch-size 8
python -m eagle2 train fit --data SELF --train-only REF --out CKPT --unroll 2 --budget-minutes 30 \\
    --save-head assets/smollm2-135m-eagle
```

This run: `{command}`.
"""
    (out / "README.md").write_text(card)
