"""Training loop of the EAGLE-1/2 draft head on self-distilled shards.

At position i the head reads (embedding of x_{i+1}, target feature f_i) and predicts f_{i+1}. The loss is
EAGLE's: smooth L1 on the predicted feature (weight 1.0) plus cross-entropy (weight 0.1) of the head's token
distribution, through the target's frozen lm_head, against the target's next token (`hard`) or its whole
distribution softmax(lm_head(f_{i+1})) (`soft`). Only the head's fc and decoder layer learn; the target's
embedding and lm_head stay frozen. Checkpoints are plain tensors, read back with weights_only=True.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DynamicCache

from ..heads.eagle import DraftHead
from .checkpoint import initial_weights, latest_checkpoint, load_latest_head, save_checkpoint, trainable_head
from .batches import causal_mask, collate, load_split, make_batches, split, trim
from .data import Sequence


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run."""

    epochs: float = 2.0
    lr: float = 1e-3
    warmup: float = 0.05             # fraction of steps with a linear warm-up, then cosine to zero
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    batch_tokens: int = 2048         # padded tokens per step
    context: int = 32                # prompt tokens kept before each response in training
    noise: float = 0.0               # half-width of uniform noise added to input features
    ce_weight: float = 0.1
    ce_target: str = "hard"          # "hard": the target's token; "soft": its full distribution
    ce_temperature: float = 1.0      # soft labels: softmax(target logits / this); below 1 leans to the greedy token
    ce_vocab: str = "data"           # "full" vocabulary, or the target's most frequent tokens in the data
    ce_vocab_size: int = 16384       # how many of those (labels outside them only get the feature loss)
    heldout_every: int = 25          # every n-th greedy sequence is held out
    save_every: int = 200
    max_minutes: float = 0.0         # 0: no time limit
    budget_minutes: float = 0.0      # >0: after 30 steps, shorten the schedule to end within this wall time
    autocast: bool = False           # bf16 autocast (pays only with bf16 matmul hardware)
    unroll: int = 1                  # d > 1: also train depths 2..d on the head's own features
    unroll_weight: float = 0.5       # weight of each deeper depth's loss
    seed: int = 0


def head_forward(head: DraftHead, batch: dict[str, torch.Tensor], noise: float = 0.0,
                 depth: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """Per draft depth: (predicted features (B, T', H), target features, training mask, labels).

    Depth d > 1 feeds the head its own depth d-1 output, as drafting does: at position j+d-1 the input is
    (x_{j+d}, p_{j+d-1}); it sees the real pairs at positions 0..j (kept in a cache), its own entries of
    depths 2..d-1 on that path (at positions j+1..j+d-2) and itself.
    """
    feats = batch["in_feats"]
    if noise > 0:
        feats = feats + (torch.rand_like(feats) * 2 - 1) * noise
    b, t = batch["in_tokens"].shape
    dev = batch["in_tokens"].device
    pos = torch.arange(t, device=dev)[None].expand(b, t)
    cache = DynamicCache(config=head.config) if depth > 1 else None
    prev = head(batch["in_tokens"], feats, causal_mask(batch["key_valid"], torch.float32), pos, cache)  # (B, T, H)
    out = [(prev, batch["target"], batch["train_pos"], batch["labels"])]
    for d in range(2, depth + 1):
        s, n = d - 1, t - d + 1  # shift and number of queries: query k sits at position k + s
        real = torch.ones(n, t, dtype=torch.bool, device=dev).tril()[None] & batch["key_valid"][:, None, :]
        own = [torch.eye(n, t - e + 1, dtype=torch.bool, device=dev) for e in range(2, d + 1)]  # depths 2..d
        keep = torch.cat([real] + [o[None].expand(b, -1, -1) for o in own], dim=-1)
        mask = torch.zeros(keep.shape, device=dev).masked_fill(~keep, torch.finfo(torch.float32).min)[:, None]
        prev = head(batch["in_tokens"][:, s:], prev[:, :-1], mask, pos[:, s:], cache)  # (B, T-s, H)
        out.append((prev, batch["target"][:, s:], batch["train_pos"][:, s:], batch["labels"][:, s:]))
    return out


def losses(pred: torch.Tensor, target: torch.Tensor, m: torch.Tensor, labels: torch.Tensor, lm_weight: torch.Tensor,
           cfg: TrainConfig, vocab: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(smooth-L1 feature loss, cross-entropy) averaged over the training positions `m`."""
    p, tgt = pred[m].float(), target[m]  # (N, H)
    reg = F.smooth_l1_loss(p, tgt, reduction="none").mean(-1).mean()
    w = lm_weight if vocab is None else lm_weight[vocab]
    logp = torch.log_softmax(p @ w.T, dim=-1)  # (N, V')
    if cfg.ce_target == "soft":
        with torch.no_grad():
            q = torch.softmax((tgt @ w.T) / cfg.ce_temperature, dim=-1)
        ce = -(q * logp).sum(-1).mean()
    else:
        labels = labels[m]
        if vocab is not None:
            labels = _remap(labels, vocab, lm_weight.shape[0])
        ce = F.nll_loss(logp, labels, ignore_index=-100) if (labels >= 0).any() else logp.sum() * 0
    return reg, ce


def _remap(labels: torch.Tensor, vocab: torch.Tensor, size: int) -> torch.Tensor:
    """Full-vocabulary ids -> indices into `vocab` (-100 where absent)."""
    table = torch.full((size,), -100, dtype=torch.long, device=labels.device)
    table[vocab] = torch.arange(len(vocab), device=labels.device)
    return torch.where(labels >= 0, table[labels.clamp(min=0)], labels)


def target_choices(seqs: list[Sequence]) -> torch.Tensor:
    """The target's greedy next token at every trained position of `seqs` (-100 where there is none)."""
    return torch.cat([s.next_argmax()[max(s.start - 1, 0):] for s in seqs])


def data_vocab(seqs: list[Sequence], size: int) -> torch.Tensor:
    """The `size` tokens the target chooses most often in `seqs` (sorted ids): the cross-entropy's vocabulary."""
    labels = target_choices(seqs)
    ids, counts = torch.unique(labels[labels >= 0], return_counts=True)
    return ids[counts.argsort(descending=True)[:size]].sort().values


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warm-up then cosine decay to zero."""
    warm = max(1, int(cfg.warmup * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


@torch.no_grad()
def evaluate(head: DraftHead, lm_weight: torch.Tensor, seqs: list[Sequence], cfg: TrainConfig,
             ks: tuple[int, ...] = (1, 3, 10)) -> dict[str, float]:
    """Agreement on `seqs`: how often the target's token is in the head's top-k (full vocabulary) at depth 1,
    and its top-1 at depths 2 and 3 (each fed the head's own feature from the depth above)."""
    was = head.training
    head.eval()
    hits, n, reg_sum = {k: 0 for k in ks}, 0, 0.0
    deep_hits, deep_n = {2: 0, 3: 0}, {2: 0, 3: 0}
    for idx in make_batches(seqs, cfg.batch_tokens, random.Random(0)):
        batch = collate([seqs[i] for i in idx], lm_weight.device)
        (p1, tgt, m, labels), *deeper = head_forward(head, batch, depth=3)
        m = m & (labels >= 0)
        top = (p1[m].float() @ lm_weight.T).topk(max(ks), dim=-1).indices  # (N, kmax)
        match = top == labels[m][:, None]
        for k in ks:
            hits[k] += int(match[:, :k].any(-1).sum())
        n += int(m.sum())
        reg_sum += float(F.smooth_l1_loss(p1[m].float(), tgt[m], reduction="none").mean(-1).sum())
        for d, (p, _, md, ld) in enumerate(deeper, start=2):
            md = md & (ld >= 0)
            deep_hits[d] += int(((p[md].float() @ lm_weight.T).argmax(-1) == ld[md]).sum())
            deep_n[d] += int(md.sum())
    head.train(was)
    return {**{f"top{k}": hits[k] / max(n, 1) for k in ks},
            **{f"depth{d}_top1": deep_hits[d] / max(deep_n[d], 1) for d in deep_hits},
            "feature_loss": reg_sum / max(n, 1), "positions": n}


def train(target, data_dir: str | Path | list, ckpt_dir: str | Path, cfg: TrainConfig, init: str | Path | None = None,
          seqs: list[Sequence] | None = None, train_only: list | None = None) -> dict:
    """Train a head, resuming from the newest checkpoint in `ckpt_dir`; returns the final report."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if seqs is not None:
        train_set, held = split(seqs, cfg.heldout_every)
    else:
        train_set, held = load_split(data_dir, cfg.heldout_every, train_only)
    train_set = [trim(s, cfg.context) for s in train_set]
    lm_weight = target.get_output_embeddings().weight.detach().float()
    vocab = data_vocab(train_set, cfg.ce_vocab_size).to(lm_weight.device) if cfg.ce_vocab == "data" else None

    head, params = trainable_head(target, cfg.seed)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    state = {"step": 0, "epoch": 0, "batch": 0, "seconds": 0.0, "tokens_seen": 0, "config": asdict(cfg),
             "sequences": len(train_set), "train_tokens": sum(len(s.tokens) - s.start for s in train_set)}
    last = latest_checkpoint(ckpt_dir)
    if last is not None:
        ck = torch.load(last, map_location="cpu", weights_only=True)
        head.load_state_dict(ck["head"], strict=False)
        opt.load_state_dict(ck["opt"])
        state.update({k: ck["state"][k] for k in ("step", "epoch", "batch", "seconds", "tokens_seen")})
        state.update({k: ck["state"][k] for k in ("total_steps", "sized", "init") if k in ck["state"]})
    elif init is not None:
        weights, state["init"] = initial_weights(target, init)  # state["init"]: for the model card
        head.load_state_dict(weights, strict=False)

    steps_per_epoch = len(make_batches(train_set, cfg.batch_tokens, random.Random(cfg.seed)))
    total = state.get("total_steps") or math.ceil(cfg.epochs * steps_per_epoch)
    state["total_steps"] = total
    t_start, t_base, step0 = time.time(), state["seconds"], state["step"]
    bar = tqdm(total=total, initial=state["step"], unit="step", desc="train head", smoothing=0.05)
    stopped = False
    while state["step"] < total and not stopped:
        batches = make_batches(train_set, cfg.batch_tokens, random.Random(cfg.seed + state["epoch"]))
        for bi in range(state["batch"], len(batches)):
            if state["step"] >= total:
                break
            batch = collate([train_set[i] for i in batches[bi]], lm_weight.device)
            for g in opt.param_groups:
                g["lr"] = lr_at(state["step"], total, cfg)
            with torch.autocast(lm_weight.device.type, dtype=torch.bfloat16, enabled=cfg.autocast):
                preds = head_forward(head, batch, cfg.noise, cfg.unroll)
            parts = [losses(pred, tgt, m, labels, lm_weight, cfg, vocab) for pred, tgt, m, labels in preds]
            loss = sum((1.0 if d == 0 else cfg.unroll_weight) * (reg + cfg.ce_weight * ce)
                       for d, (reg, ce) in enumerate(parts))
            reg, ce = parts[0]  # shown in the progress bar: depth 1
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            state.update(step=state["step"] + 1, batch=bi + 1, seconds=t_base + time.time() - t_start,
                         tokens_seen=state["tokens_seen"] + int(batch["train_pos"].sum()))
            bar.update()
            bar.set_postfix(reg=f"{reg.item():.3f}", ce=f"{ce.item():.2f}", ep=state["epoch"],
                            tok_s=f"{state['tokens_seen'] / max(state['seconds'], 1e-9):.0f}")
            if cfg.budget_minutes and not state.get("sized") and state["step"] - step0 >= 30:
                per_step = (time.time() - t_start) / (state["step"] - step0)
                left = int((cfg.budget_minutes * 60 - state["seconds"]) / per_step)
                total = bar.total = state["total_steps"] = min(total, state["step"] + max(left, 1))
                state["sized"] = True
            if cfg.max_minutes and time.time() - t_start > cfg.max_minutes * 60:
                stopped = True
            if state["step"] % cfg.save_every == 0 or stopped:
                save_checkpoint(ckpt_dir, head, opt, state)
                if held:
                    tqdm.write(f"step {state['step']}: held-out {evaluate(head, lm_weight, held[:40], cfg)}")
            if stopped:
                break
        else:
            state.update(epoch=state["epoch"] + 1, batch=0)
    bar.close()
    save_checkpoint(ckpt_dir, head, opt, state)
    report = {"heldout": evaluate(head, lm_weight, held, cfg), "heldout_sequences": len(held),
              "steps": state["step"], "total_steps": total, "train_tokens": state["train_tokens"],
              "tokens_seen": state["tokens_seen"], "seconds": round(state["seconds"], 1), "config": asdict(cfg)}
    return report


def evaluate_checkpoint(target, data_dir: str | Path, ckpt_dir: str | Path, cfg: TrainConfig) -> dict:
    """Held-out agreement of the newest checkpoint's head, plus its training state."""
    head, state = load_latest_head(target, ckpt_dir)
    _, held = load_split(data_dir, cfg.heldout_every)  # full stored context, as at inference
    lm_weight = target.get_output_embeddings().weight.detach().float()
    return {"heldout": evaluate(head, lm_weight, held, cfg), "heldout_sequences": len(held),
            "steps": state["step"], "train_tokens": state["train_tokens"], "tokens_seen": state["tokens_seen"],
            "seconds": round(state["seconds"], 1), "config": state["config"]}
