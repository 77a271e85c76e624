"""Replaying recorded steps with smaller trees: `accept_by_size` / `size_curve` against a direct walk."""
from __future__ import annotations

import random

import pytest

from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.decode.records import KEPT
from eagle2.decode.rerank import best, select_dynamic
from eagle2.tools.replay import accept_by_size, replay_tau, size_curve, target_path
from tests.conftest import first_step

_rng = random.Random(1)
PROMPTS = [[_rng.randrange(1, 16) for _ in range(_rng.randrange(3, 9))] for _ in range(10)]


def _follow(r, keep: set[int]) -> int:
    """Tokens the step produces with only the `keep` nodes: follow the target's recorded choices from the root."""
    node, accepted = r.nodes[0], 0
    while node.target_token is not None:
        nxt = [c for c in r.nodes if c.parent == node.id and c.id in keep and c.token == node.target_token]
        if not nxt:
            break
        node, accepted = nxt[0], accepted + 1
    return accepted + 1


def _cut(r, tokens: int) -> int:
    """A step the run ended by a cut (EOS or the token limit) kept only its new tokens: so would any tree."""
    return min(tokens, len(r.new_tokens)) if r.stop in ("eos", "max_new_tokens") else tokens


def _walk(r, n: int) -> int:
    """Reference: keep what the engine's rerank keeps of the recorded pool, then follow the target's choices."""
    return _cut(r, _follow(r, set(select_dynamic(list(r.nodes), n - 1))))


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


def test_at_the_run_s_own_size_every_step_replays_the_tokens_it_produced(records):
    """The page draws a run's tau against tree size from this replay: at the run's own size it must be the
    tokens each step produced, the last step cut by the token limit included (not its whole accepted path)."""
    assert [accept_by_size(r, 20)[-1] for r in records] == [len(r.new_tokens) for r in records]
    assert any(len(r.new_tokens) < len(r.accepted) + 1 for r in records)  # some run's last step was cut


def test_the_engine_keeps_the_rerank_choice_and_the_walk_gives_the_accepted_path(records):
    """One copy of each rule: the nodes the engine verified are `rerank.best` of its recorded pool, and walking
    the target's recorded choices through them gives the path the engine accepted."""
    for r in records:
        assert {n.id for n in r.nodes if n.status == KEPT} == {n.id for n in best(r.nodes[1:], 20 - 1)}
        assert tuple(n.id for n in target_path(r.nodes[0], r.verified[1:])) == r.accepted
    assert any(len(r.nodes) > 20 for r in records)  # the rerank left nodes out somewhere


def test_size_curve_starts_at_plain_decoding_grows_and_ends_at_the_run(records):
    curve = size_curve(records, 20)
    assert curve[0] == 1.0  # the root alone: one token a step, as plain decoding
    assert curve == sorted(curve) and curve[-1] > curve[1]
    assert curve[-1] == pytest.approx(sum(len(r.new_tokens) for r in records) / len(records))
    assert curve[5] == pytest.approx(replay_tau(records, 6, 5))
    with pytest.raises(ValueError):
        size_curve([], 4)


def _static_walk(r, n: int) -> int:
    """Reference for a static tree: keep its first n - 1 drafted nodes, then follow the target's choices."""
    return _follow(r, {c.id for c in r.nodes[:n]})


def test_static_tree_cut_breadth_first_equals_the_walk(tiny):
    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    cfg = DecodeConfig(method="eagle1", max_new_tokens=12, top_k=4)  # mc_sim_7b_63: 26 nodes, 5 levels
    records = [r for ids in PROMPTS for r in dec.run(ids, cfg) if r.nodes]
    for r in records:
        assert accept_by_size(r, 26, static=True) == [_cut(r, _static_walk(r, n)) for n in range(1, 27)]
    assert max(len(r.accepted) for r in records) >= 2
    curve = size_curve(records, 26, static=True)
    assert curve[-1] == pytest.approx(sum(len(r.new_tokens) for r in records) / len(records))


@pytest.mark.slow
def test_static_replay_equals_running_the_cut_tree(embedded):
    """The first step has the same context in both runs: the 26-node tree's replay at n nodes must give what
    the tree cut to its first n - 1 paths accepts."""
    from eagle2.api import decoder_for
    from eagle2.tools.autotune import warmup_texts
    from eagle2.config import parse_tree
    from eagle2.decode.engine import encode_prompt

    dec = decoder_for(embedded)
    full = DecodeConfig(method="eagle1", max_new_tokens=2)
    paths = parse_tree("mc_sim_7b_63", 10)
    deep = 0
    for text in warmup_texts(4):
        ids = encode_prompt(embedded.tokenizer, text)
        first = first_step(dec, ids, full)
        for n in (2, 5, 8, 13, 21):
            cut = first_step(dec, ids, DecodeConfig(method="eagle1", tree=paths[:n - 1]))
            assert accept_by_size(first, n, static=True)[-1] == len(cut.accepted) + 1, (text, n)
            deep = max(deep, len(cut.accepted))
    assert deep >= 2  # the replay walked real paths beyond the first level
