"""Tests for viz/unfold.py: replaying one step's tree frame by frame from hand-made records."""
from __future__ import annotations

import math
import re
import time
from dataclasses import replace

import pytest

from eagle2.decode.records import ACCEPTED, KEPT, PRUNED, REJECTED, ROOT, UNEXPANDED, UNREACHED, Node, StepRecord
from viz import Stage, stage_names, stages, unfold_figure, unfold_text

# (id, parent, text, depth, rank, prob, status, expanded, verdict, target_text)
# EAGLE-2, top-2, 2 levels, keep 3: A and B expanded, the best three (A, A1, A2) kept; A accepted, A1 rejected.
DYN = [
    (0, -1, "Hi", 0, 0, 1.0, ROOT, True, ACCEPTED, "A"),
    (1, 0, "A", 1, 0, 0.7, KEPT, True, ACCEPTED, "X"),
    (2, 0, "B", 1, 1, 0.2, PRUNED, True, None, None),
    (3, 1, "A1", 2, 0, 0.6, KEPT, False, REJECTED, None),
    (4, 1, "A2", 2, 1, 0.3, KEPT, False, REJECTED, None),
    (5, 2, "B1", 2, 0, 0.5, UNEXPANDED, False, None, None),
    (6, 2, "B2", 2, 1, 0.4, UNEXPANDED, False, None, None),
]
# EAGLE-2, top-2, 3 levels, keep 3: at level 3, B1 is in the top-2 of depth 2 but scores below the 3rd best so far.
SKIP = [
    (0, -1, "Hi", 0, 0, 1.0, ROOT, True, ACCEPTED, "A"),
    (1, 0, "A", 1, 0, 0.7, KEPT, True, ACCEPTED, "A1"),
    (2, 0, "B", 1, 1, 0.2, PRUNED, True, None, None),
    (3, 1, "A1", 2, 0, 0.9, KEPT, True, ACCEPTED, "Z"),
    (4, 1, "A2", 2, 1, 0.1, UNEXPANDED, False, None, None),
    (5, 2, "B1", 2, 0, 0.5, UNEXPANDED, False, None, None),
    (6, 2, "B2", 2, 1, 0.4, UNEXPANDED, False, None, None),
    (7, 3, "A1a", 3, 0, 0.8, KEPT, False, REJECTED, None),
    (8, 3, "A1b", 3, 1, 0.1, UNEXPANDED, False, None, None),
]
# EAGLE-1: a fixed shape of 3 + 2 + 1 + 1 nodes, all verified.
STATIC = [
    (0, -1, "Hi", 0, 0, 1.0, ROOT, True, ACCEPTED, "s0"),
    (1, 0, "s0", 1, 0, 0.5, KEPT, True, ACCEPTED, "W"),
    (2, 0, "s1", 1, 1, 0.3, KEPT, True, UNREACHED, None),
    (3, 0, "s2", 1, 2, 0.1, KEPT, False, UNREACHED, None),
    (4, 1, "s00", 2, 0, 0.4, KEPT, True, REJECTED, None),
    (5, 1, "s01", 2, 1, 0.2, KEPT, False, REJECTED, None),
    (6, 2, "s10", 2, 0, 0.6, KEPT, False, UNREACHED, None),
    (7, 4, "s000", 3, 0, 0.9, KEPT, False, UNREACHED, None),
]


def make(spec, accepted, new, method: str = "eagle2", step: int = 7) -> StepRecord:
    """A record from a spec; scores are the cumulative log-probabilities along the path; new: (text, source)."""
    nodes: list[Node] = []
    for i, parent, text, depth, rank, prob, status, expanded, verdict, target in spec:
        score = 0.0 if parent < 0 else nodes[parent].score + math.log(prob)
        nodes.append(Node(id=i, parent=parent, token=100 + i, text=text, depth=depth, rank=rank, prob=prob,
                          score=score, status=status, expanded=expanded, verdict=verdict,
                          target_token=None if target is None else 9, target_text=target))
    return StepRecord(step=step, method=method, prefix_len=10, nodes=tuple(nodes), accepted=tuple(accepted),
                      bonus_token=42, new_tokens=tuple(range(len(new))), new_texts=tuple(t for t, _ in new),
                      new_sources=tuple(s for _, s in new), draft_ms=1.0, verify_ms=2.0, commit_ms=0.1)


def dyn() -> StepRecord:
    return make(DYN, (1,), [("A", "draft"), ("X", "target")])


def skip() -> StepRecord:
    return make(SKIP, (1, 3), [("A", "draft"), ("A1", "draft"), ("Z", "target")])


def static() -> StepRecord:
    return make(STATIC, (1,), [("s0", "draft"), ("W", "target")], method="eagle1")


def prefill() -> StepRecord:
    return StepRecord(step=0, method="eagle2", prefix_len=10, nodes=(), accepted=(), bonus_token=5, new_tokens=(5,),
                      new_texts=("Hi",), new_sources=("target",), draft_ms=0.0, verify_ms=5.0, commit_ms=0.0)


def without_pruned(r: StepRecord) -> StepRecord:
    """The record as a memory-bounded session keeps it: root and kept nodes only, ids renumbered."""
    keep = [n for n in r.nodes if n.status not in (PRUNED, UNEXPANDED)]
    new_id = {n.id: k for k, n in enumerate(keep)}
    nodes = tuple(replace(n, id=new_id[n.id], parent=new_id.get(n.parent, -1)) for n in keep)
    return replace(r, nodes=nodes, accepted=tuple(new_id[a] for a in r.accepted))


def points(fig) -> dict[int, tuple[float, float, str]]:
    """node id -> (x, y, class) over every plotted node but the bonus."""
    out = {}
    for t in fig.data:
        if t.meta and t.meta.get("nodes") not in (None, "bonus"):
            for x, y, cd in zip(t.x, t.y, t.customdata):
                assert cd[0] not in out, "a node is plotted once"
                out[cd[0]] = (x, y, t.meta["nodes"])
    return out


def expanded_lines(text: str) -> dict[str, str]:
    """'- **“name”** score S ...' lines: expanded node name -> its score as written."""
    return dict(re.findall(r"^- \*\*“(.+?)”\*\* score (-?\d+\.\d+)", text, re.M))


def test_stage_names_for_one_and_both_records():
    assert [s.name for s in stages(dyn())] == ["root", "level 1", "level 2", "rerank", "verdict"]
    assert stage_names(dyn(), None) == ["root", "level 1", "level 2", "rerank", "verdict"]
    assert stage_names(dyn(), static()) == ["root", "level 1", "level 2", "level 3", "rerank", "verdict"]
    assert stage_names(None, prefill()) == ["root", "rerank", "verdict"]
    assert all(isinstance(s, Stage) and s.title.startswith("eagle2 · step 7") for s in stages(dyn()))


def test_level_text_names_exactly_the_expanded_nodes_and_their_scores():
    r = skip()
    for d in (1, 2, 3):
        want = {n.text: f"{n.score:.2f}" for n in r.nodes if n.depth == d - 1 and n.expanded}
        assert expanded_lines(unfold_text(r, f"level {d}")) == want
    level2 = unfold_text(dyn(), "level 2")
    assert expanded_lines(level2) == {"A": f"{math.log(0.7):.2f}", "B": f"{math.log(0.2):.2f}"}
    assert "“B1” p 0.500" in level2 and f"cum. p {0.7:.3f}" in level2


def test_early_cut_is_named_with_its_reason():
    text = unfold_text(skip(), "level 3", total_tokens=4)
    third = sorted((n.score for n in skip().nodes if 1 <= n.depth <= 2), reverse=True)[2]
    assert re.search(r"^- skipped “B1” score -2\.30 .*at or below the 3rd best score drafted so far "
                     + re.escape(f"({third:.2f})"), text, re.M)
    assert "skipped “A2”" not in text  # ranked below the top-2: not an early cut
    assert "skipped" not in unfold_text(dyn(), "level 2")
    assert points(unfold_figure(skip(), "level 3"))[5][2] == "skipped"


@pytest.mark.parametrize("d", [1, 2])
def test_level_figure_shows_exactly_the_nodes_up_to_its_depth(d):
    r = dyn()
    pts = points(unfold_figure(r, f"level {d}"))
    assert set(pts) == {n.id for n in r.nodes if n.depth <= d}
    assert {i for i, p in pts.items() if p[2] == "new"} == {n.id for n in r.nodes if n.depth == d}
    assert {i for i, p in pts.items() if p[2] == "expanding"} == {n.id for n in r.nodes if n.depth == d - 1}


def test_figure_titles_and_style():
    fig = unfold_figure(dyn(), "level 2", "EAGLE-2")
    assert fig.layout.title.text == "EAGLE-2 · step 7 · level 2 of 2"
    assert unfold_figure(dyn(), "rerank").layout.title.text == "eagle2 · step 7 · rerank"
    assert fig.layout.xaxis.visible is False and fig.layout.coloraxis.colorscale[0][1] == "#440154"
    assert all(t.hovertemplate for t in fig.data if t.meta and "nodes" in t.meta)


def test_rerank_text_counts_and_cut_line():
    r = dyn()
    text = unfold_text(r, "rerank")
    kept = [n for n in r.nodes if n.status == KEPT]
    faded = [n for n in r.nodes if n.status in (PRUNED, UNEXPANDED)]
    assert int(re.search(r"(\d+) kept", text).group(1)) == len(kept) == 3
    assert "pool holds 6 drafted nodes" in text and "3 pruned" in text and "connected" in text
    low = float(re.search(r"Lowest kept score (-?\d+\.\d+)", text).group(1))
    high = float(re.search(r"highest pruned score (-?\d+\.\d+)", text).group(1))
    assert low == round(min(n.score for n in kept), 2) and high == round(max(n.score for n in faded), 2)
    assert high < low
    pts = points(unfold_figure(r, "rerank"))
    assert {i for i, p in pts.items() if p[2] == "pruned"} == {n.id for n in faded}


def test_verdict_text_and_figure():
    text = unfold_text(skip(), "verdict")
    assert "Accepted path: “A” → “A1” (2 drafted tokens)" in text
    assert "First rejected: “A1a” (p 0.800); the target wanted “Z”" in text
    assert "Bonus token: “Z”" in text and "committed 3 new tokens" in text
    fig = unfold_figure(skip(), "verdict")
    pts = points(fig)
    assert set(pts) == {0, 1, 3, 7}  # pruned nodes hidden
    assert {i for i, p in pts.items() if p[2] == "accepted"} == {1, 3} and pts[7][2] == "rejected"
    assert [t.text[0] for t in fig.data if t.meta and t.meta.get("nodes") == "bonus"] == ["Z"]


def test_positions_are_the_same_in_every_frame():
    for r in (skip(), static()):
        seen: dict[int, tuple[float, float]] = {}
        names = stage_names(r, None) + ["level 5"]
        for name in names:
            for i, (x, y, _) in points(unfold_figure(r, name)).items():
                assert seen.setdefault(i, (x, y)) == (x, y), (name, i)
                assert y == -r.nodes[i].depth
        assert set(seen) == {n.id for n in r.nodes}


def test_static_record_fixed_shape_and_no_rerank():
    r = static()
    level1 = unfold_text(r, "level 1")
    assert "fixed shape" in level1 and "drafts 3 nodes under 1 parent" in level1
    assert "whatever the draft's confidence" in level1
    assert expanded_lines(unfold_text(r, "level 2")) == {"s0": f"{math.log(0.5):.2f}",
                                                          "s1": f"{math.log(0.3):.2f}"}
    rerank = unfold_text(r, "rerank")
    assert rerank.startswith("**No rerank.**") and "all 7 drafted nodes" in rerank
    assert "skipped" not in unfold_text(r, "level 2")


def test_stage_past_the_depth_shows_the_whole_tree():
    text = unfold_text(dyn(), "level 3")
    assert "no more levels: this tree is 2 levels deep" in text.lower()
    fig = unfold_figure(dyn(), "level 3")
    assert set(points(fig)) == {n.id for n in dyn().nodes}
    assert fig.layout.title.text == "eagle2 · step 7 · level 3 (tree is 2 deep)"


@pytest.mark.parametrize("rec", [prefill(), None])
def test_no_tree_gives_a_note(rec):
    for name in ("root", "level 1", "rerank", "verdict"):
        assert "no tree at this step" in unfold_text(rec, name)
        fig = unfold_figure(rec, name)
        assert not points(fig) and fig.layout.annotations and "no tree" in fig.layout.annotations[0].text
    if rec is not None:
        assert [s.name for s in stages(rec)] == ["root", "rerank", "verdict"]


def test_record_without_pruned_nodes_unfolds():
    r = without_pruned(dyn())
    for s in stages(r):
        assert s.text and unfold_figure(r, s.name).data
    assert "Pruned nodes were not kept" in unfold_text(r, "rerank")
    assert "Pruned nodes were not kept" in unfold_text(r, "level 2")
    assert "Pruned nodes were not kept" not in unfold_text(dyn(), "level 2")
    assert "3 kept" in unfold_text(r, "rerank")


def test_hostile_text_is_escaped():
    spec = [list(row) for row in DYN]
    spec[1][2], spec[3][2], spec[4][2] = "<script>", "**", "|"
    r = make([tuple(row) for row in spec], (1,), [("<script>", "draft"), ("X", "target")])
    for name in stage_names(r, None):
        text = unfold_text(r, name)
        assert "<script>" not in text
        assert "“\\*\\*”" in text or name in ("root", "level 1", "rerank")
        fig = unfold_figure(r, name)
        for t in fig.data:
            for s in list(t.text or []) + [str(c[1]) for c in (t.customdata or [])]:
                assert "<script>" not in s
    level2 = unfold_text(r, "level 2")
    assert "“&lt;script&gt;”" in level2 and "“\\|”" in level2
    assert "**“&lt;script&gt;”**" in level2


@pytest.mark.parametrize("bad", ["leaf", "level 0", "level x", "Level 1", ""])
def test_unknown_stage_raises(bad):
    with pytest.raises(ValueError, match="unknown stage"):
        unfold_figure(dyn(), bad)
    with pytest.raises(ValueError, match="unknown stage"):
        unfold_text(dyn(), bad)


def test_sixty_node_frame_is_fast():
    spec = [(0, -1, "r", 0, 0, 1.0, ROOT, True, ACCEPTED, "t")]
    for i in range(1, 61):  # a 4-ary tree of 60 drafted nodes, the first 25 kept
        parent = (i - 1) // 4
        spec.append((i, parent, f"t{i}", spec[parent][3] + 1, (i - 1) % 4, 0.5, KEPT if i <= 25 else UNEXPANDED,
                     4 * i + 1 <= 60, UNREACHED if i <= 25 else None, None))
    r = make(spec, (), [("x", "target")])
    unfold_figure(r, "level 2")
    start = time.perf_counter()
    for name in stage_names(r, None):
        unfold_figure(r, name)
    per = (time.perf_counter() - start) / len(stage_names(r, None))
    assert per < 0.2, f"{per * 1000:.0f} ms a frame"
