"""Tune each method's tree for the machine at hand: EAGLE-2's size, depth and top-k, eagle2_sized's floors,
EAGLE-1's cut of its static tree.

The authors choose `total_token` by timing target forwards on their GPU and dividing by fixed gains. Here
both sides are measured: a warm-up decode with a large tree records every drafted node and the target's own
choice after each verified one, so the accept length any smaller tree (top-n nodes of depth <= d by score,
exactly what EAGLE-2 would keep) would have had on the same steps can be replayed from the records; the cost
of verifying n nodes is timed with the engine's own verify, and the rest of a step (drafting, commit, the
record) by short timed runs at each depth. EAGLE-1 is replayed the same way from decodes with its whole tree. Of the options predicted near the fastest it keeps the fewest
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

import torch

from ..decode.cache import new_cache
from ..config import STATIC_PRESET, DecodeConfig, cut_tree, parse_tree
from ..decode.engine import Decoder, truncate
from ..decode.records import StepRecord
from .replay import accept_with_floors, replay_runs
from ..decode.rerank import floors
from ..policies import policy
from .serving import interpolate

SIZES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 26, 32, 40, 48, 60)
DEPTHS = (1, 2, 3, 4, 5, 6, 7)
TOP_KS = (4, 6, 8, 10)  # EAGLE-2's children per expanded node, replayed from a top-10 warm-up (`accept_top_k`)
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
DRAFT_ROUNDS = 3  # interleaved rounds of drafting timed at every depth (`time_drafting`)


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
    top_k: int = DecodeConfig.top_k
    method: str = "eagle2"  # eagle2, eagle2_sized (floors) or eagle1 (total_tokens: the cut's size)

    def __post_init__(self) -> None:
        if not self.nodes:
            object.__setattr__(self, "nodes", float(self.total_tokens))

    @property
    def tokens_per_s(self) -> float:
        return 1e3 * self.tau / self.step_ms

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """The closest costs (least squares) that never fall as the key grows: more rows or more levels cannot cost
    less, so a measurement that says so is noise (pool adjacent violators)."""
    keys = sorted(costs)
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for k in keys:
        blocks.append([costs[k], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    out, i = {}, 0
    for mean, n in blocks:
        for k in keys[i:i + n]:
            out[k] = mean
        i += n
    return out


@torch.inference_mode()
def time_verify(dec: Decoder, prompt_ids: list[int], sizes: tuple[int, ...], reps: int = 7,
                context: int = VERIFY_CONTEXT) -> dict[int, float]:
    """Median ms of the engine's greedy verify (tree mask, forward over the cache, argmax) for `n` nodes, over a
    cache of `context` tokens (the prompt repeated: attention's cost grows with the cache, so timing over a
    short prompt alone would flatter big trees), made non-decreasing in `n` (`monotone`). The sizes take turns
    within each round, so a slow spell of the machine costs every size alike instead of shifting the choice;
    the first round only warms up."""
    ids = (prompt_ids * (context // len(prompt_ids) + 1))[:max(context, 1)]
    cache = new_cache(dec.target.config)  # the engine's own cache
    dec.body(input_ids=torch.tensor([ids], device=dec.device), cache=cache, use_cache=True)
    past = len(ids)
    runs: dict[int, list[float]] = {n: [] for n in sizes}
    for rnd in range(reps + 1):
        for n in sizes:
            parents = [-1] + [(i - 1) // 3 for i in range(1, n)]  # a bushy tree; the cost depends on n only
            t0 = dec.sync()
            dec.greedy_tokens(dec.verify(cache, parents, ids[-1:] * n)[0])
            if rnd:
                runs[n].append((dec.sync() - t0) * 1e3)
            truncate(cache, past)
    return monotone({n: statistics.median(v) for n, v in runs.items()})


def _timed_steps(dec: Decoder, ids: list[int], cfg: DecodeConfig,
                 prune: bool = True) -> list[tuple[StepRecord, float]]:
    """Each drafted step's record with its whole wall time in ms (drafting, verify, commit, the record)."""
    out, t0 = [], time.perf_counter()
    for r in dec.run(ids, cfg, prune=prune):
        t1 = time.perf_counter()
        if r.nodes:
            out.append((r, (t1 - t0) * 1e3))
        t0 = t1
    return out


def time_drafting(dec: Decoder, prompt_ids: list[int], cfg: DecodeConfig, depths, say=None,
                  rounds: int = DRAFT_ROUNDS) -> dict[int, float]:
    """Median ms of an EAGLE-2 step outside verify (drafting, commit, the record) at each depth, every level
    drafted in full at `cfg`'s top-k over 16 new tokens of one prompt, made non-decreasing in depth. The depths
    take turns within each of `rounds` rounds, as `time_verify`'s sizes do, so that a slow spell of the machine
    costs every depth alike."""
    return time_drafting_by_width(dec, prompt_ids, cfg, depths, (cfg.top_k,), say, rounds)[cfg.top_k]


def time_drafting_by_width(dec: Decoder, prompt_ids: list[int], cfg: DecodeConfig, depths, widths, say=None,
                           rounds: int = DRAFT_ROUNDS) -> dict[int, dict[int, float]]:
    """`time_drafting` with each level expanding `w` nodes (top-k `w`, drafted in full) for each of `widths`:
    {w: {depth: ms}}. The widths and depths take turns within each round."""
    ms: dict[tuple[int, int], list[float]] = {(w, d): [] for w in widths for d in depths}
    for _ in range(rounds):
        for w in widths:
            for d in depths:
                if say:
                    say(d)
                steps = _timed_steps(dec, prompt_ids, replace(cfg, depth=d, top_k=w, max_new_tokens=16),
                                     prune=False)
                ms[w, d] += [t - r.verify_ms for r, t in steps]
    return {w: monotone({d: statistics.median(ms[w, d]) for d in depths}) for w in widths}


def expand_width(nodes: int, top_k: int) -> int:
    """The most nodes a level below the root's children expands in an n-node EAGLE-2 tree (no lookup branch).
    With the early cut (`rerank.cutoff`) a node is expanded only when it scores strictly above the (n - 1)-th best
    drafted score, which at most n - 2 nodes do, and a level expands at most top-k; at least one, the timings'
    narrowest (a tree of 2 nodes drafts no such level)."""
    return max(1, min(top_k, nodes - 2))


def draft_cost(by_width: dict[int, dict[int, float]], depth: int, width: int) -> float:
    """ms of drafting `depth` levels that expand at most `width` nodes each, from `time_drafting_by_width`: linear
    in the width between the narrowest and widest timed (a level's cost is mostly fixed: the head's call, its
    lm_head rows and the top-k; each expanded node adds a row to each)."""
    lo, hi = min(by_width), max(by_width)
    w = min(max(width, lo), hi)
    a, b = by_width[lo][depth], by_width[hi][depth]
    return a if hi == lo else a + (b - a) * (w - lo) / (hi - lo)


@dataclass(frozen=True)
class Tuning:
    """Each tuned method's chosen option, every option it was chosen from (fastest first), and the draft
    vocabulary every tree method then drafts over (the same for all, so that only the trees differ)."""

    chosen: dict[str, Option]
    options: dict[str, list[Option]]
    draft_tokens: int
    verify_ms: dict[int, float]  # the engine's greedy verify of n rows, median ms (`time_verify`)
    rest_ms: dict[int, float]    # EAGLE-2's step outside verify at each depth (drafting, commit, the record)

    def settings(self) -> dict[str, dict]:
        """Per method, the settings it runs with (methods.Shared.tuned)."""
        out = {}
        for m, o in self.chosen.items():
            out[m] = {"total_tokens": o.total_tokens, "draft_tokens": self.draft_tokens}
            if not policy(m).static:
                out[m].update(depth=o.depth, top_k=o.top_k)
            if policy(m).sized:
                out[m].update(min_prob=o.min_prob, expand_prob=o.expand_prob)
        return out


def tune(dec: Decoder, prompts: list[list[int]], base: DecodeConfig, methods=("eagle2", "eagle2_sized", "eagle1"),
         sizes=None, depths=None, top_ks=None, max_new_tokens: int | None = None, progress=None,
         draft_tokens: tuple[int, ...] | None = None) -> Tuning:
    """Tune each of `methods` (of "eagle2", "eagle2_sized", "eagle1") for itself on this machine: warm up on
    `prompts` with the largest tree of its kind, time each size's verify and each depth's drafting, replay every
    smaller setting from the records (`choose` picks among them).
    eagle2: total tokens x depth x top-k; eagle2_sized: its caps and floors (`floor_options`); eagle1: the
    static tree cut breadth first to each size up to its whole 26 nodes.
    `draft_tokens`: draft vocabularies to try (default: the base's). Each is warmed up and timed on its own,
    since a narrower one drafts cheaper levels but can propose fewer tokens; the vocabulary whose chosen
    EAGLE-2 option is predicted fastest wins, and every tree method, EAGLE-1 included, drafts over it."""
    say = progress or (lambda _msg: None)
    sizes, depths = sizes or SIZES, depths or DEPTHS
    top_ks = tuple(k for k in (top_ks or TOP_KS) if k <= base.top_k) or (base.top_k,)
    say("tuning: timing verify at " + ", ".join(map(str, sizes)) + " nodes")
    verify = time_verify(dec, prompts[0], tuple(sorted({1, *sizes})))
    chosen: dict[str, Option] = {}
    options: dict[str, list[Option]] = {}
    vocab = (draft_tokens or (base.draft_tokens,))[0]
    dynamic = [m for m in methods if policy(m).dynamic]
    rest: dict[int, dict[int, float]] = {vocab: {}}
    if dynamic:
        by_vocab = {v: _options(dec, prompts, replace(base, draft_tokens=v, max_new_tokens=max_new_tokens or
                                                      WARMUP_TOKENS), sizes, depths, top_ks, verify,
                                any(policy(m).sized for m in methods), say)
                    for v in draft_tokens or (base.draft_tokens,)}
        rest = {v: by_vocab[v].pop("rest") for v in by_vocab}
        lead = dynamic[0]
        vocab = max(by_vocab, key=lambda v: choose(by_vocab[v][lead]).tokens_per_s)
        for m in dynamic:
            chosen[m] = choose(by_vocab[vocab][m])
            options[m] = sorted((o for opts in by_vocab.values() for o in opts[m]), key=lambda o: -o.tokens_per_s)
    for m in (m for m in methods if policy(m).static):
        cfg = replace(base, draft_tokens=vocab, max_new_tokens=max_new_tokens or WARMUP_TOKENS)
        options[m] = _static_options(dec, prompts, cfg, sizes, verify, say)
        chosen[m] = choose(options[m])
    return Tuning(chosen, options, vocab, verify, rest[vocab])


def _big(base: DecodeConfig, **kw) -> DecodeConfig:
    """A greedy warm-up config of `base` with no additions, then `kw`."""
    return replace(base, temperature=0.0, lookup=False, min_prob=0.0, expand_prob=0.0, **kw)


def _options(dec: Decoder, prompts: list[list[int]], base: DecodeConfig, sizes, depths, top_ks,
             verify: dict[int, float], sized: bool, say) -> dict:
    """EAGLE-2's options for one draft vocabulary (`base.draft_tokens`), fastest first: "eagle2" (sizes x depths
    x top-k) and, with `sized`, "eagle2_sized", and the drafting cost it measured ("rest"); replayed on warm-up decodes with the largest tree, priced with
    `verify` and the drafting timed here at each depth."""
    big = _big(base, method="eagle2", total_tokens=max(sizes), depth=max(depths))
    vocab = f", {big.draft_tokens} draft tokens" if big.draft_tokens else ""
    runs: list[list[StepRecord]] = []
    for i, ids in enumerate(prompts):
        say(f"tuning EAGLE-2: warm-up decode {i + 1}/{len(prompts)} ({big.total_tokens} nodes, depth {big.depth}"
            f"{vocab})")
        runs.append([r for r, _ in _timed_steps(dec, ids, big)])
    # ms of a step outside verify at each depth: drafting, commit, building the record, timed with every level
    # drafted in full, one node wide (a chain) and as wide as the largest top-k. Each option is priced at the
    # width its levels can reach (`expand_width`), between the two timings (`draft_cost`): the full width alone
    # would overprice narrow deep trees, EAGLE-2's, against EAGLE-1's, which are timed as cut.
    by_width = time_drafting_by_width(dec, prompts[0], replace(big, total_tokens=min(sizes)), depths,
                                      tuple(sorted({1, big.top_k})),
                                      lambda d: say(f"tuning EAGLE-2: timing drafting at depth {d}{vocab}"))
    rest = by_width[big.top_k]
    out = {"eagle2": [Option(n, d, replay_runs(runs, n, d, top_k=k),
                             draft_cost(by_width, d, expand_width(n, k)) + verify[n], top_k=k)
                      for n in sizes for d in depths for k in top_ks]}
    if sized:
        out["eagle2_sized"] = [replace(o, top_k=big.top_k) for o in floor_options(
            runs, verify, rest, [n for n in FLOOR_CAPS if n <= max(sizes)], [d for d in FLOOR_DEPTHS if d in rest])]
    out = {m: sorted((replace(o, draft_tokens=big.draft_tokens, method=m) for o in opts),
                     key=lambda o: -o.tokens_per_s) for m, opts in out.items()}
    return {**out, "rest": rest}


def _static_options(dec: Decoder, prompts: list[list[int]], base: DecodeConfig, sizes,
                    verify: dict[int, float], say) -> list[Option]:
    """EAGLE-1's options, fastest first: mc_sim_7b_63 cut breadth first to each of `sizes` up to the whole tree,
    replayed on warm-up decodes with the whole tree (a cut tree is its first nodes in drafting order). Drafting
    is timed per depth of the cut, with the largest cut of that depth (an upper bound for smaller ones)."""
    whole = parse_tree(STATIC_PRESET, 20)
    big = _big(base, method="eagle1", tree=whole)
    runs = []
    for i, ids in enumerate(prompts):
        say(f"tuning EAGLE-1: warm-up decode {i + 1}/{len(prompts)} (the whole {len(whole) + 1}-node tree)")
        runs.append([r for r, _ in _timed_steps(dec, ids, big)])
    cuts = {n: cut_tree(whole, n) for n in sizes if n <= len(whole) + 1}
    depth_of = {n: max(map(len, t)) for n, t in cuts.items()}
    rest = {}
    for d in sorted(set(depth_of.values())):
        n = max(k for k, v in depth_of.items() if v == d)
        say(f"tuning EAGLE-1: timing drafting at depth {d}")
        steps = _timed_steps(dec, prompts[0], replace(big, tree=cuts[n], max_new_tokens=24))
        rest[d] = statistics.median(ms - r.verify_ms for r, ms in steps)
    rest = monotone(rest)
    opts = [Option(n, depth_of[n], replay_runs(runs, n, 0, static=True), rest[depth_of[n]] + verify[n],
                   top_k=big.static_top_k, draft_tokens=big.draft_tokens, method="eagle1") for n in cuts]
    return sorted(opts, key=lambda o: -o.tokens_per_s)


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
            ms += k * sum(interpolate(verify, g[1]) + interpolate(rest, g[2]) for g in got) / len(got)
            rows += k * sum(g[1] for g in got) / len(got)
        if steps:
            out.append(Option(n, d, tokens / steps, ms / steps, p, expand, rows / steps))
    return out


def choose(options: list[Option], margin: float = MARGIN) -> Option:
    """The fewest nodes predicted within `margin` of the fastest option, at that size's fastest depth (a tree
    sized by confidence counts its mean rows a step, rounded).

    Near the top the predictions differ by less than their error: the warm-up's accept lengths come from a
    few dozen steps, and prompts that accept more than the real work (answers that repeat themselves) overrate
    big trees, so among near-ties fewer nodes lose little and can gain much (docs/how-it-works.md has the
    measurements). Depth is not cut the same way: its cost is timed with every level drafted (an upper bound),
    and a shallower tree of the same size measured slower than the deeper one it tied with."""
    fastest = max(o.tokens_per_s for o in options)
    near = [o for o in options if o.tokens_per_s >= (1 - margin) * fastest]
    fewest = min(math.floor(o.nodes + 0.5) for o in near)
    return max((o for o in near if math.floor(o.nodes + 0.5) == fewest), key=lambda o: o.tokens_per_s)


def same_algorithm(settings: dict[str, dict]) -> str | None:
    """A note when the tuned sizes make EAGLE-2 and EAGLE-1 the same algorithm (each verifies the root and the
    draft's top token only: no tree to compare), else None."""
    e2, e1 = settings.get("eagle2"), settings.get("eagle1")
    if e2 and e1 and e2["total_tokens"] <= 2 and e1["total_tokens"] <= 2:
        return ("the tuned sizes verify one drafted token for both eagle2 and eagle1 (2 nodes): the same algorithm "
                "here, so their ratio says nothing about the trees; compare them at a budget where both draft a "
                "tree (--total-tokens 3 or more)")
    return None


def warmup_texts(n: int | None = None) -> list[str]:
    """The shipped tuning prompts (`assets/tuning.json`, the first `n`; all by default): one per kind of chat
    task (writing, roleplay, reasoning, math, coding, extraction, science, humanities), written for this
    project. Not any benchmark's prompts, since tuning on the prompts a benchmark then measures would flatter
    it; and not only easy ones, since a warm-up that accepts more than the real work does picks trees too deep."""
    import json

    from ..config import ASSETS

    return [row["prompt"] for row in json.loads((ASSETS / "tuning.json").read_text())[:n]]


def label(o: Option) -> str:
    """An option in words: its size, depth and top-k, its caps and floors, or its cut of the static tree."""
    vocab = f", drafting over {o.draft_tokens:,} tokens" if o.draft_tokens else ""
    if policy(o.method).static:
        return f"{STATIC_PRESET} cut to {o.total_tokens} nodes (depth {o.depth}){vocab}"
    if not o.min_prob:
        return f"{o.total_tokens} nodes, depth {o.depth}, top-k {o.top_k}{vocab}"
    return (f"nodes above {o.min_prob:g} (up to {o.total_tokens}, {o.nodes:.1f} a step), expanded above "
            f"{o.expand_prob:g}, depth up to {o.depth}{vocab}")


def near_ties(tuning: Tuning, method: str, margin: float = MARGIN) -> list[dict]:
    """The other options predicted within `margin` of the fastest for `method`: the sizes a second run on the same
    machine may choose instead, since near the top the predictions differ by less than their error. Each with
    its label, predicted tokens/s and its share of the chosen option's."""
    best = tuning.chosen[method]
    fastest = max(o.tokens_per_s for o in tuning.options[method])
    return [{"option": label(o), "tokens_per_s": round(o.tokens_per_s, 2),
             "vs_chosen": round(o.tokens_per_s / best.tokens_per_s, 3)}
            for o in tuning.options[method] if o != best and o.tokens_per_s >= (1 - margin) * fastest]


def describe(tuning: Tuning, top: int = 4) -> str:
    """Per tuned method, its choice and the fastest predicted options (the chosen one marked)."""
    rows = [f"tuned for this machine, each method for itself (the fewest nodes within {MARGIN:.0%} of the "
            f"fastest prediction, at their fastest depth):"]
    for m, best in tuning.chosen.items():
        opts = tuning.options[m]
        rows.append(f"{m}: {label(best)} (replayed tau {best.tau:.2f}, {best.step_ms:.0f} ms a step, "
                    f"{best.tokens_per_s:.1f} tokens/s predicted)")
        rows += [f"  tau {o.tau:.2f}  {o.step_ms:6.1f} ms  {o.tokens_per_s:5.1f} tok/s  {label(o)}"
                 f"{'  <- chosen' if o == best else ''}"
                 for o in opts[:max(top, opts.index(best) + 1)]]
        ties = near_ties(tuning, m)
        rows.append(f"  {len(ties)} other option(s) within {MARGIN:.0%} of the fastest: a second run on this machine "
                    "may choose among them" if ties else
                    f"  no other option within {MARGIN:.0%} of the fastest: the choice is clear of the noise")
    return "\n".join(rows)


def tune_for(bundle, methods: list[str], shared, progress=None, draft_tokens: int | None = None):
    """Tune what `methods` need on the shipped tuning prompts (a minute or two on 2 CPU cores); returns the
    Tuning and `shared` with each method's choice in `tuned`. Without `draft_tokens` it also chooses between the
    head's whole draft vocabulary and its first NARROW_DRAFT tokens, for every tree method alike."""
    from ..api import decoder_for
    from ..decode.engine import encode_prompt
    from ..decode.methods import tunable

    dec = decoder_for(bundle)
    wanted = tunable(methods, shared.tree is not None)
    if draft_tokens is None:
        vocab = (0, NARROW_DRAFT) if dec.draft_ids is not None and len(dec.draft_ids) > NARROW_DRAFT else (0,)
    else:
        vocab = (draft_tokens,)
    base = DecodeConfig(top_k=shared.top_k, max_new_tokens=shared.max_new_tokens)
    prompts = [encode_prompt(bundle.tokenizer, t) for t in warmup_texts()]
    tuning = tune(dec, prompts, base, methods=wanted, progress=progress, draft_tokens=vocab)
    return tuning, replace(shared, tuned=tuning.settings(), draft_tokens=tuning.draft_tokens)
