"""Checkpoints of head training: plain tensors and numbers, written atomically, read with weights_only=True."""
from __future__ import annotations

from pathlib import Path

import torch

from ..heads.eagle import DraftHead, load_head, new_head


def trainable(head: DraftHead) -> dict[str, torch.Tensor]:
    """The head's own weights (no shared embedding, no rotary buffers)."""
    return {k: v for k, v in head.state_dict().items() if not k.startswith(("embed_tokens", "rotary"))}


def trainable_head(target, seed: int = 0) -> tuple[DraftHead, list[torch.nn.Parameter]]:
    """A fresh float32 head in training mode and its own parameters (the shared embedding stays frozen)."""
    head = new_head(target, seed=seed)
    emb, head.embed_tokens = head.embed_tokens, None  # keep .float() off the target's own embedding
    head = head.float().train()
    head.embed_tokens = torch.nn.Embedding.from_pretrained(emb.weight.detach().float(), freeze=True)
    params = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    for p in params:
        p.requires_grad_(True)
    return head, params


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in a directory, or None."""
    found = sorted(Path(ckpt_dir).glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    return found[-1] if found else None


def save_checkpoint(ckpt_dir: Path, head: DraftHead, opt: torch.optim.Optimizer, state: dict, keep: int = 2) -> Path:
    """Write step_N.pt (plain tensors and numbers) and drop all but the newest `keep`."""
    path = ckpt_dir / f"step_{state['step']:07d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"head": trainable(head), "opt": opt.state_dict(), "state": state}, tmp)
    tmp.replace(path)
    for old in sorted(ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))[:-keep]:
        old.unlink()
    return path


def is_head_dir(path: str | Path) -> bool:
    """An exported head (official layout: config.json beside the weights), not a checkpoint directory."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").exists() and latest_checkpoint(path) is None


def initial_weights(target, init: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Weights to warm-start from, and what the model card says of them: a checkpoint file (step_N.pt), or an
    exported head directory such as the shipped one (its fp16 weights widened to float32), checked against
    the target as at inference."""
    if is_head_dir(init):
        head = load_head(init, target)
        return {k: v.float() for k, v in trainable(head).items()}, {"head": Path(init).name}
    ck = torch.load(init, map_location="cpu", weights_only=True)
    return ck["head"], {k: ck["state"].get(k) for k in ("step", "seconds", "tokens_seen")}


def load_latest_head(target, ckpt_dir: str | Path) -> tuple[DraftHead, dict]:
    """The head of the newest checkpoint (float32, on the target's device) and its training state; for an
    exported head directory, that head and an empty state (so `evaluate` can score a shipped head)."""
    if is_head_dir(ckpt_dir):
        weights, info = initial_weights(target, ckpt_dir)
        state = {"step": 0, "train_tokens": 0, "tokens_seen": 0, "seconds": 0.0, "config": {}, "init": info}
    else:
        path = latest_checkpoint(ckpt_dir)
        if path is None:
            raise FileNotFoundError(f"no step_*.pt checkpoint in {ckpt_dir}")
        ck = torch.load(path, map_location="cpu", weights_only=True)
        weights, state = ck["head"], ck["state"]
    head, _ = trainable_head(target)
    head.load_state_dict(weights, strict=False)
    return head.requires_grad_(False).eval(), state
