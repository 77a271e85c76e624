"""High-level calls shared by the command line, the benchmark and the app: run one method on one prompt."""
from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .config import DecodeConfig
from .decode.engine import Decoder, encode_prompt
from .loading import Bundle
from .decode.records import StepRecord, step_phases, summarise


@dataclass(frozen=True)
class RunResult:
    method: str
    text: str
    token_ids: list[int]
    records: list[StepRecord]
    wall_s: float

    def to_json(self) -> dict:
        s = summarise(self.method, self.records, self.wall_s)
        return {"method": self.method, "text": self.text, "token_ids": self.token_ids,
                "new_tokens": s.new_tokens, "target_forwards": s.target_forwards,
                "mean_accept_length": s.mean_accept_length, "wall_s": s.wall_s,
                "tokens_per_s": s.tokens_per_s, "steps": len(self.records) - 1,
                "time": {k: round(v, 4) for k, v in step_phases(self.records, self.wall_s).items()}}


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bundle -> its decoder, freed with it


def decoder_for(bundle: Bundle) -> Decoder:
    """The bundle's decoder, built on first use and kept: building it gathers (and, with oneDNN kernels, packs)
    the draft's lm_head rows, which need not be redone for every run. A decoder holds no per-run state."""
    if bundle not in _DECODERS:
        _DECODERS[bundle] = Decoder(bundle.target, bundle.head, bundle.tokenizer,
                                    draft_linear=getattr(bundle, "draft_linear", None),
                                    greedy=getattr(bundle, "greedy", None), stack=getattr(bundle, "stack", None),
                                    draft_level=getattr(bundle, "draft_level", None))
    return _DECODERS[bundle]


def stream(bundle: Bundle, prompt_ids: list[int], cfg: DecodeConfig,
           should_stop: Callable[[], bool] | None = None) -> Iterator[StepRecord]:
    """Yield step records for one run."""
    yield from decoder_for(bundle).run(prompt_ids, cfg, should_stop)


def run(bundle: Bundle, prompt: str | list[int], cfg: DecodeConfig, raw: bool = False) -> RunResult:
    """Decode a prompt to the end and time it (wall time includes the prefill)."""
    ids = prompt if isinstance(prompt, list) else encode_prompt(bundle.tokenizer, prompt, raw)
    t0 = time.perf_counter()
    records = list(stream(bundle, ids, cfg))
    wall = time.perf_counter() - t0
    tokens = [t for r in records for t in r.new_tokens]
    text = bundle.tokenizer.decode(tokens, skip_special_tokens=True)
    return RunResult(method=cfg.name, text=text, token_ids=tokens, records=records, wall_s=wall)
