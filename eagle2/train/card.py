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


FRONT_MATTER = """---
license: cc-by-nc-4.0
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
datasets:
- tatsu-lab/alpaca
language:
- en
tags:
- eagle
- eagle-2
- speculative-decoding
- draft-head
library_name: pytorch
---
"""


def _command() -> str:
    """This run's command line, without machine paths (absolute paths keep their last part only)."""
    args = [Path(a).name if a.startswith("/") else a for a in sys.argv[1:]]
    if args[:1] == ["train"]:  # run as `python -m eagle2 train ...`
        args = args[1:]
    return " ".join(["python -m eagle2 train"] + args)


def write_card(out: Path, data_dir: str | Path | list, state: dict, report: dict) -> None:
    """Write README.md in Hugging Face model-card form: data and licences, tokens, steps, hardware, wall
    time, held-out agreement and how to reproduce (the shipped head's card has the same sections)."""
    dirs = [data_dir] if isinstance(data_dir, (str, Path)) else list(data_dir)
    manifests = [read_manifest(d) for d in dirs]
    own = [m for m in manifests if not m.get("config", {}).get("teacher")]
    gen = own[0].get("config", {}) if own else {}
    resp = sum(v["response_tokens"] for m in own for v in m["shards"].values())
    seqs = sum(v["sequences"] for m in own for v in m["shards"].values())
    ref = [m for m in manifests if m.get("config", {}).get("teacher")]
    ref_tokens = sum(v["response_tokens"] for m in ref for v in m["shards"].values())
    ref_seqs = sum(v["sequences"] for m in ref for v in m["shards"].values())
    files = sorted({Path(p).name for m in manifests if (p := m.get("source", {}).get("prompts"))})
    prompts = ", ".join(f"`{f}`" for f in files) or "the prompt files given to `train generate`"
    teacher = (f"\n- Also {ref_seqs} reference answers ({ref_tokens:,} tokens) read through the target, "
               "teacher-forced, as inputs; their targets are still the target's own." if ref_seqs else "")
    init = state.get("init")
    warm = ""
    if init and init.get("head"):
        warm = f"\n\nWarm-started from the exported head `{init['head']}`; the numbers here are this run's."
    elif init:
        warm = (f"\n\nWarm-started from an earlier run of the same recipe ({init['step']} steps, "
                f"{init['tokens_seen']:,} positions, {init['seconds'] / 60:.0f} min); the numbers here are this run's.")
    h = report.get("heldout", {})
    sampled = ", some sampled" if gen.get("sample_every") else ""
    cfg = state.get("config", {})
    every = cfg.get("heldout_every", "?")
    deep = cfg.get("unroll", 1)
    unroll = (f"depth{'s 2 to ' if deep > 2 else ' '}{deep} unrolled on the head's own features "
              f"(weight {cfg.get('unroll_weight')})" if deep > 1 else "depth 1 only")
    temp = cfg.get("ce_temperature", 1.0)
    soft_t = f" at temperature {temp}" if cfg.get("ce_target") == "soft" and temp != 1.0 else ""
    autocast = ", bf16 autocast" if cfg.get("autocast") else ""
    epochs = state.get("tokens_seen", 0) / max(state.get("train_tokens", 1), 1)
    nan = float("nan")
    cols = [("top-1", "top1"), ("top-3", "top3"), ("top-10", "top10"), ("depth-2 top-1", "depth2_top1")]
    cols += [("depth-3 top-1", "depth3_top1")] if "depth3_top1" in h else []
    card = FRONT_MATTER + f"""
# EAGLE-1/2 draft head for SmolLM2-135M-Instruct

A one-layer EAGLE draft head for speculative decoding, trained by self-distillation with eagle2-viz
(`python -m eagle2 train`). It reads the target's last hidden state and the next token, predicts the next
hidden state, and proposes tokens through the target's own `lm_head`; the target verifies every proposal.

- Layout of the official EAGLE checkpoints: `config.json` + `model.safetensors` (float16, no `embed_tokens`:
  the target's embedding and `lm_head` are used). Load with `eagle2.heads.eagle.load_head(dir, target)`.

## Training data and licences

- Prompts: {prompts}.
  Stanford Alpaca's prompts are **CC BY-NC 4.0**: a head trained on answers to them is for non-commercial
  use, and this card carries that licence.
- Answers: written by the target itself (greedy{sampled}; at most {gen.get("max_new_tokens", "?")} new tokens),
  with its chat template: {seqs} sequences, {resp:,} answer tokens. The training targets are its post-norm last
  hidden states and its next-token choices.{teacher}
- Held out: every {every}-th greedy sequence ({report.get("heldout_sequences", "?")} sequences,
  {h.get("positions", "?")} positions), never trained on.

## Training

| | |
| --- | --- |
| loss | smooth L1 on the next feature (1.0) + {cfg.get("ce_weight", "?")} x cross-entropy against the target's token ({cfg.get("ce_target", "?")} labels{soft_t}, {cfg.get("ce_vocab", "?")} vocabulary); feature noise {cfg.get("noise", "?")}; {unroll} |
| optimiser | AdamW, peak lr {cfg.get("lr", "?")}, warm-up + cosine, grad clip {cfg.get("grad_clip", "?")}, about {cfg.get("batch_tokens", "?")} tokens a step{autocast} |
| schedule | {state.get("step", "?")} steps, {epochs:.1f} epochs over {state.get("train_tokens", 0):,} training positions |
| wall time | {state.get("seconds", 0) / 60:.0f} min of training |
| hardware | {hardware()} |{warm}

## Held-out agreement

How often the target's next token is the head's top-1 / in its top-3 / top-10, at depth 1 over the full
vocabulary; at depths 2 and 3 the head is fed its own features.

| {" | ".join(c for c, _ in cols)} |
| {" | ".join("---" for _ in cols)} |
| {" | ".join(f"{h.get(k, nan):.3f}" for _, k in cols)} |

## Accept length

Not measured by `train`. Measure it with
`python -m eagle2 bench --prompts assets/bench/mt_bench.jsonl --limit 80 --methods eagle1,eagle2 --head DIR`.

## How to reproduce

```
{_command()}
```
"""
    (out / "README.md").write_text(card)


def write_card3(out: Path, report: dict) -> None:
    """README.md for an EAGLE-3 head from `train eagle3` (same sections as the EAGLE-1/2 card)."""
    cfg, h = report.get("config", {}), report.get("heldout", {})
    steps = sorted(k for k in h if k.startswith("step"))
    front = FRONT_MATTER.replace("- eagle-2\n", "- eagle-2\n- eagle-3\n")
    refs = (f"\n- Also the prompt files' reference answers ({report['reference_tokens']:,} tokens), read by the target "
            "teacher-forced, for training only; their labels are still the target's own distributions."
            if report.get("reference_tokens") else "")
    card = front + f"""
# EAGLE-3 draft head for SmolLM2-135M-Instruct

A one-layer EAGLE-3 draft head for speculative decoding, trained with eagle2-viz (`python -m eagle2 train
eagle3`). It fuses the target's hidden states entering layers {", ".join(map(str, report.get("feature_layers", [])))}
(fc 3H -> H), reads them with the next token, and proposes tokens through its own norm and `lm_head` over a
{report.get("vocab", "?"):,}-token draft vocabulary (d2t maps it to the target's); the target verifies every proposal.

- Layout of the official EAGLE-3 checkpoints: `config.json` (`LlamaForCausalLMEagle3`, `draft_vocab_size`) +
  `model.safetensors` (float16: `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`; no `embed_tokens`).
  `draft_vocab.safetensors` (this project's) lists the draft vocabulary most frequent first.
  Load with `eagle2.heads.eagle.load_head(dir, target)` or `--head DIR`.

## Training data and licences

- Prompts: the files given to `train eagle3` ({report.get("prompts", 0) - report.get("own_prompts", 0):,}
  prompts; the shipped head used a 5,000-row subset of Stanford Alpaca, **CC BY-NC 4.0**, so it is for
  non-commercial use and this card carries that licence) and {report.get("own_prompts", 0):,} prompts the
  target wrote itself (Magpie's pre-query trick; none shares a 6-word sequence with MT-bench).
- Answers: the target's own greedy answers with its chat template, at most {report.get("max_new_tokens", "?")}
  new tokens: {report.get("prompts", 0):,} sequences, {report.get("answer_tokens", 0):,} answer tokens.{refs}
- Held out: every {cfg.get("heldout_every", "?")}-th sequence ({report.get("heldout_sequences", "?")} sequences,
  {h.get("positions", "?")} positions), never trained on.

## Training

| | |
| --- | --- |
| loss | training-time test: the head unrolled {cfg.get("steps", "?")} steps on its own outputs, soft cross-entropy against the target's distribution over the draft vocabulary at each, weight {cfg.get("step_decay", "?")}^k; no feature regression |
| optimiser | AdamW, peak lr {cfg.get("lr", "?")}, warm-up + cosine, grad clip {cfg.get("grad_clip", "?")}, about {cfg.get("batch_tokens", "?")} tokens a step |
| schedule | {report.get("steps", "?")} of {report.get("total_steps", "?")} steps |
| wall time | {report.get("minutes", "?")} min in all (data and training), {report.get("seconds", 0) / 60:.1f} min of training |
| hardware | {report.get("hardware", hardware())} |

## Held-out agreement

How often the head's top-1 is the target's greedy token, at each unrolled step (step k: the head fed its own
outputs k times, as a depth-(k+1) draft node is).

| {" | ".join(steps)} |
| {" | ".join("---" for _ in steps)} |
| {" | ".join(f"{h[k]:.3f}" for k in steps)} |

## Accept length

Not measured by `train`. Measure it with
`python -m eagle2 bench --prompts assets/bench/mt_bench.jsonl --methods eagle1,eagle2 --head DIR`.

## How to reproduce

```
{_command()}
```
"""
    (out / "README.md").write_text(card)
