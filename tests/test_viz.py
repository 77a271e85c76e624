"""Tests for viz/: tree layout, tree figure marks, token HTML and the analysis tables, on hand-made records."""
from __future__ import annotations

import ast
import html
import math
import re
from pathlib import Path

import pytest

from eagle2.decode.records import ACCEPTED, KEPT, PRUNED, REJECTED, ROOT, UNEXPANDED, UNREACHED, Node, StepRecord
from viz import (
    accept_length_figure,
    calibration_figure,
    calibration_table,
    metrics_rows,
    position_heatmap,
    position_table,
    tidy_layout,
    tokens_html,
    tree_figure,
    tree_size_figure,
    tree_size_table,
    visible_text,
)

# (id, parent, text, depth, rank, prob, status, verdict)
TREE = [
    (0, -1, "Hello", 0, 0, 1.0, ROOT, ACCEPTED),
    (1, 0, " world", 1, 0, 0.8, KEPT, ACCEPTED),
    (2, 0, ",", 1, 1, 0.1, KEPT, REJECTED),
    (3, 1, "!", 2, 0, 0.6, KEPT, ACCEPTED),
    (4, 1, "\n", 2, 1, 0.2, KEPT, REJECTED),
    (5, 3, " and", 3, 0, 0.3, KEPT, REJECTED),
    (6, 2, "<b>", 2, 0, 0.5, KEPT, UNREACHED),
    (7, 2, " x", 2, 1, 0.05, PRUNED, None),
    (8, 7, "y", 3, 0, 0.4, UNEXPANDED, None),
    (9, 0, "z", 1, 2, 0.05, UNEXPANDED, None),
]


def make_record(spec=TREE, accepted=(1, 3), new=((" world", "draft"), ("!", "draft"), (" there", "target")),
                step: int = 1, method: str = "eagle2", ms=(10.0, 20.0, 1.0)) -> StepRecord:
    """A tree record from a compact spec; token ids are 100 + node id, the bonus is token 42."""
    nodes = []
    for i, parent, text, depth, rank, prob, status, verdict in spec:
        score = 0.0 if i == 0 else math.log(prob)
        nodes.append(Node(id=i, parent=parent, token=100 + i, text=text, depth=depth, rank=rank, prob=prob,
                          score=score, status=status, expanded=status != UNEXPANDED, verdict=verdict,
                          target_token=7 if verdict == ACCEPTED else None,
                          target_text="t" if verdict == ACCEPTED else None))
    tokens = tuple(100 + accepted[k] if src == "draft" else 42 for k, (_, src) in enumerate(new))
    return StepRecord(step=step, method=method, prefix_len=10, nodes=tuple(nodes), accepted=tuple(accepted),
                      bonus_token=42, new_tokens=tokens, new_texts=tuple(t for t, _ in new),
                      new_sources=tuple(s for _, s in new), draft_ms=ms[0], verify_ms=ms[1], commit_ms=ms[2])


def plain_record(step: int, text: str, method: str = "vanilla", ms=(0.0, 50.0, 0.0)) -> StepRecord:
    """A record with no tree: the prefill (step 0) or one plain decoding step."""
    return StepRecord(step=step, method=method, prefix_len=10, nodes=(), accepted=(), bonus_token=5,
                      new_tokens=(5,), new_texts=(text,), new_sources=("target",),
                      draft_ms=ms[0], verify_ms=ms[1], commit_ms=ms[2])


def node_traces(fig, cls=None):
    return [t for t in fig.data if t.meta and "nodes" in t.meta and (cls is None or t.meta["nodes"] == cls)]


def edge_count(fig, cls: str) -> int:
    traces = [t for t in fig.data if t.meta and t.meta.get("edges") == cls]
    assert len(traces) <= 1, "one trace per edge class"
    return len(traces[0].x) // 3 if traces else 0


def node_points(fig) -> dict:
    """node id -> (x, y, colour, trace class, customdata) over all node traces but the bonus."""
    out = {}
    for t in node_traces(fig):
        if t.meta["nodes"] == "bonus":
            continue
        for x, y, c, cd in zip(t.x, t.y, t.marker.color, t.customdata):
            out[cd[0]] = (x, y, c, t.meta["nodes"], cd)
    return out


# ---- layout ---------------------------------------------------------------------------------------------

def test_layout_exact_positions():
    pos = tidy_layout([(0, -1), (1, 0), (2, 0), (3, 1), (4, 1), (5, 2)])
    assert pos == {3: (0.0, -2.0), 4: (1.0, -2.0), 1: (0.5, -1.0), 5: (2.0, -2.0), 2: (2.0, -1.0), 0: (1.25, 0.0)}


def test_layout_orders_children_by_rank_and_handles_root_only():
    pos = tidy_layout([(0, -1), (1, 0), (2, 0)], rank={1: 1, 2: 0})
    assert pos[2][0] < pos[1][0]
    assert tidy_layout([(0, -1)]) == {0: (0.0, 0.0)}
    assert tidy_layout([]) == {}


def test_layout_slot_widths():
    """Leaves sit in the middle of their slots: two narrow leaves between wide ones take 0.6 in all."""
    pos = tidy_layout([(0, -1), (1, 0), (2, 0), (3, 0), (4, 0)], width={2: 0.3, 3: 0.3})
    assert [pos[i][0] for i in (1, 2, 3, 4)] == pytest.approx([0.0, 0.65, 0.95, 1.6])
    assert tidy_layout([(0, -1), (1, 0), (2, 0)], width={}) == tidy_layout([(0, -1), (1, 0), (2, 0)])


def test_layout_deep_chain_does_not_recurse():
    pos = tidy_layout([(i, i - 1) for i in range(5000)])
    assert pos[4999] == (0.0, -4999.0) and pos[0] == (0.0, 0.0)


# ---- tree figure ----------------------------------------------------------------------------------------

def test_tree_figure_marks_and_counts():
    rec = make_record()
    fig = tree_figure(rec)
    pts = node_points(fig)
    assert sorted(pts) == list(range(len(TREE)))
    assert sum(len(t.x) for t in node_traces(fig)) == len(TREE) + 1  # + bonus
    # Edge classes: one per accepted node, per other verified node, per pruned/unexpanded node, + bonus.
    assert edge_count(fig, "accepted") == len(rec.accepted) == 2
    assert edge_count(fig, "verified") == 4
    assert edge_count(fig, "pruned") == sum(n.status in (PRUNED, UNEXPANDED) for n in rec.nodes) == 3
    assert edge_count(fig, "bonus") == 1
    # Colour is the draft probability on one 0..1 colour axis.
    assert {i: p[2] for i, p in pts.items()} == {n.id: n.prob for n in rec.nodes}
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == 1
    assert "layout" not in fig.layout.template.to_plotly_json()  # template="none": no theme bloat
    # Marks per class.
    assert {i for i, p in pts.items() if p[3] == "accepted"} == {1, 3}
    assert {i for i, p in pts.items() if p[3] == "rejected"} == {2, 4, 5}
    assert {i for i, p in pts.items() if p[3] == "pruned"} == {7, 8, 9}
    (rejected,) = node_traces(fig, "rejected")
    assert rejected.marker.symbol == "circle-x" and rejected.marker.line.color == "#d7191c"
    (faded,) = node_traces(fig, "pruned")
    assert faded.marker.opacity < 1
    (acc,) = node_traces(fig, "accepted")
    assert acc.marker.line.width > node_traces(fig, "verified")[0].marker.line.width


def test_tree_figure_labels_and_hover():
    pts = node_points(tree_figure(make_record()))
    cd = {i: p[4] for i, p in pts.items()}
    assert cd[1][1] == "␣world" and cd[4][1] == "↵" and cd[6][1] == "&lt;b&gt;"
    assert cd[2][2] == 102 and cd[2][6] == 1 and cd[2][7] == KEPT and cd[2][8] == REJECTED
    assert cd[3][9] == "t (7)" and cd[6][9] == "—"
    assert cd[5][4] == pytest.approx(math.log(0.3))


def test_tree_figure_bonus_below_last_accepted_and_layout_centred():
    fig = tree_figure(make_record())
    pts = node_points(fig)
    (bonus,) = node_traces(fig, "bonus")
    assert bonus.text == ("␣there",) and bonus.marker.symbol == "star"
    assert bonus.customdata[0][2] == 42
    bx, by = bonus.x[0], bonus.y[0]
    assert by == pts[3][1] - 1
    # Every parent sits at the mean x of its drawn children (the bonus counts as a child of node 3).
    children: dict[int, list[float]] = {}
    for n in TREE[1:]:
        children.setdefault(n[1], []).append(pts[n[0]][0])
    children.setdefault(3, []).append(bx)
    for parent, xs in children.items():
        assert pts[parent][0] == pytest.approx(sum(xs) / len(xs))
    leaf_xs = [pts[i][0] for i in (4, 5, 6, 8, 9)] + [bx]
    assert len(set(leaf_xs)) == len(leaf_xs)
    assert all(pts[i][1] == -n[3] for i, n in zip(range(len(TREE)), TREE))


def test_tree_figure_bonus_under_root_when_nothing_accepted():
    spec = [(0, -1, "A", 0, 0, 1.0, ROOT, ACCEPTED), (1, 0, "b", 1, 0, 0.7, KEPT, REJECTED)]
    fig = tree_figure(make_record(spec, accepted=(), new=(("c", "target"),)))
    (bonus,) = node_traces(fig, "bonus")
    assert bonus.y[0] == -1 and bonus.text == ("c",)
    assert edge_count(fig, "accepted") == 0 and edge_count(fig, "verified") == 1
    root_x = node_points(fig)[0][0]
    bonus_edge = [t for t in fig.data if t.meta and t.meta.get("edges") == "bonus"][0]
    assert bonus_edge.x[0] == root_x and bonus_edge.x[1] == bonus.x[0]


def _label_extents(fig) -> dict:
    """(row y) -> (left, right, pruned?) of every label drawn on it, in pixels as the figure lays them out."""
    from viz.layout import CHAR_PX, PLOT_PX

    lo, hi = fig.layout.xaxis.range
    px = PLOT_PX / (hi - lo)
    rows: dict = {}
    for t in node_traces(fig):
        for x, y, text in zip(t.x, t.y, t.text or ()):
            if text:
                half = (len(visible_text(html.unescape(text), 8)) * CHAR_PX + 4) / 2
                rows.setdefault(y, []).append((x * px - half, x * px + half, t.meta["nodes"] == "pruned"))
    return rows


def test_pruned_labels_only_where_they_fit():
    """Under the crowd limit, the pruned nodes on a crowded row are labelled only where their labels clear the
    row's others, the likeliest first; kept nodes and the bonus keep theirs (the page once drew "themthe…")."""
    from viz.tree_figure import PRUNED_LABELS_MAX

    n = len(TREE)
    crowd = TREE + [(n + j, 6, f"word{j}", 3, j, 0.02 + j / 1000, PRUNED, None) for j in range(12)]
    crowd[-1] = crowd[-1][:5] + (0.5,) + crowd[-1][6:]  # the likeliest pruned one, last in rank order
    assert len(crowd) - n < PRUNED_LABELS_MAX
    fig = tree_figure(make_record(crowd))
    rows = _label_extents(fig)
    for y, extents in rows.items():
        for a in extents:
            clash = [b for b in extents if b is not a and a[0] < b[1] and b[0] < a[1]]
            assert not (a[2] and clash), f"a pruned node's label overlaps another on row {y}"
    (faded,) = node_traces(fig, "pruned")
    shown = {cd[0] for cd, text in zip(faded.customdata, faded.text) if text}
    assert n + 11 in shown and len(shown & set(range(n, n + 12))) < 12
    assert all(all(t.text) for t in node_traces(fig) if t.meta["nodes"] != "pruned")


def test_tree_figure_no_bonus_when_cut_at_eos():
    fig = tree_figure(make_record(new=((" world", "draft"),)))
    assert not node_traces(fig, "bonus") and edge_count(fig, "bonus") == 0
    assert sum(len(t.x) for t in node_traces(fig)) == len(TREE)


def test_pruned_labels_give_way_when_they_would_pile_up():
    """A few pruned nodes keep their labels; a crowd of them (the default tree drafts 510) keeps marks and
    hover text but no labels, while kept nodes stay labelled."""
    from viz.tree_figure import PRUNED_LABELS_MAX

    few = tree_figure(make_record())
    (faded,) = node_traces(few, "pruned")
    assert list(faded.text) == ["␣x", "y", "z"] and faded.mode == "markers+text"
    n = len(TREE)
    crowd = TREE + [(n + j, 7, f"p{j}", 3, j, 0.01, PRUNED, None) for j in range(PRUNED_LABELS_MAX)]
    fig = tree_figure(make_record(crowd))
    (faded,) = node_traces(fig, "pruned")
    assert len(faded.x) == PRUNED_LABELS_MAX + 3 and faded.text is None and faded.mode == "markers"
    assert all(len(p[4]) > 1 for i, p in node_points(fig).items() if p[3] == "pruned")  # hover data stays
    assert all(t.text for t in node_traces(fig, "accepted") + node_traces(fig, "rejected"))
    # ... and each pruned subtree is squeezed into PRUNED_SLOT (0.12) of a slot (a kept leaf takes 1), so the 60 under " x"
    # (id 7) take no more room than one pruned leaf, and the kept nodes keep theirs
    pts = node_points(fig)
    crowd_x = [pts[n + j][0] for j in range(PRUNED_LABELS_MAX)]
    assert max(crowd_x) - min(crowd_x) < 0.12
    assert max(p[0] for p in pts.values()) - min(p[0] for p in pts.values()) < len(TREE)


def test_tree_figure_hides_pruned():
    fig = tree_figure(make_record(), show_pruned=False)
    assert sorted(node_points(fig)) == [0, 1, 2, 3, 4, 5, 6]
    assert edge_count(fig, "pruned") == 0 and edge_count(fig, "verified") == 4


@pytest.mark.parametrize("step, words", [(0, "prefill: no draft tree"), (4, "plain decoding")])
def test_tree_figure_without_tree(step, words):
    fig = tree_figure(plain_record(step, "Hi"))
    assert not [t for t in fig.data if "markers" in (t.mode or "")]
    assert words in fig.layout.annotations[0].text


def test_visible_text():
    assert visible_text(" a\tb\n") == "␣a⇥b↵"
    assert visible_text("\ufffd") == "\ufffd" and visible_text("") == "∅"
    assert visible_text("\x01") == "\\x01"
    assert visible_text("abcdefghijklmnop", 6) == "abcde…"


# ---- tokens ---------------------------------------------------------------------------------------------

def test_tokens_html_spans():
    recs = [plain_record(0, "<b>&\n"), make_record()]
    out = tokens_html(recs)
    spans = re.findall(r'<span class="tok tok-(\w+)" data-step="(\d+)" title="([^"]*)"[^>]*>(.*?)</span>', out)
    assert [(s[0], s[1], s[3]) for s in spans] == [
        ("target", "0", "&lt;b&gt;&amp;<br>"), ("draft", "1", " world"), ("draft", "1", "!"), ("target", "1", " there"),
    ]
    assert all(s[2].startswith(f"step {s[1]}") for s in spans)
    assert "<b>" not in out and "tok-legend" in out


# ---- analysis -------------------------------------------------------------------------------------------

CHAIN = [  # a second step: p=1.0 accepted (must land in the top bin), p=0.9 rejected, unreached 0.95 ignored
    (0, -1, "A", 0, 0, 1.0, ROOT, ACCEPTED),
    (1, 0, "b", 1, 0, 1.0, KEPT, ACCEPTED),
    (2, 1, "c", 2, 0, 0.9, KEPT, REJECTED),
    (3, 2, "d", 3, 0, 0.95, KEPT, UNREACHED),
]


def analysis_records():
    return [plain_record(0, "A", "eagle2"), make_record(),
            make_record(CHAIN, accepted=(1,), new=(("b", "draft"), ("e", "target")), step=2)]


def test_calibration_table_counts():
    rows = calibration_table(analysis_records(), bins=2)
    assert [(r["bin_lo"], r["bin_hi"], r["n"], r["accepted"]) for r in rows] == [(0.0, 0.5, 3, 0), (0.5, 1.0, 4, 3)]
    assert rows[0]["rate"] == 0.0 and rows[1]["rate"] == 0.75
    rows10 = calibration_table(analysis_records(), bins=10)
    assert sum(r["n"] for r in rows10) == 7 and rows10[9]["n"] == 2 and rows10[9]["accepted"] == 1
    assert rows10[4]["rate"] is None
    with pytest.raises(ValueError):
        calibration_table([], bins=0)


def test_calibration_figure_plots_rates():
    fig = calibration_figure({"eagle2": analysis_records()}, bins=2)
    assert list(fig.data[0].x) == [0, 1] and list(fig.data[0].y) == [0, 1]
    assert list(fig.data[1].y) == [0.0, 0.75] and fig.data[1].name == "eagle2"
    assert "no verified" in calibration_figure({"vanilla": [plain_record(0, "A")]}).layout.annotations[0].text


def test_position_table_and_heatmap():
    table = position_table(analysis_records())
    assert table == {(1, 0): (2, 2), (1, 1): (1, 0), (2, 0): (2, 1), (2, 1): (1, 0), (3, 0): (1, 0)}
    hm = position_heatmap(analysis_records()).data[0]
    assert list(hm.y) == [1, 2, 3] and list(hm.x) == [0, 1]
    assert hm.z[0][0] == 1.0 and hm.z[1][0] == 0.5 and hm.z[2][1] is None and hm.text[1][0] == "1/2"
    capped = position_heatmap(analysis_records(), max_depth=1, max_rank=0).data[0]
    assert list(capped.y) == [1] and list(capped.x) == [0]


def test_accept_length_figure_skips_prefill():
    fig = accept_length_figure({"eagle2": analysis_records()})
    assert list(fig.data[0].x) == [1, 2] and list(fig.data[0].y) == [3, 2]
    assert "2.50" in fig.data[0].name


def test_metrics_rows():
    runs = {"eagle2": analysis_records(), "vanilla": [plain_record(i, "x") for i in range(4)]}
    rows = {r["method"]: r for r in metrics_rows(runs, vanilla_tokens_per_s=20.0)}
    e = rows["eagle2"]
    assert (e["tokens"], e["target_forwards"]) == (6, 3)  # the whole run, prefill included
    assert e["mean_accept_length"] == 2.5  # τ leaves the prefill out (records.tau), as the charts do
    assert e["time_s"] == pytest.approx(0.112)  # 50 ms prefill + 2 x 31 ms
    assert e["tokens_per_s"] == pytest.approx(6 / 0.112) and e["speedup"] == pytest.approx(6 / 0.112 / 20.0)
    assert rows["vanilla"]["tokens_per_s"] == pytest.approx(20.0) and rows["vanilla"]["mean_accept_length"] == 1.0
    assert metrics_rows(runs)[0]["speedup"] is None


def test_viz_imports_no_heavy_libraries():
    banned = {"torch", "transformers", "gradio"}
    for path in (Path(__file__).resolve().parents[1] / "viz").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not {n.split(".")[0] for n in names} & banned, path.name


def test_prompt_lookup_nodes_are_marked_and_kept_out_of_the_rank_table():
    import dataclasses

    rec = make_record()
    sources = {3: "both", 5: "lookup"}  # a lookup branch " world" -> "!" -> " and"; " and" was not in the top-k
    nodes = tuple(dataclasses.replace(n, source=sources.get(n.id, "draft")) for n in rec.nodes)
    rec = dataclasses.replace(rec, nodes=nodes)
    fig = tree_figure(rec)
    (ring,) = [t for t in fig.data if t.meta and t.meta.get("overlay") == "lookup"]
    assert sorted(ring.meta["ids"]) == [3, 5] and ring.name == "prompt-lookup branch"
    pts = node_points(fig)
    assert list(zip(ring.x, ring.y)) == [pts[i][:2] for i in ring.meta["ids"]]  # drawn on those very nodes
    cd = {i: p[4] for i, p in pts.items()}
    assert cd[5][10] == "prompt lookup only" and cd[3][10] == "the draft and prompt lookup"
    assert cd[1][10] == "the draft's top-k"
    assert (3, 0) not in position_table([rec]) and (2, 0) in position_table([rec])
    assert not [t for t in tree_figure(make_record()).data if t.meta and t.meta.get("overlay")]  # none without
    # Accepted path is 1 -> 3; node 3 was proposed by both, so no token came from lookup alone ...
    assert metrics_rows({"eagle2": [rec]})[0]["lookup_accepted"] == 0
    # ... until a lookup-only node is on the accepted path.
    only = dataclasses.replace(rec, nodes=tuple(dataclasses.replace(n, source="lookup") if n.id == 3 else n
                                                for n in rec.nodes))
    assert metrics_rows({"eagle2": [only, only]})[0]["lookup_accepted"] == 2


def test_lookup_tokens_past_the_drafted_levels_stay_out_of_calibration():
    """A lookup branch runs on below the drafted levels; the draft never scored those tokens, so their floor
    probability must not count as the draft's confidence, and their hover says so."""
    import dataclasses

    rec = make_record()
    # " and" (5) hangs from "!" (3); mark "!" as never expanded: " and" was not drafted from its row
    tail = tuple(dataclasses.replace(n, expanded=False) if n.id == 3 else
                 dataclasses.replace(n, source="lookup", prob=1e-30, verdict=ACCEPTED) if n.id == 5 else n
                 for n in rec.nodes)
    rec_tail = dataclasses.replace(rec, nodes=tail)
    assert rec.scored(rec.nodes[5]) and not rec_tail.scored(rec_tail.nodes[5]) and not rec.scored(rec.nodes[0])
    before = calibration_table([rec], bins=2)
    after = calibration_table([rec_tail], bins=2)
    assert [r["n"] for r in after] == [before[0]["n"] - 1, before[1]["n"]]  # " and" (p 0.3) left out, not moved
    cd = {i: p[4] for i, p in node_points(tree_figure(rec_tail)).items()}
    assert "not scored" in cd[5][10] and "not scored" not in cd[3][10]


def _chain_record(method: str = "eagle2") -> StepRecord:
    """Root -> a (p .8) -> c (p .6) is the target's path; b (p .1) and d (p .2) are its rejected siblings."""
    spec = [(0, -1, 0, 1.0, 101), (1, 0, 1, 0.8, 103), (2, 0, 1, 0.1, None), (3, 1, 2, 0.6, 999), (4, 1, 2, 0.2, None)]
    score = {0: 0.0}
    nodes = []
    for i, parent, depth, prob, target in spec:
        if i:
            score[i] = score[parent] + math.log(prob)
        nodes.append(Node(id=i, parent=parent, token=100 + i, text=str(i), depth=depth, rank=0, prob=prob,
                          score=score[i], status=ROOT if i == 0 else KEPT, expanded=True,
                          verdict=ACCEPTED if i in (0, 1, 3) else REJECTED, target_token=target,
                          target_text=None))
    return StepRecord(step=1, method=method, prefix_len=10, nodes=tuple(nodes), accepted=(1, 3), bonus_token=999,
                      new_tokens=(101, 103, 999), new_texts=("a", "c", "!"), new_sources=("draft", "draft", "target"),
                      draft_ms=1.0, verify_ms=2.0, commit_ms=0.0)


def test_tree_size_replay_from_the_run_records():
    """EAGLE-2 keeps by score: a (place 0), c (1), d (2), b (3); with n nodes the target accepts the path nodes
    placed before n - 1, so tau is 1, 2, 3, 3, 3 for n = 1..5. The same step as a static tree keeps its first
    n - 1 nodes in drafting order, a (0), b (1), c (2), d (3): tau 1, 2, 2, 3, 3."""
    recs = [plain_record(0, "A", "eagle2"), _chain_record()]
    static = [plain_record(0, "A", "eagle1"), _chain_record("eagle1")]
    rows, why = tree_size_table(recs, {"settings": {"temperature": 0.0}}, static)
    assert why is None
    assert [(r["nodes"], r["eagle2"], r["eagle1"]) for r in rows] == [
        (1, 1.0, 1.0), (2, 2.0, 2.0), (3, 3.0, 2.0), (4, 3.0, 3.0), (5, 3.0, 3.0)]
    assert [r["eagle1"] for r in tree_size_table(recs, {})[0]] == [None] * 5  # no EAGLE-1 run: no curve
    fig = tree_size_figure(recs, {"static_tree": "mc_sim_7b_63"}, static)
    line2, own2, line1, own1 = fig.data
    assert list(line2.y) == [1.0, 2.0, 3.0, 3.0, 3.0] and (own2.x[0], own2.y[0]) == (5, 3.0)
    assert list(line1.y) == [1.0, 2.0, 2.0, 3.0, 3.0] and "mc_sim_7b_63" in line1.name and "EAGLE-1" in own1.name
    assert fig.layout.annotations[0].text == "EAGLE-2: 3 nodes already accept as much as 5"
    for meta, words in [({"settings": {"temperature": 0.7}}, "greedy"), ({"settings": {"lookup": True}}, "prompt-lookup")]:
        assert tree_size_table(recs, meta)[0] == [] and words in tree_size_table(recs, meta)[1]
        assert words in tree_size_figure(recs, meta).layout.annotations[0].text
    assert "no drafted steps" in tree_size_figure([plain_record(0, "A", "eagle2")], {}).layout.annotations[0].text
    import dataclasses  # a trace without the lookup setting still shows its lookup nodes in the records

    looked = dataclasses.replace(recs[1], nodes=recs[1].nodes[:2] + (dataclasses.replace(recs[1].nodes[2], source="lookup"),)
                                 + recs[1].nodes[3:])
    assert "prompt-lookup" in tree_size_table([looked], {})[1]
