"""Tuning the tree for the machine: the replayed accept length is what the engine would really have accepted."""
from __future__ import annotations

from dataclasses import replace

import random

import pytest

from eagle2.api import decoder_for
from eagle2.autotune import replay_tau, time_verify, tune, warmup_texts
from eagle2.config import DecodeConfig
from eagle2.engine import Decoder, encode_prompt


def _decoder(tiny):
    target, head, tok = tiny
    return Decoder(target, head, tok, eos_ids=set())


_rng = random.Random(0)
PROMPTS = [[_rng.randrange(1, 16) for _ in range(_rng.randrange(3, 9))] for _ in range(12)]


def test_replay_of_a_big_tree_equals_running_the_small_tree(embedded):
    """The first step has the same context in both runs, so the replay must give exactly the accepted count
    (real model and head, so that drafts are accepted several deep)."""
    dec = decoder_for(embedded)
    big = DecodeConfig(total_tokens=60, depth=7, max_new_tokens=2)
    firsts = [list(dec.run(encode_prompt(embedded.tokenizer, t), big))[1] for t in warmup_texts(3)]
    deep = 0
    for n, d in [(2, 1), (6, 2), (12, 4), (26, 5), (40, 7)]:
        for t, first_big in zip(warmup_texts(3), firsts):
            first_small = list(dec.run(encode_prompt(embedded.tokenizer, t), replace(big, total_tokens=n, depth=d)))[1]
            assert replay_tau([first_big], n, d) == len(first_small.accepted) + 1, (n, d, t)
            deep = max(deep, len(first_small.accepted))
    assert deep >= 2  # drafts were accepted beyond the first level: the replay walked real paths


def test_replay_grows_with_the_tree(tiny):
    dec = _decoder(tiny)
    cfg = DecodeConfig(total_tokens=40, depth=6, top_k=4, max_new_tokens=10)
    recs = [r for ids in PROMPTS for r in dec.run(ids, cfg)]
    taus = [replay_tau(recs, n, 6) for n in (2, 4, 8, 16, 40)]
    assert taus == sorted(taus) and taus[-1] > taus[0]
    steps = [r for r in recs if r.nodes]  # at its own settings the replay is exactly what was accepted
    assert replay_tau(recs, 40, 6) == pytest.approx(sum(len(r.accepted) + 1 for r in steps) / len(steps))


def test_tune_picks_the_fastest_measured_option(tiny):
    dec = _decoder(tiny)
    best, options = tune(dec, PROMPTS[:2], DecodeConfig(top_k=4), sizes=(2, 4, 8), depths=(1, 3), max_new_tokens=12)
    assert len(options) == 6 and best == options[0]
    assert all(o.step_ms > 0 and o.tau >= 1 for o in options)
    assert best.tokens_per_s == max(o.tokens_per_s for o in options)
    cost = time_verify(dec, PROMPTS[0], (2, 8))
    assert set(cost) == {2, 8} and all(v > 0 for v in cost.values())
