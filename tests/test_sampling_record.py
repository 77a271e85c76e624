"""What a sampled step records is what decided it: replaying the recorded numbers through the rule gives the
recorded verdicts, and each number equals the one computed afresh from the target (plain forwards, not the tree's).

The replay walks the accepted path as `accept_sampling` does: at each node the residual starts as the target's
distribution there; each tried child must carry r(x) / sum(r) as its probability, be accepted exactly when its
draw is below it, and on rejection zero r(x). Where the path stops, the recorded top tokens and the bonus's
probability must be those of what remains. Changing one recorded number must make the replay fail.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.decode.records import ACCEPTED, REJECTED, UNREACHED, Node, StepRecord, Trace
from eagle2.decode.verify import RESIDUAL_TOP, target_probs
from eagle2.heads.eagle import new_head
from tests.conftest import CharTokenizer, tiny_target

V, T, TOP_P, PROMPT = 8, 0.7, 0.9, [1, 5, 2]
CFG = DecodeConfig(method="eagle2", max_new_tokens=12, temperature=T, top_p=TOP_P, total_tokens=8, depth=3, top_k=3)
TOL = 1e-4  # the tree's forward and a plain forward differ by float rounding only


@pytest.fixture(scope="module")
def sampled():
    """(target, decoder, [(history before the step, record)]) for a few seeds' sampled runs."""
    target = tiny_target(vocab=V, std=0.4, seed=5)
    dec = Decoder(target, new_head(target, seed=3), CharTokenizer())
    steps = []
    for seed in range(6):
        history = list(PROMPT)
        for r in dec.run(PROMPT, replace(CFG, seed=seed)):
            if r.nodes:
                steps.append((list(history), r))
            history += r.new_tokens
    return target, dec, steps


def path_to(rec: StepRecord, node: Node) -> list[int]:
    """The drafted tokens from below the root down to `node`."""
    out = []
    while node.parent >= 0:
        out.append(node.token)
        node = rec.nodes[node.parent]
    return out[::-1]


def replay(target, history: list[int], rec: StepRecord) -> list[str]:
    """Walk the rule over the recorded numbers -> every disagreement found (none when the record is honest)."""
    def probs_at(node: Node) -> torch.Tensor:
        with torch.no_grad():
            logits = target(torch.tensor([history + path_to(rec, node)])).logits[0, -1:]
        return target_probs(logits, T, TOP_P)[0].double()

    kids: dict[int, list[Node]] = {}
    for n in rec.verified[1:]:
        kids.setdefault(n.parent, []).append(n)
    problems, walked, cur = [], [], rec.nodes[0]
    while True:
        residual, nxt = probs_at(cur), None
        for c in sorted(kids.get(cur.id, []), key=lambda n: n.id):  # the verifier's order: by depth, then pool id
            if nxt is not None:
                if c.verdict != UNREACHED or c.draw is not None:
                    problems.append(f"node {c.id} was decided after a sibling won")
                continue
            expected = float(residual[c.token] / residual.sum())
            if c.target_prob is None or c.draw is None:
                problems.append(f"node {c.id} has no recorded numbers")
                continue
            if abs(c.target_prob - expected) > TOL:
                problems.append(f"node {c.id}: recorded probability {c.target_prob} but the residual gives {expected}")
            if (c.draw < c.target_prob) != (c.verdict == ACCEPTED) or c.verdict not in (ACCEPTED, REJECTED):
                problems.append(f"node {c.id}: draw {c.draw} against {c.target_prob} does not give {c.verdict}")
            if c.verdict == ACCEPTED:
                nxt = c
            else:
                residual[c.token] = 0.0
        if nxt is None:
            break
        walked.append(nxt.id)
        cur = nxt
    if tuple(walked) != rec.accepted:
        problems.append(f"the replayed path {walked} is not the recorded {list(rec.accepted)}")
    dist = residual / residual.sum()
    top = sorted(dist.tolist(), reverse=True)[:len(rec.residual_top)]
    if len(rec.residual_top) != min(RESIDUAL_TOP, int((dist > 0).sum())):
        problems.append(f"{len(rec.residual_top)} residual tokens recorded")
    for (tok, _, p), want in zip(rec.residual_top, top):
        if abs(p - float(dist[tok])) > TOL or abs(p - want) > TOL:
            problems.append(f"residual token {tok}: recorded {p}, the residual gives {float(dist[tok])}")
    if rec.bonus_prob is None or abs(rec.bonus_prob - float(dist[rec.bonus_token])) > TOL:
        problems.append(f"bonus probability {rec.bonus_prob}, the residual gives {float(dist[rec.bonus_token])}")
    return problems


def test_recorded_numbers_replay_to_the_recorded_verdicts(sampled):
    target, dec, steps = sampled
    tried = [n for _, r in steps for n in r.verified[1:] if n.draw is not None]
    assert sum(n.verdict == REJECTED for n in tried) >= 5 and sum(n.verdict == ACCEPTED for n in tried) >= 5
    for history, rec in steps:
        assert replay(target, history, rec) == [], rec.step
        assert all(text == dec.token_text(t) for t, text, _ in rec.residual_top)


def _find(steps, want):
    return next((h, r, n) for h, r in steps for n in r.verified[1:] if want(r, n))


def test_a_wrong_number_fails_the_replay(sampled):
    target, _, steps = sampled
    # A rejected child whose draw is moved under its probability: the verdict no longer follows.
    h, r, n = _find(steps, lambda r, n: n.verdict == REJECTED and n.target_prob > 1e-3)
    bad = replace(r, nodes=tuple(replace(m, draw=n.target_prob / 2) if m.id == n.id else m for m in r.nodes))
    assert any(f"node {n.id}: draw" in p for p in replay(target, h, bad))
    # A later sibling's probability left unrenormalised (the target's p(x) itself, before the rejections).
    def later(r, n):
        return n.draw is not None and n.target_prob > 0.01 and any(
            m.parent == n.parent and m.id < n.id and m.verdict == REJECTED and m.target_prob > 0.01 for m in r.verified)
    h, r, n = _find(steps, later)
    with torch.no_grad():
        logits = target(torch.tensor([h + path_to(r, r.nodes[n.parent])])).logits[0, -1:]
    p = float(target_probs(logits, T, TOP_P)[0, n.token])
    assert abs(p - n.target_prob) > TOL  # the rejection really changed it
    bad = replace(r, nodes=tuple(replace(m, target_prob=p) if m.id == n.id else m for m in r.nodes))
    assert any(f"node {n.id}: recorded probability" in q for q in replay(target, h, bad))
    # Residual tokens given the probabilities of a sibling's token swapped in: the stop's top no longer matches.
    h, r = next((h, r) for h, r in steps
                if len(r.residual_top) >= 2 and r.residual_top[0][2] - r.residual_top[1][2] > 0.01)
    (t0, s0, p0), (t1, s1, p1) = r.residual_top[:2]
    bad = replace(r, residual_top=((t0, s0, p1), (t1, s1, p0), *r.residual_top[2:]))
    assert any(q.startswith("residual token") for q in replay(target, h, bad))
    bad = replace(r, bonus_prob=(r.bonus_prob or 0.0) * 0.5)
    assert any(q.startswith("bonus probability") for q in replay(target, h, bad))


def test_sampled_numbers_survive_a_trace_and_old_traces_load(sampled):
    _, _, steps = sampled
    recs = [r for _, r in steps[:4]]
    d = json.loads(Trace(meta={}, runs={"eagle2": recs}).to_json())
    assert Trace.from_json(json.dumps(d)).runs["eagle2"] == recs
    for r in d["runs"]["eagle2"]:  # a trace written before these fields existed
        del r["residual_top"], r["bonus_prob"]
        for n in r["nodes"]:
            for k in ("target_prob", "draw"):
                n.pop(k, None)
    back = Trace.from_json(json.dumps(d)).runs["eagle2"]
    assert [b.residual_top for b in back] == [()] * len(recs) and all(n.draw is None for b in back for n in b.nodes)
    assert [b.new_tokens for b in back] == [r.new_tokens for r in recs]
    d["runs"]["eagle2"][0]["residual_top"] = [[1, "a"]]
    with pytest.raises(ValueError, match="malformed step record"):
        Trace.from_json(json.dumps(d))


def test_greedy_records_carry_no_sampling_numbers(sampled):
    target, dec, _ = sampled
    recs = list(dec.run(PROMPT, replace(CFG, temperature=0.0)))
    assert all(r.residual_top == () and r.bonus_prob is None for r in recs)
    assert all(n.target_prob is None and n.draw is None for r in recs for n in r.nodes)


def test_a_greedy_trace_is_written_as_before(sampled):
    """The sampling fields are left out where empty: a greedy step's JSON has exactly the fields it had before."""
    _, dec, steps = sampled
    rec = list(dec.run(PROMPT, replace(CFG, temperature=0.0, max_new_tokens=3)))[1]
    d = rec.to_dict()
    assert "residual_top" not in d and "bonus_prob" not in d
    assert not {"target_prob", "draw"} & {k for n in d["nodes"] for k in n}
    assert StepRecord.from_dict(d) == rec
    sampled_d = steps[0][1].to_dict()
    assert sampled_d["residual_top"] and any("draw" in n for n in sampled_d["nodes"])
    assert StepRecord.from_dict(sampled_d) == steps[0][1]


def test_a_trace_with_a_bad_sampling_number_gets_a_message(sampled):
    """The page formats and compares these numbers: junk in a file is refused at load, naming the field."""
    _, _, steps = sampled
    good = json.loads(Trace(meta={}, runs={"eagle2": [steps[0][1]]}).to_json())
    tried = next(i for i, n in enumerate(good["runs"]["eagle2"][0]["nodes"]) if "draw" in n)
    for where, junk in ((("nodes", tried, "draw"), "0.5"), (("nodes", tried, "target_prob"), [1]),
                        (("bonus_prob",), True), (("residual_top",), [[1, "a", "x"]]), (("residual_top",), 7),
                        (("residual_top",), [[10 ** 400, "a", 0.5]])):
        d = json.loads(json.dumps(good))
        at = d["runs"]["eagle2"][0]
        for k in where[:-1]:
            at = at[k]
        at[where[-1]] = junk
        with pytest.raises(ValueError, match="malformed step record"):
            Trace.from_json(json.dumps(d))
