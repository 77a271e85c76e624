"""Choose EAGLE-2's tree size and depth for the machine at hand.

The authors choose `total_token` by timing target forwards on their GPU and dividing by fixed gains. Here
both sides are measured: a warm-up decode with a large tree records every drafted node and the target's own
choice after each verified one, so the accept length any smaller tree (top-n nodes of depth <= d by score,
exactly what EAGLE-2 would keep) would have had on the same steps can be replayed from the records; the cost
of verifying n nodes is timed with the engine's own verify, and the rest of a step (drafting, commit, the
record) by short timed runs at each depth. Of the options predicted near the fastest it keeps the fewest
nodes (`choose`), since near the top the predictions differ by less than their error.
On a GPU verifying 60 nodes costs about one forward and big trees win; on a CPU each node costs ~2 ms here,
so the best tree is small. Greedy only: sampling accepts at other rates.
"""
from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace

import torch

from .cache import new_cache
from .config import DecodeConfig
from .engine import Decoder, truncate
from .records import StepRecord
from .replay import accept_with_floors, replay_runs
from .rerank import floors

SIZES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 26, 32, 40, 48, 60)
DEPTHS = (1, 2, 3, 4, 5, 6, 7)
# Trees sized per step by confidence (DecodeConfig.min_prob / expand_prob), replayed at these caps and floors.
FLOOR_CAPS = (8, 12, 16, 26)
FLOOR_DEPTHS = (4, 6, 7)
MIN_PROBS = (0.02, 0.03, 0.05, 0.08, 0.12, 0.16, 0.2, 0.25, 0.3)
EXPAND_TIMES = (2, 3, 4)  # the expand floor as a multiple of the keep floor
WARMUP_TOKENS = 32  # new tokens per warm-up prompt
# A narrower draft vocabulary the tuner also tries (DecodeConfig.draft_tokens) where the head's is larger: each
# draft level then reads a third of the lm_head rows, at the cost of the rarer tokens the draft can propose.
NARROW_DRAFT = 8192
MARGIN = 0.03  # prefer the fewest nodes predicted within this share of the fastest (see `choose`)
VERIFY_CONTEXT = 192  # tokens in the cache while verify is timed: a prompt plus half of a 128-token answer


@dataclass(frozen=True)
class Option:
    """One tree setting with its replayed accept length and measured cost per step. With floors (`min_prob` > 0)
    `total_tokens` and `depth` are caps and `nodes` the mean verified rows a step."""

    total_tokens: int
    depth: int
    tau: float
    step_ms: float
    min_prob: float = 0.0
    expand_prob: float = 0.0
    nodes: float = 0.0
    draft_tokens: int = 0  # the draft vocabulary it was measured with (DecodeConfig.draft_tokens; 0: all)

    def __post_init__(self) -> None:
        if not self.nodes:
            object.__setattr__(self, "nodes", float(self.total_tokens))

    @property
    def tokens_per_s(self) -> float:
        return 1e3 * self.tau / self.step_ms

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


@torch.inference_mode()
def time_verify(dec: Decoder, prompt_ids: list[int], sizes: tuple[int, ...], reps: int = 5,
                context: int = VERIFY_CONTEXT) -> dict[int, float]:
    """Median ms of the engine's greedy verify (tree mask, forward over the cache, argmax) for `n` nodes, over a
    cache of `context` tokens (the prompt repeated: attention's cost grows with the cache, so timing over a
    short prompt alone would flatter big trees). The sizes take turns within each round, so a slow spell of
    the machine costs every size alike instead of shifting the choice; the first round only warms up."""
    ids = (prompt_ids * (context // len(prompt_ids) + 1))[:max(context, 1)]
    cache = new_cache(dec.target.config)  # the engine's own cache
    dec.body(input_ids=torch.tensor([ids], device=dec.device), cache=cache, use_cache=True)
    past, st = len(ids), SimpleNamespace(target_cache=cache)
    runs: dict[int, list[float]] = {n: [] for n in sizes}
    for rnd in range(reps + 1):
        for n in sizes:
            parents = [-1] + [(i - 1) // 3 for i in range(1, n)]  # a bushy tree; the cost depends on n only
            t0 = dec._sync()
            dec.greedy_tokens(dec.verify(st, parents, ids[-1:] * n))
            if rnd:
                runs[n].append((dec._sync() - t0) * 1e3)
            truncate(cache, past)
    return {n: statistics.median(v) for n, v in runs.items()}


def _timed_steps(dec: Decoder, ids: list[int], cfg: DecodeConfig) -> list[tuple[StepRecord, float]]:
    """Each drafted step's record with its whole wall time in ms (drafting, verify, commit, the record)."""
    out, t0 = [], time.perf_counter()
    for r in dec.run(ids, cfg):
        t1 = time.perf_counter()
        if r.nodes:
            out.append((r, (t1 - t0) * 1e3))
        t0 = t1
    return out


def tune(dec: Decoder, prompts: list[list[int]], base: DecodeConfig, sizes=None, depths=None,
         max_new_tokens: int | None = None, progress=None, sized: bool = True,
         draft_tokens: tuple[int, ...] | None = None) -> tuple[Option, list[Option]]:
    """Warm up on `prompts` with the largest tree, time each depth's drafting and each size's verify, and
    return the chosen option (`choose`) and every option considered (fastest first): fixed sizes and depths,
    and (`sized`) trees sized per step by confidence (`floor_options`).
    `draft_tokens`: draft vocabularies to try (DecodeConfig.draft_tokens; default: the base's). Each is warmed
    up and timed on its own, since a narrower one drafts cheaper levels but can propose fewer tokens; the
    winner is the vocabulary whose chosen option is predicted fastest."""
    say = progress or (lambda _msg: None)
    sizes, depths = sizes or SIZES, depths or DEPTHS
    say("tuning: timing verify at " + ", ".join(map(str, sizes)) + " nodes")
    verify = time_verify(dec, prompts[0], tuple(sorted({1, *sizes})))
    by_vocab = {}
    for v in draft_tokens or (base.draft_tokens,):
        big = replace(base, method="eagle2", temperature=0.0, lookup=False, min_prob=0.0, expand_prob=0.0,
                      total_tokens=max(sizes), depth=max(depths), draft_tokens=v,
                      max_new_tokens=max_new_tokens or WARMUP_TOKENS)
        by_vocab[v] = _options(dec, prompts, big, sizes, depths, verify, sized, say)
    best = max((choose(opts) for opts in by_vocab.values()), key=lambda o: o.tokens_per_s)
    options = sorted((o for opts in by_vocab.values() for o in opts), key=lambda o: -o.tokens_per_s)
    return best, options


def _options(dec: Decoder, prompts: list[list[int]], big: DecodeConfig, sizes, depths, verify: dict[int, float],
             sized: bool, say) -> list[Option]:
    """Every option for one draft vocabulary (`big.draft_tokens`), fastest first: replayed on warm-up decodes
    with the largest tree, priced with `verify` and the drafting timed here at each depth."""
    vocab = f", {big.draft_tokens} draft tokens" if big.draft_tokens else ""
    runs: list[list[StepRecord]] = []
    for i, ids in enumerate(prompts):
        say(f"tuning: warm-up decode {i + 1}/{len(prompts)} ({big.total_tokens} nodes, depth {big.depth}{vocab})")
        runs.append([r for r, _ in _timed_steps(dec, ids, big)])
    # ms of a step outside verify at each depth: drafting, commit, building the record. Timed with every
    # level fully drafted: the early cut (`rerank.cutoff`) drafts less the fewer nodes are kept, so timing it
    # at the smallest size would flatter the larger ones; the full cost is an upper bound for every size.
    rest, prune = {}, dec.prune
    try:
        dec.prune = False
        for d in depths:
            say(f"tuning: timing drafting at depth {d}{vocab}")
            steps = _timed_steps(dec, prompts[0], replace(big, depth=d, total_tokens=min(sizes), max_new_tokens=24))
            rest[d] = statistics.median(ms - r.verify_ms for r, ms in steps)
    finally:
        dec.prune = prune
    options = [Option(n, d, replay_runs(runs, n, d), rest[d] + verify[n]) for n in sizes for d in depths]
    if sized:
        options += floor_options(runs, verify, rest, [n for n in FLOOR_CAPS if n <= max(sizes)],
                                 [d for d in FLOOR_DEPTHS if d in rest])
    options = [replace(o, draft_tokens=big.draft_tokens) for o in options]
    options.sort(key=lambda o: -o.tokens_per_s)
    return options


def _interpolate(ms: dict[int, float], n: int) -> float:
    """ms at n (verified rows, or draft levels) from the timed ones: linear between the nearest two, the ends held."""
    lo = max((k for k in ms if k <= n), default=min(ms))
    hi = min((k for k in ms if k >= n), default=max(ms))
    return ms[lo] if hi == lo else ms[lo] + (ms[hi] - ms[lo]) * (n - lo) / (hi - lo)


def floor_options(runs: list[list[StepRecord]], verify: dict[int, float], rest: dict[int, float],
                  caps, depths) -> list[Option]:
    """Trees sized per step by confidence, replayed on the warm-up's recorded steps (`accept_with_floors`):
    each step costs what verifying its own rows and drafting its own levels cost. Like `replay_runs`, each
    decode's tokens are divided by its own replayed accept length, and its steps priced at their mean cost."""
    out = []
    for n, d, p, x in itertools.product(caps, depths, MIN_PROBS, EXPAND_TIMES):
        expand = round(min(1.0, p * x), 6)
        floor, grow = floors(p, expand)
        tokens = steps = ms = rows = 0.0
        for records in runs:
            drafted = [r for r in records if r.nodes]
            if not drafted:
                continue
            got = [accept_with_floors(r, n, d, floor, grow) for r in drafted]
            tau = sum(g[0] for g in got) / len(got)
            k = sum(len(r.accepted) + 1 for r in drafted) / tau  # the steps this tree would take
            tokens, steps = tokens + k * tau, steps + k
            ms += k * sum(_interpolate(verify, g[1]) + _interpolate(rest, g[2]) for g in got) / len(got)
            rows += k * sum(g[1] for g in got) / len(got)
        if steps:
            out.append(Option(n, d, tokens / steps, ms / steps, p, expand, rows / steps))
    return out


def choose(options: list[Option], margin: float = MARGIN) -> Option:
    """The fewest nodes predicted within `margin` of the fastest option, at that size's fastest depth (a tree
    sized by confidence counts its mean rows a step, rounded).

    Near the top the predictions differ by less than their error: the warm-up's accept lengths come from a
    few dozen steps, and prompts that accept more than the real work (answers that repeat themselves) overrate
    big trees. In one tuning (session 16) the seven fastest predictions lay within 1.5% of each other.
    Measured on MT-bench, the tuner's pick of 10 nodes at depth 4 ran 8% slower than 4 nodes at depth 2 on
    the writing prompts, while on mixed prompts 4-8 nodes ran within 2% of each other: among near-ties fewer
    nodes lose little and can gain much. Depth is not cut the same way: its cost is timed with every level
    drafted (an upper bound), and in one run on 16 MT-bench prompts (session 20) 3 nodes at depth 1 ran 6.7%
    slower than at depth 2, and 6 nodes at depth 2 2% slower than at depth 3."""
    fastest = max(o.tokens_per_s for o in options)
    near = [o for o in options if o.tokens_per_s >= (1 - margin) * fastest]
    fewest = min(math.floor(o.nodes + 0.5) for o in near)
    return max((o for o in near if math.floor(o.nodes + 0.5) == fewest), key=lambda o: o.tokens_per_s)


def warmup_texts(n: int | None = None) -> list[str]:
    """The shipped tuning prompts (`assets/tuning.json`, the first `n`; all by default): one per kind of chat
    task (writing, roleplay, reasoning, math, coding, extraction, science, humanities), written for this
    project. Not any benchmark's prompts, since tuning on the prompts a benchmark then measures would flatter
    it; and not only easy ones, since a warm-up that accepts more than the real work does picks trees too deep."""
    import json

    from .config import ASSETS

    return [row["prompt"] for row in json.loads((ASSETS / "tuning.json").read_text())[:n]]


def label(o: Option) -> str:
    """An option in words: its size and depth, or its caps and floors (and a narrowed draft vocabulary)."""
    vocab = f", drafting over {o.draft_tokens:,} tokens" if o.draft_tokens else ""
    if not o.min_prob:
        return f"{o.total_tokens} nodes, depth {o.depth}{vocab}"
    return (f"nodes above {o.min_prob:g} (up to {o.total_tokens}, {o.nodes:.1f} a step), expanded above "
            f"{o.expand_prob:g}, depth up to {o.depth}{vocab}")


def describe(best: Option, options: list[Option], top: int = 6) -> str:
    """A short table of the fastest predicted options (the chosen one marked), as the command line prints it."""
    rows = [f"tuned for this machine: {label(best)} "
            f"(replayed tau {best.tau:.2f}, {best.step_ms:.0f} ms a step, {best.tokens_per_s:.1f} tokens/s predicted; "
            f"the fewest nodes within {MARGIN:.0%} of the fastest prediction, at their fastest depth)"]
    rows += [f"  tau {o.tau:.2f}  {o.step_ms:6.1f} ms  {o.tokens_per_s:5.1f} tok/s  {label(o)}"
             f"{'  <- chosen' if o == best else ''}"
             for o in options[:max(top, options.index(best) + 1)]]
    return "\n".join(rows)
