"""The decode loop on a tiny random model: tree invariants, greedy equality, EOS and limit cuts."""
from __future__ import annotations

import json

import pytest
import torch

from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.decode.lookup import continuation
from eagle2.decode.records import ACCEPTED, KEPT, PRUNED, REJECTED, ROOT, UNEXPANDED, StepRecord, Trace
from eagle2.decode.rerank import select_dynamic

PROMPT = [3, 1, 4, 1, 5, 7, 2, 6]


def reference(target, prompt, n, eos=None):
    """transformers' own greedy generate: the ground truth every method must reproduce."""
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def tokens(records):
    return [t for r in records for t in r.new_tokens]


@pytest.mark.parametrize("method", ["vanilla", "eagle1", "eagle2"])
def test_greedy_equals_generate(tiny, method):
    target, head, tok = tiny
    ref = reference(target, PROMPT, 30)
    recs = list(Decoder(target, head, tok).run(PROMPT, DecodeConfig(method=method, max_new_tokens=30, top_k=4)))
    assert tokens(recs) == ref
    assert sum(r.target_forwards for r in recs) == len(recs)


def test_dynamic_tree_invariants(tiny):
    target, head, tok = tiny
    cfg = DecodeConfig(method="eagle2", max_new_tokens=12, total_tokens=10, depth=4, top_k=3)
    dec = Decoder(target, head, tok)
    recs = list(dec.run(PROMPT, cfg, prune=False))[1:]  # the paper's drafting: every level expands its top_k
    for r in recs:
        by_id = {n.id: n for n in r.nodes}
        kept = [n for n in r.nodes if n.status in (ROOT, KEPT)]
        assert len(kept) == cfg.total_tokens  # root + total_tokens - 1 drafted nodes
        assert all(by_id[n.parent].status in (ROOT, KEPT) for n in kept if n.parent >= 0)  # connected
        dropped = [n for n in r.nodes if n.status in (PRUNED, UNEXPANDED)]
        # all candidates are recorded: root's top_k, then top_k frontier nodes x top_k children per level
        assert len(r.nodes) == 1 + cfg.top_k + (cfg.depth - 1) * cfg.top_k ** 2
        assert min(n.score for n in kept[1:]) >= max(n.score for n in dropped)  # kept = top of the pool
        assert all(n.expanded for n in r.nodes if n.status == PRUNED)
        assert not any(n.expanded for n in r.nodes if n.status == UNEXPANDED)
        for n in r.nodes[1:]:
            assert n.score == pytest.approx(by_id[n.parent].score + torch.tensor(n.prob).log().item(), abs=1e-4)
        assert all(by_id[i].verdict == ACCEPTED for i in r.accepted)


def kept_paths(r: StepRecord) -> set[tuple[int, ...]]:
    """Each kept node as the token path from the root: comparable across runs whatever the node ids."""
    by_id = {n.id: n for n in r.nodes}

    def path(n):
        return (path(by_id[n.parent]) if n.parent >= 0 else ()) + (n.token,)
    return {path(n) for n in r.nodes if n.status in (ROOT, KEPT)}


def confident_head(target, scale: float):
    """A random head whose output layers are scaled up, so its draft is peaked and deep paths make the cut."""
    from eagle2.heads.eagle import new_head

    head = new_head(target, seed=1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if any(k in name for k in ("fc", "o_proj", "down_proj")):
                p.mul_(scale)
    return head


@pytest.mark.parametrize("std,scale", [(0.02, 16.0), (1.0, 4.0)])
@pytest.mark.parametrize("lookup", [False, True])
def test_pruned_drafting_keeps_the_same_tree(tiny, std, scale, lookup):
    """Not expanding nodes at or below the cut drafts fewer nodes but keeps exactly the tree full drafting
    keeps. (With a random flat draft only shallow nodes are ever kept, which would not test the cut: these
    heads keep paths 4-6 deep, and cutting at the (keep - 1)-th best instead of the keep-th changes the tree.)"""
    from tests.conftest import tiny_target

    target = tiny_target(vocab=16, std=std)
    head, tok = confident_head(target, scale), tiny[2]
    prompt = PROMPT + PROMPT  # repeats, so the lookup branch has something to continue
    cfg = DecodeConfig(method="eagle2", max_new_tokens=24, total_tokens=10, depth=5, top_k=3, lookup=lookup)
    dec = Decoder(target, head, tok)
    full, pruned = list(dec.run(prompt, cfg, prune=False))[1:], list(dec.run(prompt, cfg))[1:]
    assert max(len(p) for r in full for p in kept_paths(r)) >= 5  # root + 4 levels: the cut matters here
    assert [r.new_tokens for r in pruned] == [r.new_tokens for r in full]
    assert [kept_paths(r) for r in pruned] == [kept_paths(r) for r in full]
    drafted = [(len(p.nodes), len(f.nodes)) for p, f in zip(pruned, full)]
    assert all(a <= b for a, b in drafted) and any(a < b for a, b in drafted), drafted


def test_static_tree_shape_is_the_preset(tiny):
    target, head, tok = tiny
    cfg = DecodeConfig(method="eagle1", max_new_tokens=6, top_k=4)
    for r in list(Decoder(target, head, tok).run(PROMPT, cfg))[1:]:
        assert len(r.nodes) == 26 and all(n.status in (ROOT, KEPT) for n in r.nodes)
        assert max(n.depth for n in r.nodes) == 5


def oracle_setup(tiny):
    """vocab 8 with top_k 8: the root's children cover every token, so each step accepts at least one."""
    from eagle2.heads.eagle import new_head
    from tests.conftest import tiny_target

    target = tiny_target(vocab=8, std=0.3)
    return target, new_head(target, seed=2), tiny[2]


def test_limit_cuts_inside_an_accepted_path(tiny):
    target, head, tok = oracle_setup(tiny)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=20, depth=4, top_k=8)
    recs = list(Decoder(target, head, tok).run(PROMPT, cfg))
    long_step = next(r for r in recs[1:] if len(r.accepted) >= 2)
    before = sum(len(r.new_tokens) for r in recs if r.step < long_step.step)
    limit = before + 1  # stop after the first accepted token of that step
    cut = list(Decoder(target, head, tok).run(PROMPT, DecodeConfig(**{**cfg.__dict__, "max_new_tokens": limit})))
    assert len(cut[-1].accepted) >= 2 and len(cut[-1].new_tokens) == 1
    assert tokens(cut) == reference(target, PROMPT, limit)


def test_eos_inside_an_accepted_path_stops_like_generate(tiny):
    target, head, tok = oracle_setup(tiny)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=20, depth=4, top_k=8)
    recs = list(Decoder(target, head, tok).run(PROMPT, cfg))
    step = next(r for r in recs[1:] if len(r.accepted) >= 2)
    eos = step.new_tokens[0]  # an accepted draft token that is not the step's last
    ref = reference(target, PROMPT, 40, eos=eos)
    out = tokens(list(Decoder(target, head, tok, eos_ids={eos}).run(PROMPT, cfg)))
    assert out == ref and out[-1] == eos and len(out) < 40


def test_records_round_trip_json(tiny):
    target, head, tok = tiny
    recs = list(Decoder(target, head, tok).run(PROMPT, DecodeConfig(max_new_tokens=5, top_k=3, total_tokens=6)))
    trace = Trace(meta={"prompt": "x"}, runs={"eagle2": recs})
    back = Trace.from_json(trace.to_json())
    assert back.runs["eagle2"] == recs and back.meta == {"prompt": "x"}
    raw = json.loads(trace.to_json())["runs"]["eagle2"]
    assert [len(r["nodes"]) for r in raw] == [len(r.nodes) for r in recs] and raw[1]["nodes"][0]["status"] == ROOT
    # every verified node whose parent was accepted got a verdict; the target rejected some
    for r in recs[1:]:
        by_id = {n.id: n for n in r.nodes}
        judged = [n for n in r.nodes if n.status == KEPT and by_id[n.parent].verdict == ACCEPTED]
        assert all(n.verdict in (ACCEPTED, REJECTED) for n in judged)
    assert any(n.verdict == REJECTED for r in recs for n in r.nodes)
    with pytest.raises(ValueError, match="version"):
        Trace.from_json(json.dumps({"version": 99, "runs": {}}))
    with pytest.raises(ValueError, match="JSON"):
        Trace.from_json("{oops")
    assert StepRecord.from_dict(recs[1].to_dict()) == recs[1]


def test_reduced_draft_vocabulary_stays_lossless(tiny):
    target, head, tok = tiny
    head.draft_vocab = torch.tensor([0, 2, 4, 6, 8, 10])  # the draft may only propose even tokens < 12
    dec = Decoder(target, head, tok)
    recs = list(dec.run(PROMPT, DecodeConfig(method="eagle2", max_new_tokens=30, top_k=4, total_tokens=10)))
    assert tokens(recs) == reference(target, PROMPT, 30)
    drafted = {n.token for r in recs[1:] for n in r.nodes[1:]}
    assert drafted and drafted <= {0, 2, 4, 6, 8, 10}
    for method in ("eagle2", "eagle1"):  # draft_tokens: only the vocabulary's first tokens, still lossless
        recs = list(dec.run(PROMPT, DecodeConfig(method=method, max_new_tokens=30, top_k=4, total_tokens=10,
                                                 draft_tokens=4)))
        assert tokens(recs) == reference(target, PROMPT, 30)
        drafted = {n.token for r in recs[1:] for n in r.nodes[1:]}
        assert drafted and drafted <= {0, 2, 4, 6}
    assert dec.draft_rows(4).ids.tolist() == [0, 2, 4, 6] and dec.draft_rows(99) is dec.draft_rows(0)  # 0, too many: all
    with pytest.raises(ValueError, match="draft_tokens=3"):
        DecodeConfig(method="eagle2", top_k=4, draft_tokens=3)


def test_prompt_longer_than_context_is_refused_with_the_limit(tiny):
    target, head, tok = tiny
    dec = Decoder(target, head, tok)
    with pytest.raises(ValueError, match="context is 512 tokens"):
        next(dec.run([1] * 500, DecodeConfig(max_new_tokens=16)))
    with pytest.raises(ValueError, match="empty"):
        next(dec.run([], DecodeConfig()))


REPEATING = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5]  # its tail occurred before: prompt lookup has a branch to offer


def test_prompt_lookup_branch_is_lossless_and_verified_on_top_of_the_tree(tiny):
    target, head, tok = tiny
    prompt = REPEATING * 2  # long repeats: some chains run past the drafted levels
    ref = reference(target, prompt, 30)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=30, total_tokens=6, depth=2, top_k=2, lookup=True,
                       lookup_tokens=5)
    recs = list(Decoder(target, head, tok).run(prompt, cfg))
    assert tokens(recs) == ref
    lookup_only = unscored = 0
    for i, r in enumerate(recs[1:], start=1):
        by_id = {n.id: n for n in r.nodes}
        on_chain = sorted((n for n in r.nodes if n.source in ("lookup", "both")), key=lambda n: n.depth)
        history = prompt + tokens(recs[:i])
        assert [n.token for n in on_chain] == continuation(history, cfg.lookup_tokens)
        assert all(n.status == KEPT for n in on_chain)  # always verified, whatever the draft thought of it
        assert [n.depth for n in on_chain] == list(range(1, len(on_chain) + 1))  # one path from the root
        assert all(by_id[n.parent].source != "draft" for n in on_chain if n.depth > 1)
        for n in on_chain:
            if n.depth <= cfg.depth:  # scored by the draft like any other node
                assert n.score == pytest.approx(by_id[n.parent].score + torch.tensor(n.prob).log().item(), abs=1e-4)
            else:  # past the drafted levels: the draft never saw it
                assert n.source == "lookup" and not n.expanded and n.prob < 1e-20
                unscored += 1
        # the rest of the tree is what EAGLE-2 alone keeps from the drafted pool: the branch comes on top
        drafted = [n for n in r.nodes if n.depth <= cfg.depth]
        tree = set(select_dynamic(drafted, cfg.total_tokens - 1)[1:])
        assert {n.id for n in r.nodes if n.status == KEPT} == tree | {n.id for n in on_chain}
        lookup_only += sum(n.source == "lookup" for n in on_chain)
    assert lookup_only > 0 and unscored > 0  # lookup tokens the draft did not propose, some past its depth


def test_lookup_branch_nodes_compete_for_the_budget_against_a_run_without_it(tiny):
    """The branch's nodes join EAGLE-2's pool with their own draft scores (its node on each level is expanded
    even outside the top-k), so the rerank's total_tokens - 1 slots go to the best of the whole pool: a branch
    node that scores high enough takes a slot a drafted node had in the run without the branch; branch nodes
    left out are verified on top. Compared on the first step, where both runs start from the same state."""
    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    cfg = DecodeConfig(method="eagle2", max_new_tokens=2, total_tokens=6, depth=3, top_k=2, lookup_tokens=4)
    took_slot = 0
    for shift in range(12):
        prompt = [(t + shift) % 16 for t in REPEATING]
        plain = list(dec.run(prompt, cfg))[1]
        branch = list(dec.run(prompt, DecodeConfig(**{**cfg.__dict__, "lookup": True})))[1]

        def paths(r, ids):
            by_id = {n.id: n for n in r.nodes}
            out = set()
            for i in ids:
                path, n = [], by_id[i]
                while n.parent >= 0:
                    path.append(n.token)
                    n = by_id[n.parent]
                out.add(tuple(reversed(path)))
            return out

        chain = continuation(prompt + [plain.nodes[0].token], cfg.lookup_tokens)
        kept_plain = paths(plain, [n.id for n in plain.nodes if n.status == KEPT])
        if not chain:  # nothing to copy: the same tree as without the branch
            assert paths(branch, [n.id for n in branch.nodes if n.status == KEPT]) == kept_plain
            continue
        drafted = [n for n in branch.nodes if n.depth <= cfg.depth]
        ranked = select_dynamic(drafted, cfg.total_tokens - 1)[1:]  # the rerank's picks, branch nodes included
        verified = [n.id for n in branch.nodes if n.status == KEPT]
        assert len(verified) <= cfg.total_tokens - 1 + len(chain)
        if paths(branch, ranked) - paths(plain, [n.id for n in plain.nodes]):
            took_slot += 1  # a node the run without the branch never drafted holds one of the slots ...
            assert not kept_plain <= paths(branch, verified)  # ... which one of its drafted nodes had
    assert took_slot > 0
    # the names say which ran
    assert DecodeConfig(**{**cfg.__dict__, "lookup": True}).name == "eagle2_lookup" and cfg.name == "eagle2"


def test_lookup_setting_is_validated():
    with pytest.raises(ValueError, match="lookup"):
        DecodeConfig(lookup="yes")


def test_lookup_continuation_copies_what_followed_the_latest_match():
    assert continuation([1, 2, 3, 9, 9, 1, 2, 3], 4) == [9, 9, 1, 2]       # longest suffix (1 2 3) first
    assert continuation([5, 1, 2, 7, 1, 2, 8, 1, 2], 3) == [8, 1, 2]       # the most recent occurrence
    assert continuation([4, 1, 2, 7, 3, 2], 3) == []                         # one-token matches are not used
    assert continuation([7, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]               # a loop is continued round the loop
    assert continuation([1, 2, 3], 3) == [] and continuation([], 3) == [] and continuation([1, 2, 1, 2], 0) == []


@pytest.mark.parametrize("lookup", [False, True])
def test_tree_sized_per_step_by_confidence(tiny, lookup):
    """With min_prob / expand_prob the kept tree is every drafted node at least min_prob likely (up to
    total_tokens), only nodes at least expand_prob likely are expanded, the size changes from step to step,
    and the output still equals greedy decoding."""
    from tests.conftest import tiny_target

    target = tiny_target(vocab=16, std=1.0)
    head, tok = confident_head(target, 4.0), tiny[2]
    prompt = PROMPT + PROMPT
    ref = reference(target, prompt, 40)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=12, depth=6, top_k=3, min_prob=0.05,
                       expand_prob=0.2, lookup=lookup, lookup_tokens=4)
    recs = list(Decoder(target, head, tok).run(prompt, cfg))
    assert tokens(recs) == ref
    sizes, depths = set(), set()
    floor, grow = torch.tensor([cfg.min_prob, cfg.expand_prob]).log().tolist()
    for r in recs[1:]:
        on_chain = {n.id for n in r.nodes if n.source in ("lookup", "both")}  # verified on top regardless
        tree = set(select_dynamic([n for n in r.nodes if n.depth <= cfg.depth], cfg.total_tokens - 1, floor)[1:])
        assert {n.id for n in r.nodes if n.status == KEPT} == tree | on_chain
        assert all(n.score >= grow for n in r.nodes[1:] if n.expanded and n.id not in on_chain)
        sizes.add(len(tree))
        depths.add(max(n.depth for n in r.nodes if n.id in tree | {0}))
    assert len(sizes) >= 3 and len(depths) >= 2, (sizes, depths)  # the tree really changes per step


def test_unset_floors_keep_the_fixed_size_tree(tiny):
    target, head, tok = tiny
    cfg = DecodeConfig(method="eagle2", max_new_tokens=12, total_tokens=10, depth=4, top_k=3)
    dec = Decoder(target, head, tok)
    plain = list(dec.run(PROMPT, cfg))[1:]
    floored = list(dec.run(PROMPT, DecodeConfig(**{**cfg.__dict__, "min_prob": 1e-9})))[1:]
    assert all(len(r.verified) == cfg.total_tokens for r in plain)
    assert [kept_paths(r) for r in floored] == [kept_paths(r) for r in plain]  # a floor nothing falls below
    with pytest.raises(ValueError, match="min_prob"):
        DecodeConfig(min_prob=1.5)


def test_the_last_record_says_why_the_run_stopped(tiny):
    """`stop` is set on the last record only: the token limit, an end-of-sequence token (even inside an accepted
    path), or `should_stop` (asked before each record goes out, the prefill's included)."""
    target, head, tok = oracle_setup(tiny)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=20, depth=4, top_k=8)
    recs = list(Decoder(target, head, tok).run(PROMPT, cfg))
    assert [r.stop for r in recs] == [None] * (len(recs) - 1) + ["max_new_tokens"]
    eos = next(r for r in recs[1:] if len(r.accepted) >= 2).new_tokens[0]
    ended = list(Decoder(target, head, tok, eos_ids={eos}).run(PROMPT, cfg))
    assert ended[-1].stop == "eos" and ended[-1].new_tokens[-1] == eos and {r.stop for r in ended[:-1]} == {None}
    answers = iter([False, False, True])  # asked after the prefill, after step 1, after step 2
    stopped = list(Decoder(target, head, tok).run(PROMPT, cfg, should_stop=lambda: next(answers)))
    assert [r.stop for r in stopped] == [None, None, "stopped"]
    only = list(Decoder(target, head, tok).run(PROMPT, DecodeConfig(method="vanilla", max_new_tokens=1)))
    assert [r.stop for r in only] == ["max_new_tokens"]  # the prefill's token was the last


def test_a_trace_from_before_the_stop_field_still_loads(tiny):
    target, head, tok = tiny
    recs = list(Decoder(target, head, tok).run(PROMPT, DecodeConfig(max_new_tokens=5, top_k=3, total_tokens=6)))
    d = json.loads(Trace(meta={}, runs={"eagle2": recs}).to_json())
    assert d["runs"]["eagle2"][-1]["stop"] == "max_new_tokens"
    for r in d["runs"]["eagle2"]:
        del r["stop"]
    back = Trace.from_json(json.dumps(d)).runs["eagle2"]
    assert [r.stop for r in back] == [None] * len(recs) and [r.new_tokens for r in back] == [r.new_tokens for r in recs]
