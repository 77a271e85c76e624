"""Training an EAGLE-3 head: the target's own answers, multi-layer features, training-time test.

Data are token sequences only (prompt context + the target's greedy answer); the target's fused features
(its hidden states entering three layers) and its next-token distributions are recomputed for each batch,
which costs one teacher-forced target forward: cheap next to storing 3 x H floats per token.

Training-time test (EAGLE-3): the head is unrolled for `steps` steps on its own outputs, as drafting runs it.
Step 0 at position t reads (x_{t+1}, fc(F_t)); step k reads (x_{t+k+1}, its own step k-1 output at t) at
position t+k. Every step attends to the real pairs at positions <= t (step 0's keys) and to its own earlier
steps at t, which is what a depth-k draft node sees. Step k's loss is the cross-entropy of the head's draft
distribution against the target's distribution after x_{t+k+1} (over the draft vocabulary), weighted 0.8^k.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..heads import eagle3 as head3
from ..heads.eagle import _to_llama_config, head_config_for
from .batches import by_length

ANSWERS = "answers.safetensors"


@dataclass(frozen=True)
class Fit3Config:
    """Hyper-parameters of one EAGLE-3 training run."""

    steps: int = 7                 # unrolled draft steps (training-time test)
    step_decay: float = 0.8        # step k's loss weight: step_decay ** k
    lr: float = 5e-4
    warmup: float = 0.03
    epochs: float = 2.0
    batch_tokens: int = 8192       # padded tokens per optimiser step
    grad_clip: float = 0.5
    temperature: float = 1.0       # soft labels: softmax(target logits / temperature) over the draft vocabulary
    heldout_every: int = 50        # every n-th sequence is held out
    seed: int = 0


# ---- the head --------------------------------------------------------------------------------------------
def new_head(target, vocab_ids: torch.Tensor, seed: int = 0) -> head3.Eagle3Head:
    """A float32 EAGLE-3 head for `target` in training mode. Its lm_head starts from the target's rows of the
    draft vocabulary and its final norm from the target's: the draft scores tokens as the target does at first."""
    torch.manual_seed(seed)
    tc = target.config
    cfg = head_config_for(tc)
    ids = vocab_ids.sort().values.cpu()
    head = head3.Eagle3Head(_to_llama_config(cfg), tc.hidden_size, len(ids), head3.default_layers(tc.num_hidden_layers))
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight.detach().float().cpu()[ids])
        norm = getattr(getattr(target, target.base_model_prefix), "norm", None)
        if norm is not None:
            head.norm.weight.copy_(norm.weight.detach().float().cpu())
        head.d2t.copy_(ids - torch.arange(len(ids)))
    head.embed_tokens = nn.Embedding.from_pretrained(target.get_input_embeddings().weight.detach().float().cpu(),
                                                     freeze=True)
    head.set_vocab_order(None)
    return head.float().train()


def trainable(head: head3.Eagle3Head) -> dict[str, torch.Tensor]:
    return {k: v for k, v in head.state_dict().items() if not k.startswith(("embed_tokens", "rotary"))}


# ---- data -------------------------------------------------------------------------------------------------
@dataclass
class Answers:
    """Token sequences (prompt context + answer) and where each answer starts."""

    tokens: list[torch.Tensor]
    starts: list[int]

    def save(self, path: str | Path) -> None:
        flat = torch.cat(self.tokens).to(torch.int32) if self.tokens else torch.zeros(0, dtype=torch.int32)
        offsets = torch.tensor([0] + [len(t) for t in self.tokens]).cumsum(0)
        save_file({"tokens": flat, "offsets": offsets, "starts": torch.tensor(self.starts, dtype=torch.int64)},
                  str(path))

    @classmethod
    def load(cls, path: str | Path) -> "Answers":
        d = load_file(str(path))
        o = d["offsets"].tolist()
        return cls([d["tokens"][a:b].long() for a, b in zip(o, o[1:])], d["starts"].tolist())


def vocabulary(data: Answers, size: int, always: set[int] = frozenset()) -> torch.Tensor:
    """The `size` tokens the target writes most often in its answers (plus `always`), most frequent first."""
    body = torch.cat([t[s:] for t, s in zip(data.tokens, data.starts)])
    ids, counts = torch.unique(body, return_counts=True)
    order = ids[counts.argsort(descending=True, stable=True)].tolist()
    top = set(order[:size])
    extra = [t for t in sorted(always) if t not in top]
    keep = order[:size - len(extra)] + extra
    taken = set(keep)
    rest = [t for t in range(size + len(taken)) if t not in taken]  # pad with low ids if the data are short
    return torch.tensor((keep + rest)[:size])


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded on the left to one width, for transformers' generate -> ids, attention mask (B, W)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):
        ids[j, width - len(r):], mask[j, width - len(r):] = torch.tensor(r), 1
    return ids, mask


@torch.inference_mode()
def write_answers(target, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                  deadline: float = math.inf, context: int = 64, log=print, done: Answers | None = None,
                  save=None, save_every_s: float = 300.0) -> Answers:
    """The target's greedy answers (transformers' generate, left padding), longest prompts first; stops at the
    deadline with what is done. Each sequence keeps the prompt's last `context` tokens. `done`: answers of an
    earlier, interrupted call (the first prompts of the same order), continued; `save(answers)` is called every
    `save_every_s` seconds so that an interruption loses little."""
    dev = target.device
    eos = target.generation_config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out = Answers(list(done.tokens), list(done.starts)) if done else Answers([], [])
    t0 = last_save = time.time()
    for b in range(len(out.tokens), len(order), batch_size):
        if time.time() > deadline:
            log(f"answers: deadline reached after {len(out.tokens)} of {len(prompts)} prompts")
            break
        rows = [prompts[i] for i in order[b:b + batch_size]]
        ids, mask = left_padded(rows, pad)
        gen = target.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=pad)[:, ids.shape[1]:].cpu()
        stops = set(eos if isinstance(eos, list) else [eos])
        for p, g in zip(rows, gen.tolist()):
            end = next((j + 1 for j, t in enumerate(g) if t in stops), len(g))
            c = min(len(p), context)
            out.tokens.append(torch.tensor(p[-c:] + g[:end]))
            out.starts.append(c)
        log(f"answers: {len(out.tokens)}/{len(prompts)} in {time.time() - t0:.0f} s")
        if save is not None and time.time() - last_save > save_every_s:
            save(out)
            last_save = time.time()
    return out


# ---- training-time test -------------------------------------------------------------------------------------
def unrolled(head: head3.Eagle3Head, feats: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor,
             steps: int) -> list[torch.Tensor]:
    """The head's output (B, T, H) at every step k < steps, for every base position t (step k's input token
    is x_{t+k+1}; positions past the end read token 0 and are never scored)."""
    b, t = tokens.shape
    dev = tokens.device
    keep0 = torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :]
    keep0 |= torch.eye(t, dtype=torch.bool, device=dev)[None]  # padded queries see themselves: no empty rows
    eye = torch.eye(t, dtype=torch.bool, device=dev)[None].expand(b, t, t)
    past: list = []
    outs, hidden = [], feats
    pos = torch.arange(t, device=dev)[None].expand(b, t)
    for k in range(steps):
        ids = torch.zeros_like(tokens)
        ids[:, : max(t - k - 1, 0)] = tokens[:, k + 1:]
        keep = torch.cat([keep0] + [eye] * k, dim=-1)  # step 0's keys causally, then each earlier step's own
        mask = torch.zeros(keep.shape, device=dev).masked_fill(~keep, torch.finfo(torch.float32).min)[:, None]
        hidden = head(ids, hidden, mask, pos + k, past=past)
        outs.append(hidden)
    return outs


def target_pass(target, tokens: torch.Tensor, valid: torch.Tensor, head: head3.Eagle3Head, rows: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One teacher-forced target forward -> fused features (B, T, 3H), its logits over the draft vocabulary
    (B, T, V') and its greedy token (B, T)."""
    with torch.no_grad():
        out = target(input_ids=tokens, attention_mask=valid.long(), output_hidden_states=True)
        feats = head.target_features(out).float()
        logits = out.logits
        return feats, logits.float().index_select(-1, rows), logits.argmax(-1)


def step_losses(head, outs, z, greedy, tokens, valid, starts, cfg: Fit3Config, ids: torch.Tensor
                ) -> tuple[torch.Tensor, list[float], list[int]]:
    """Weighted soft cross-entropy over the unrolled steps; per step (top-1 hits, scored positions)."""
    b, t = tokens.shape
    dev = tokens.device
    lengths = valid.sum(1)
    j = torch.arange(t, device=dev)[None]
    loss, hits, counts = torch.zeros((), device=dev), [], []
    for k, out in enumerate(outs):
        # the target's distribution after x_{t+k+1}: row t+k+1 of z; scored where that row lies in the answer
        # (from the answer's first prediction on) and is not the last stored token
        lab = j + k + 1
        m = (lab >= (starts[:, None] - 1)) & (lab <= (lengths[:, None] - 2))
        if not m.any():
            hits.append(0.0)
            counts.append(0)
            continue
        src = lab.clamp(max=t - 1).expand(b, t)
        zk = z.gather(1, src[..., None].expand(b, t, z.shape[-1]))[m]  # (N, V')
        logp = torch.log_softmax(head.logits(out[m]).float(), dim=-1)  # (N, V')
        q = torch.softmax(zk / cfg.temperature, dim=-1)
        loss = loss + cfg.step_decay ** k * -(q * logp).sum(-1).mean()
        want = greedy.gather(1, src)[m]
        hits.append(float((ids[logp.argmax(-1)] == want).sum()))
        counts.append(int(m.sum()))
    return loss, hits, counts


def batches(data: Answers, idx: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """The sequences `idx` in batches of similar length (little padding), in shuffled order."""
    return [[idx[j] for j in b] for b in by_length([len(data.tokens[i]) for i in idx], batch_tokens, rng)]


def collate(data: Answers, idx: list[int], dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(data.tokens[i]) for i in idx)
    tokens = torch.zeros(len(idx), width, dtype=torch.long)
    valid = torch.zeros(len(idx), width, dtype=torch.bool)
    for r, i in enumerate(idx):
        n = len(data.tokens[i])
        tokens[r, :n], valid[r, :n] = data.tokens[i], True
    return tokens.to(dev), valid.to(dev), torch.tensor([data.starts[i] for i in idx], device=dev)


def split(n: int, every: int) -> tuple[list[int], list[int]]:
    held = set(range(0, n, every)) if every > 0 else set()
    return [i for i in range(n) if i not in held], sorted(held)


@torch.no_grad()
def evaluate(target, head, data: Answers, idx: list[int], cfg: Fit3Config, autocast: bool = False) -> dict:
    """Held-out top-1 agreement with the target's greedy token at each unrolled step (the draft's own chain)."""
    was = head.training
    head.eval()
    dev = head.fc.weight.device
    ids = head.token_ids()
    hits, counts = [0.0] * cfg.steps, [0] * cfg.steps
    for b in batches(data, idx, cfg.batch_tokens, random.Random(0)):
        tokens, valid, starts = collate(data, b, dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            feats, z, greedy = target_pass(target, tokens, valid, head, ids)
            outs = unrolled(head, feats, tokens, valid, cfg.steps)
            _, h, c = step_losses(head, outs, z, greedy, tokens, valid, starts, cfg, ids)
        hits = [a + x for a, x in zip(hits, h)]
        counts = [a + x for a, x in zip(counts, c)]
    head.train(was)
    return {f"step{k}_top1": round(h / max(c, 1), 4) for k, (h, c) in enumerate(zip(hits, counts))} | {
        "positions": counts[0]}


def lr_at(step: int, total: int, cfg: Fit3Config) -> float:
    warm = max(1, int(cfg.warmup * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


def fit(target, data: Answers, vocab_order: torch.Tensor, ckpt_dir: str | Path, cfg: Fit3Config,
        deadline: float = math.inf, autocast: bool = False, log=print,
        extra: Answers | None = None) -> tuple[head3.Eagle3Head, dict]:
    """Train (resuming from ckpt_dir/eagle3.pt) until the schedule ends or the deadline; returns head, report.
    `extra`: more sequences to train on, none held out (reference answers read teacher-forced)."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    dev, n_own = target.device, len(data.tokens)
    head = new_head(target, vocab_order, cfg.seed)
    head.set_vocab_order(vocab_order)
    head = head.to(dev)
    params = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    train_idx, held = split(len(data.tokens), cfg.heldout_every)
    if extra is not None and extra.tokens:
        n = len(data.tokens)
        data = Answers(data.tokens + extra.tokens, data.starts + extra.starts)
        train_idx += list(range(n, len(data.tokens)))
    per_epoch = len(batches(data, train_idx, cfg.batch_tokens, random.Random(cfg.seed)))
    state = {"step": 0, "epoch": 0, "batch": 0, "seconds": 0.0, "total": max(1, math.ceil(cfg.epochs * per_epoch)),
             "config": asdict(cfg), "sequences": len(train_idx), "heldout_sequences": len(held)}
    path = ckpt_dir / "eagle3.pt"
    if path.exists():
        ck = torch.load(path, map_location="cpu", weights_only=True)
        head.load_state_dict(ck["head"], strict=False)
        opt.load_state_dict(ck["opt"])
        state.update(ck["state"])
    ids = head.token_ids()
    t_start, base = time.time(), state["seconds"]

    def save() -> None:
        state["seconds"] = base + time.time() - t_start
        tmp = path.with_suffix(".tmp")
        torch.save({"head": trainable(head), "opt": opt.state_dict(), "state": state}, tmp)
        tmp.replace(path)

    last_log = last_save = time.time()
    while state["step"] < state["total"] and time.time() < deadline:
        order = batches(data, train_idx, cfg.batch_tokens, random.Random(cfg.seed + state["epoch"]))
        for bi in range(state["batch"], len(order)):
            if state["step"] >= state["total"] or time.time() >= deadline:
                break
            tokens, valid, starts = collate(data, order[bi], dev)
            for g in opt.param_groups:
                g["lr"] = lr_at(state["step"], state["total"], cfg)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                feats, z, greedy = target_pass(target, tokens, valid, head, ids)
                outs = unrolled(head, feats, tokens, valid, cfg.steps)
                loss, hits, counts = step_losses(head, outs, z, greedy, tokens, valid, starts, cfg, ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            state.update(step=state["step"] + 1, batch=bi + 1)
            if time.time() - last_log > 20:
                last_log = time.time()
                acc = " ".join(f"{h / max(c, 1):.2f}" for h, c in zip(hits, counts))
                log(f"step {state['step']}/{state['total']} loss {loss.item():.3f} top1 by step {acc}")
            if time.time() - last_save > 600:  # a checkpoint every ten minutes: an interrupted run loses little
                save()
                last_save = time.time()
        else:
            state.update(epoch=state["epoch"] + 1, batch=0)
    save()
    report = {"heldout": evaluate(target, head, data, held, cfg, autocast), "steps": state["step"],
              "total_steps": state["total"], "seconds": round(state["seconds"], 1), "config": asdict(cfg),
              "sequences": state["sequences"], "heldout_sequences": len(held),
              "answer_tokens": int(sum(len(t) - s for t, s in zip(data.tokens[:n_own], data.starts[:n_own]))),
              "reference_tokens": int(sum(len(t) - s for t, s in zip(data.tokens[n_own:], data.starts[n_own:])))}
    return head, report
