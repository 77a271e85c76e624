"""Tuning the tree for the machine: the replayed accept length is what the engine would really have accepted."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from eagle2.api import decoder_for
from eagle2.tools.autotune import (EXPAND_TIMES, MARGIN, MIN_PROBS, Option, choose, expand_width, label, time_verify,
                                  tune, warmup_texts)
from eagle2.tools.replay import accept_top_k, accept_with_floors, replay_runs, replay_tau
from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder, encode_prompt
from tests.conftest import first_step


def _decoder(tiny):
    target, head, tok = tiny
    return Decoder(target, head, tok, eos_ids=set())


_rng = random.Random(0)
PROMPTS = [[_rng.randrange(1, 16) for _ in range(_rng.randrange(3, 9))] for _ in range(12)]


@pytest.mark.slow
def test_replay_of_a_big_tree_equals_running_the_small_tree(embedded):
    """The first step has the same context in both runs, so the replay must give exactly the accepted count
    (real model and head, so that drafts are accepted several deep)."""
    dec = decoder_for(embedded)
    big = DecodeConfig(total_tokens=60, depth=7, max_new_tokens=2)
    firsts = [first_step(dec, encode_prompt(embedded.tokenizer, t), big) for t in warmup_texts(3)]
    deep = 0
    for n, d in [(2, 1), (6, 2), (12, 4), (26, 5), (40, 7)]:
        for t, first_big in zip(warmup_texts(3), firsts):
            first_small = first_step(dec, encode_prompt(embedded.tokenizer, t), replace(big, total_tokens=n, depth=d))
            assert replay_tau([first_big], n, d) == len(first_small.accepted) + 1, (n, d, t)
            deep = max(deep, len(first_small.accepted))
    assert deep >= 2  # drafts were accepted beyond the first level: the replay walked real paths


@pytest.mark.slow
def test_replay_with_floors_equals_running_the_tree_sized_by_confidence(embedded):
    """Likewise for trees sized per step: tokens, verified rows and draft levels of the first step, replayed
    from the big tree, are what the engine does with those floors (every level drafted, as the tuner times;
    expand floors above 1 / top_k, where the replay is exact)."""
    dec = decoder_for(embedded)
    big = DecodeConfig(total_tokens=60, depth=7, max_new_tokens=2)
    texts = warmup_texts()  # all eight, so that skipping near-floor cases still leaves 10 checked
    firsts = [first_step(dec, encode_prompt(embedded.tokenizer, t), big) for t in texts]
    seen, checked = set(), 0
    # Depth caps up to 5: deeper, the bf16 draft's scores drift by up to ~0.1 between the big and the sized
    # run (it rounds by batch, and a sized level batches fewer nodes), so a deep node's side of a floor is
    # not reproducible; up to depth 5 they agreed within 0.005.
    for n, d, p, x in [(8, 4, 0.05, 3), (12, 5, 0.03, 4), (26, 5, 0.04, 3), (6, 4, 0.12, 2)]:
        small_cfg = replace(big, total_tokens=n, depth=d, min_prob=p, expand_prob=p * x)
        for t, first_big in zip(texts, firsts):
            floor, grow = math.log(p), math.log(p * x)
            if any(min(abs(m.score - floor), abs(m.score - grow)) < 0.02 for m in first_big.nodes[1:]
                   if m.depth <= d):
                continue  # the bf16 draft rounds by batch: a node this near a floor may fall either side
            small = first_step(dec, encode_prompt(embedded.tokenizer, t), small_cfg, prune=False)
            got = accept_with_floors(first_big, n, d, floor, grow)
            assert got == (len(small.accepted) + 1, len(small.verified), max(m.depth for m in small.nodes)), \
                (n, d, p, x, t)
            seen.add(got[1])
            checked += 1
    assert checked >= 10 and len(seen) >= 3  # the floors really sized the trees differently


def test_replay_grows_with_the_tree(tiny):
    dec = _decoder(tiny)
    cfg = DecodeConfig(total_tokens=40, depth=6, top_k=4, max_new_tokens=10)
    recs = [r for ids in PROMPTS for r in dec.run(ids, cfg)]
    taus = [replay_tau(recs, n, 6) for n in (2, 4, 8, 16, 40)]
    assert taus == sorted(taus) and taus[-1] > taus[0]
    steps = [r for r in recs if r.nodes]  # at its own settings the replay is exactly what was accepted
    assert replay_tau(recs, 40, 6) == pytest.approx(sum(len(r.new_tokens) for r in steps) / len(steps))


def test_replay_over_decodes_counts_their_tokens_over_the_steps_the_tree_would_take(tiny):
    """One decode: the plain replay. Several: all tokens over each decode's tokens / its own replayed accept
    length, so a decode the big tree covered in few steps is not underweighted."""
    dec = _decoder(tiny)
    cfg = DecodeConfig(total_tokens=40, depth=6, top_k=4, max_new_tokens=10)
    runs = [[r for r in dec.run(ids, cfg) if r.nodes] for ids in PROMPTS[:6]]
    tokens = [sum(len(r.new_tokens) for r in run) for run in runs]
    for n, d in [(2, 1), (4, 3), (8, 6)]:
        assert replay_runs(runs[:1], n, d) == pytest.approx(replay_tau(runs[0], n, d))
        want = sum(tokens) / sum(t / replay_tau(run, n, d) for t, run in zip(tokens, runs))
        assert replay_runs(runs, n, d) == pytest.approx(want)
    # at the big tree's own settings it is exactly the tokens over the steps taken
    assert replay_runs(runs, 40, 6) == pytest.approx(sum(tokens) / sum(map(len, runs)))
    with pytest.raises(ValueError):
        replay_runs([[]], 4, 2)


def test_choose_takes_the_fewest_nodes_near_the_fastest_at_their_best_depth():
    opts = [Option(8, 4, 2.60, 150.0), Option(4, 3, 2.05, 120.0), Option(4, 2, 1.95, 115.0),
            Option(3, 2, 1.80, 112.0), Option(2, 1, 1.40, 100.0)]
    fastest = max(opts, key=lambda o: o.tokens_per_s)
    assert choose(opts, margin=0.0) == fastest
    got = choose(opts)
    assert got.tokens_per_s >= (1 - MARGIN) * fastest.tokens_per_s
    fewer = [o for o in opts if o.total_tokens < got.total_tokens]
    assert fewer and all(o.tokens_per_s < (1 - MARGIN) * fastest.tokens_per_s for o in fewer)
    assert all(o.tokens_per_s <= got.tokens_per_s for o in opts if o.total_tokens == got.total_tokens)
    assert (got.total_tokens, got.depth) == (4, 3) and got != fastest
    # a shallower tree of the same size inside the margin does not win on being shallower
    near = [Option(3, 2, 1.914, 122.3), Option(6, 3, 2.382, 155.6), Option(3, 1, 1.676, 110.1)]
    assert (choose(near).total_tokens, choose(near).depth) == (3, 2)


def test_choose_counts_a_sized_tree_by_its_mean_rows():
    fixed = Option(6, 3, 2.30, 100.0)                      # 23.0 tokens/s
    sized = Option(12, 7, 2.35, 101.0, 0.08, 0.16, 5.6)    # 23.3: within the margin, fewer rows (6 when rounded)
    bushy = Option(12, 7, 2.60, 110.0, 0.03, 0.09, 9.4)    # 23.6: the fastest, but more rows
    assert choose([fixed, sized, bushy]) == sized  # 6 rows either way: the faster of the two
    assert choose([fixed, bushy]) == fixed
    assert choose([Option(6, 3, 2.30, 100.0), Option(12, 7, 2.35, 101.0, 0.08, 0.16, 6.5)]).min_prob == 0.0
    assert fixed.nodes == 6.0 and sized.nodes == 5.6


def test_tune_measures_every_option_of_each_method_and_chooses_among_them(tiny):
    dec = _decoder(tiny)
    t = tune(dec, PROMPTS[:2], DecodeConfig(top_k=4), sizes=(2, 4, 8), depths=(1, 3, 4), top_ks=(2, 4, 10),
             max_new_tokens=12)
    assert set(t.chosen) == set(t.options) == {"eagle2", "eagle2_sized", "eagle1"}
    fixed, floored, static = t.options["eagle2"], t.options["eagle2_sized"], t.options["eagle1"]
    assert len(fixed) == 3 * 3 * 2 and {o.top_k for o in fixed} == {2, 4}  # top-k above the recording's is dropped
    assert not any(o.min_prob for o in fixed) and all(o.method == "eagle2" for o in fixed)
    # floors at caps up to the largest size, depths timed: 8 nodes, depth 4
    assert len(floored) == len(MIN_PROBS) * len(EXPAND_TIMES) and all(o.min_prob > 0 for o in floored)
    assert all(o.total_tokens == 8 and o.depth == 4 and 1 <= o.nodes <= 8 for o in floored)
    assert sorted(o.total_tokens for o in static) == [2, 4, 8] and [o.depth for o in sorted(
        static, key=lambda o: o.total_tokens)] == [1, 1, 2]  # mc_sim_7b_63 cut: 1, 3 and 7 nodes
    for m, opts in t.options.items():
        assert t.chosen[m] == choose(opts) and all(o.step_ms > 0 and o.tau >= 1 for o in opts)
        assert [o.tokens_per_s for o in opts] == sorted((o.tokens_per_s for o in opts), reverse=True)
    settings = t.settings()
    assert "depth" not in settings["eagle1"] and "min_prob" not in settings["eagle2"]
    assert settings["eagle2_sized"]["min_prob"] == t.chosen["eagle2_sized"].min_prob
    cost = time_verify(dec, PROMPTS[0], (2, 8))
    assert set(cost) == {2, 8} and all(v > 0 for v in cost.values())


def test_tune_tries_each_draft_vocabulary_and_keeps_the_fastest_for_every_tree(tiny):
    dec = _decoder(tiny)
    t = tune(dec, PROMPTS[:2], DecodeConfig(top_k=4), methods=("eagle2", "eagle1"), sizes=(2, 4), depths=(1, 3),
             top_ks=(4,), max_new_tokens=8, draft_tokens=(0, 6))
    per_vocab = {v: [o for o in t.options["eagle2"] if o.draft_tokens == v] for v in (0, 6)}
    assert len(per_vocab[0]) == len(per_vocab[6]) == 4  # each vocabulary measured on its own
    best = max((choose(o) for o in per_vocab.values()), key=lambda o: o.tokens_per_s)
    assert t.chosen["eagle2"] == best and t.draft_tokens == best.draft_tokens
    assert {o.draft_tokens for o in t.options["eagle1"]} == {best.draft_tokens}  # EAGLE-1 drafts over the same
    assert "eagle2_sized" not in t.chosen
    assert "drafting over 6 tokens" in label(replace(best, draft_tokens=6))
    assert "drafting" not in label(replace(best, draft_tokens=0))


def test_a_smaller_top_k_replays_what_the_engine_accepts(tiny):
    """Replaying a top-4 recording at top-k 2 or 3: exact at depth 2 (every root child it expands was expanded
    in the recording), and never above the engine's own count deeper down."""
    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    big = DecodeConfig(total_tokens=40, depth=5, top_k=4, max_new_tokens=2)
    exact = below = 0
    for ids in PROMPTS:
        first = first_step(dec, ids, big, prune=False)  # the recording expands every node it may
        for n, d, k in [(3, 2, 2), (6, 2, 3), (8, 4, 2), (12, 5, 3)]:
            small = first_step(dec, ids, replace(big, total_tokens=n, depth=d, top_k=k))
            got, want = accept_top_k(first, n, d, k), len(small.accepted) + 1
            if d == 2:
                assert got == want, (ids, n, d, k)
            assert got <= want
            exact += got == want
            below += got < want
    assert exact >= 0.9 * (exact + below)


def test_a_level_expands_no_more_nodes_than_the_tuner_prices_it_at(tiny):
    """Below the root's children, a level of an n-node EAGLE-2 tree expands at most min(top-k, n - 2) nodes (the
    early cut), and the engine reaches that width: `expand_width`, which prices each option, is that bound."""
    from collections import Counter

    dec, widest = _decoder(tiny), Counter()
    for n in (3, 4, 5, 6, 8):
        for k in (2, 4):
            cfg = DecodeConfig(method="eagle2", total_tokens=n, depth=4, top_k=k, max_new_tokens=12)
            for ids in PROMPTS[:4]:
                for rec in list(dec.run(ids, cfg))[1:]:
                    levels = Counter(node.depth for node in rec.nodes if node.expanded and node.depth >= 1)
                    widest[n, k] = max(widest[n, k], *levels.values(), 0)
    assert all(expand_width(n, k) == w for (n, k), w in widest.items()), widest
    assert expand_width(2, 4) == 1  # a 2-node tree drafts no such level: priced at the narrowest timing


def test_drafting_is_priced_at_the_width_a_tree_can_expand():
    """A level's drafting cost lies between the chain's and the full width's timings, linear in the width, and
    never outside them."""
    from eagle2.tools.autotune import draft_cost

    by_width = {1: {1: 2.0, 2: 4.0}, 10: {1: 2.0, 2: 13.0}}
    assert draft_cost(by_width, 2, 1) == 4.0 and draft_cost(by_width, 2, 10) == 13.0
    assert draft_cost(by_width, 2, 4) == pytest.approx(7.0)       # 4 + 9 * 3 / 9
    assert draft_cost(by_width, 2, 40) == 13.0 and draft_cost(by_width, 2, 0) == 4.0
    assert draft_cost({4: {3: 5.0}}, 3, 2) == 5.0                 # one width timed: its cost
