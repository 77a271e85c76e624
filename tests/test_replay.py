"""Replaying recorded steps with smaller trees: `accept_by_size` / `size_curve` against a direct walk."""
from __future__ import annotations

import random

import pytest

from eagle2.config import DecodeConfig
from eagle2.engine import Decoder
from eagle2.replay import accept_by_size, replay_tau, size_curve
from eagle2.rerank import select_dynamic

_rng = random.Random(1)
PROMPTS = [[_rng.randrange(1, 16) for _ in range(_rng.randrange(3, 9))] for _ in range(10)]


def _walk(r, n: int) -> int:
    """Reference: keep what the engine's rerank keeps of the recorded pool, then follow the target's choices."""
    keep = set(select_dynamic(list(r.nodes), n - 1))
    node, accepted = r.nodes[0], 0
    while node.target_token is not None:
        nxt = [c for c in r.nodes if c.parent == node.id and c.id in keep and c.token == node.target_token]
        if not nxt:
            break
        node, accepted = nxt[0], accepted + 1
    return accepted + 1


@pytest.fixture
def records(tiny):
    """A confident random head (top-k 3 over a 16-token vocabulary), so drafts are accepted several deep."""
    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    cfg = DecodeConfig(total_tokens=20, depth=5, top_k=3, max_new_tokens=12)
    return [r for ids in PROMPTS for r in dec.run(ids, cfg) if r.nodes]


def test_every_size_equals_the_rerank_walk(records):
    for r in records:
        assert accept_by_size(r, 20) == [_walk(r, n) for n in range(1, 21)]
    assert max(len(r.accepted) for r in records) >= 2  # the walk went beyond the first level somewhere


def test_size_curve_starts_at_plain_decoding_grows_and_ends_at_the_run(records):
    curve = size_curve(records, 20)
    assert curve[0] == 1.0  # the root alone: one token a step, as plain decoding
    assert curve == sorted(curve) and curve[-1] > curve[1]
    assert curve[-1] == pytest.approx(sum(len(r.accepted) + 1 for r in records) / len(records))
    assert curve[5] == pytest.approx(replay_tau(records, 6, 5))
    with pytest.raises(ValueError):
        size_curve([], 4)
