"""Self-distillation data: prompts -> the target's own responses -> its post-norm features, in shards on disk.

Each shard is a safetensors file of flat tensors: `tokens` (N,) int32; `features` (N, H) float16, the target's
last hidden state after the final norm (the target read the whole prompt; only its last `context` tokens are
kept); `argmax` (N,) int32, the target's greedy next token after each position; `offsets` (S+1,) int64, where
each sequence begins; `starts` (S,) int64, the index of its first response token; `kind` (S,) int8: 0 greedy
response, 1 sampled response, 2 the prompt file's reference answer read by the target (teacher-forced: cheap,
but not the target's own words). manifest.json lists finished shards; a rerun skips them (resumable).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import DynamicCache

from ..decode.engine import encode_prompt


@dataclass(frozen=True)
class GenConfig:
    """Settings for one data-generation run."""

    max_new_tokens: int = 128
    batch_size: int = 128
    shard_prompts: int = 128         # prompts per shard (the resume granularity)
    sample_every: int = 0            # every n-th prompt is sampled instead of greedy (0: greedy only)
    temperature: float = 0.7
    context: int = 64                # prompt tokens stored before the response
    max_prompt_tokens: int = 384     # longer prompts are skipped
    teacher: bool = False            # read the file's reference answers instead of generating
    seed: int = 0


GREEDY, SAMPLED, TEACHER = 0, 1, 2


@dataclass
class Sequence:
    """One stored sequence: prompt context + response tokens and the target's features at each."""

    tokens: torch.Tensor     # (T,) int
    features: torch.Tensor   # (T, H)
    start: int               # index of the first response token
    kind: int = GREEDY
    argmax: torch.Tensor | None = None  # (T,) the target's greedy next token after each position (-1: unknown)

    def next_argmax(self) -> torch.Tensor:
        """The target's greedy token after each position; for greedy responses the next token itself."""
        if self.argmax is not None:
            return self.argmax.long()
        out = torch.full((len(self.tokens),), -1, dtype=torch.long)
        if self.kind == GREEDY:
            out[max(self.start - 1, 0):-1] = self.tokens[max(self.start, 1):]
        return out


def eos_ids(target) -> set[int]:
    """The target's end-of-sequence ids as a set."""
    eos = target.generation_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}


@torch.inference_mode()
def generate_responses(target, tokenizer, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                       seed: int = 0, context: int = 64) -> list[Sequence]:
    """Batched decoding (left padding) that keeps the target's features as it goes: no second pass.

    Finished rows leave the batch and the cache at once, so the cost follows the live rows. A sequence holds
    the prompt's last `context` tokens and the response without its final token (EOS or the cap), which is
    never fed back; that token still appears as the target's choice (`argmax`) at the last position.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids(target))
    stop, dev = eos_ids(target), target.device
    body, lm_head = getattr(target, target.base_model_prefix), target.get_output_embeddings()
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, W) positions that skip the padding
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = DynamicCache(config=target.config)
    h = body(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True).last_hidden_state
    ctx = [min(len(p), context) for p in prompts]
    feats = [[h[i, width - c:].float().cpu()] for i, c in enumerate(ctx)]  # (c, H) each, then (1, H) per step
    logits = lm_head(h[:, -1])  # (B, V)
    alive, nxt = torch.arange(len(prompts)), pos[:, -1] + 1
    resp: list[list[int]] = [[] for _ in prompts]
    top1: list[list[int]] = [[-1] * (c - 1) for c in ctx]
    for step in range(max_new_tokens):
        best = logits.argmax(-1)
        tok = best if temperature <= 0 else torch.multinomial(
            torch.softmax(logits.float() / temperature, -1), 1, generator=gen)[:, 0]
        done = []
        for row, t, b in zip(alive.tolist(), tok.tolist(), best.tolist()):
            resp[row].append(t)
            top1[row].append(b)
            done.append(t in stop or step == max_new_tokens - 1)
        if all(done):
            break
        keep = torch.tensor([not d for d in done])
        if not keep.all():  # drop finished rows: decoding cost follows the live rows only
            idx = keep.nonzero()[:, 0].to(dev)
            for layer in cache.layers:
                layer.batch_select_indices(idx)
            alive, tok, mask, nxt = alive[keep], tok[idx], mask[idx], nxt[idx]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        h = body(input_ids=tok[:, None], attention_mask=mask, position_ids=nxt[:, None], cache=cache,
                 use_cache=True).last_hidden_state  # (b, 1, H)
        for j, row in enumerate(alive.tolist()):
            feats[row].append(h[j].float().cpu())
        logits, nxt = lm_head(h[:, 0]), nxt + 1
    kind = SAMPLED if temperature > 0 else GREEDY
    return [Sequence(tokens=torch.tensor(p[-c:] + r[:-1]), features=torch.cat(f), start=c, kind=kind,
                     argmax=torch.tensor(a)) for p, c, r, f, a in zip(prompts, ctx, resp, feats, top1)]


@torch.inference_mode()
def target_features(target, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Teacher-forced forward (right padding) -> post-norm last hidden states (T_i, H) per sequence."""
    return [f for f, _ in target_features_argmax(target, seqs, with_argmax=False)]


@torch.inference_mode()
def target_features_argmax(target, seqs: list[list[int]], with_argmax: bool = True
                           ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Post-norm features (T_i, H) and the target's greedy next token (T_i,) at each position."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    body = getattr(target, target.base_model_prefix)
    h = body(input_ids=ids.to(target.device), attention_mask=mask.to(target.device)).last_hidden_state  # (B, T, H)
    lm_head = target.get_output_embeddings()
    return [(h[i, : len(s)].float().cpu(), lm_head(h[i, : len(s)]).argmax(-1).cpu() if with_argmax else None)
            for i, s in enumerate(seqs)]  # logits one sequence at a time: (B, T, V) would not fit


def write_shard(path: str | Path, seqs: list[Sequence]) -> None:
    """Write sequences as one safetensors shard (atomically, via a temporary name)."""
    path = Path(path)
    lengths = torch.tensor([len(s.tokens) for s in seqs], dtype=torch.long)
    tensors = {
        "tokens": torch.cat([s.tokens.to(torch.int32) for s in seqs]),
        "features": torch.cat([s.features.to(torch.float16) for s in seqs]).contiguous(),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "starts": torch.tensor([s.start for s in seqs], dtype=torch.long),
        "kind": torch.tensor([s.kind for s in seqs], dtype=torch.int8),
        "argmax": torch.cat([s.next_argmax().to(torch.int32) for s in seqs]),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


def read_shard(path: str | Path) -> list[Sequence]:
    """The sequences of one shard (features as stored, float16)."""
    t = load_file(str(path))
    off = t["offsets"].tolist()
    kinds = t["kind"].tolist() if "kind" in t else t["sampled"].tolist()  # early shards: greedy/sampled only
    return [Sequence(tokens=t["tokens"][a:b].long(), features=t["features"][a:b], start=int(t["starts"][i]),
                     kind=int(kinds[i]), argmax=t["argmax"][a:b] if "argmax" in t else None)
            for i, (a, b) in enumerate(zip(off[:-1], off[1:]))]


def read_manifest(out_dir: str | Path) -> dict:
    """The manifest of a data directory (empty when none was written yet)."""
    p = Path(out_dir) / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else {"shards": {}}


def load_sequences(data_dir: str | Path) -> list[Sequence]:
    """Every sequence of every shard listed in the manifest, in shard order."""
    shards = read_manifest(data_dir)["shards"]
    return [s for name in sorted(shards) for s in read_shard(Path(data_dir) / name)]


def _teacher_sequences(target, tokenizer, prompts: list[list[int]], refs: list[str | None], batch: list[int],
                       cfg: GenConfig) -> list[Sequence]:
    """The prompt file's reference answers (ending in EOS), read by the target in one teacher-forced pass."""
    eos = min(eos_ids(target))
    resp = [tokenizer(refs[i] or "", add_special_tokens=False)["input_ids"][: cfg.max_new_tokens - 1] + [eos]
            for i in batch]
    full = [prompts[i] + r for i, r in zip(batch, resp)]  # the target reads the whole prompt
    seqs = []
    for i, s, (f, top) in zip(batch, full, target_features_argmax(target, full)):
        cut = max(0, len(prompts[i]) - cfg.context)  # store only the prompt's last `context` tokens
        seqs.append(Sequence(tokens=torch.tensor(s[cut:]), features=f[cut:], start=len(prompts[i]) - cut,
                             kind=TEACHER, argmax=top[cut:]))
    return seqs


def _make_shard(target, tokenizer, prompts: list[list[int]], refs: list[str | None], indices: list[int],
                cfg: GenConfig, bar: tqdm) -> tuple[list[Sequence], list[int]]:
    """Sequences for one shard's prompts, similar prompt lengths batched together, and the index (into
    `prompts`) of each sequence's prompt: the stored order is not the file's order."""
    every = cfg.sample_every if not cfg.teacher else 0
    greedy = [i for i in indices if not (every and i % every == every - 1)]
    sampled = [i for i in indices if i not in set(greedy)]
    seqs: list[Sequence] = []
    order: list[int] = []
    for group, temp in ((greedy, 0.0), (sampled, cfg.temperature)):
        group = sorted(group, key=lambda i: len(prompts[i]))
        order += group
        for b in range(0, len(group), cfg.batch_size):
            batch = group[b: b + cfg.batch_size]
            if cfg.teacher:
                new = _teacher_sequences(target, tokenizer, prompts, refs, batch, cfg)
            else:
                new = generate_responses(target, tokenizer, [prompts[i] for i in batch], cfg.max_new_tokens, temp,
                                         cfg.seed + batch[0], cfg.context)
            seqs += new
            bar.update(sum(len(s.tokens) - s.start for s in new))
    return seqs, order


def generate_dataset(target, tokenizer, rows: list[tuple[str, str | None]], out_dir: str | Path,
                     cfg: GenConfig, source: dict | None = None, row_ids: list[int] | None = None) -> dict:
    """Write shards for all (prompt, reference) rows, skipping shards already on disk; returns the manifest.

    Each shard's entry lists `rows` (the prompt file's row number behind each stored sequence, in stored
    order; `row_ids[i]` for `rows[i]`, default i) and `kinds`, so the prompts behind any sequence, the
    held-out ones included, can be found again and regenerated. `source` (the prompt file) is recorded too."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out)
    manifest["config"] = asdict(cfg)
    if source is not None:
        manifest["source"] = source
    row_ids = list(range(len(rows))) if row_ids is None else row_ids
    prompts = [encode_prompt(tokenizer, p) for p, _ in rows]
    refs = [r for _, r in rows]
    keep = [i for i, p in enumerate(prompts) if len(p) <= cfg.max_prompt_tokens and (refs[i] or not cfg.teacher)]
    n_shards = (len(keep) + cfg.shard_prompts - 1) // cfg.shard_prompts
    todo = [k for k in range(n_shards) if f"shard_{k:05d}.safetensors" not in manifest["shards"]]
    bar = tqdm(total=len(todo) * cfg.shard_prompts * cfg.max_new_tokens, unit="tok",
               desc="teacher-forced" if cfg.teacher else "self-distill", smoothing=0.05)
    for k in todo:
        name = f"shard_{k:05d}.safetensors"
        t0 = time.perf_counter()
        seqs, order = _make_shard(target, tokenizer, prompts, refs,
                                  keep[k * cfg.shard_prompts:(k + 1) * cfg.shard_prompts], cfg, bar)
        write_shard(out / name, seqs)
        manifest["shards"][name] = {
            "sequences": len(seqs),
            "tokens": sum(len(s.tokens) for s in seqs),
            "response_tokens": sum(len(s.tokens) - s.start for s in seqs),
            "seconds": round(time.perf_counter() - t0, 1),
            "rows": [row_ids[i] for i in order],
            "kinds": [s.kind for s in seqs],
        }
        (out / "manifest.json.tmp").write_text(json.dumps(manifest, indent=1))
        (out / "manifest.json.tmp").replace(out / "manifest.json")
        bar.set_postfix(shard=k, resp_tokens=sum(v["response_tokens"] for v in manifest["shards"].values()))
    bar.close()
    return manifest


def measure_throughput(target, tokenizer, prompt_texts: list[str], batch_sizes: list[int],
                       max_new_tokens: int = 32) -> dict[int, float]:
    """Response tokens per second of generate + feature pass at each batch size (a quick probe)."""
    prompts = [encode_prompt(tokenizer, t) for t in prompt_texts]
    rates = {}
    for bs in batch_sizes:
        batch = sorted(prompts[:bs], key=len)
        t0 = time.perf_counter()
        seqs = generate_responses(target, tokenizer, batch, max_new_tokens)
        rates[bs] = sum(len(q.tokens) - q.start + 1 for q in seqs) / (time.perf_counter() - t0)
    return rates
