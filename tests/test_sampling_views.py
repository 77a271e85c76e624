"""The sampled verdict in words (tree hover, step caption, unfold verdict frame), on a hand-made record whose
numbers are known: each tried sibling says its residual probability, its draw and its verdict in order; the
stopping node and the bonus say the residual's top tokens. Greedy records read as before."""
from __future__ import annotations

from dataclasses import replace

from app_parts.views import step_caption
from eagle2.decode.records import ACCEPTED, KEPT, REJECTED, ROOT, UNREACHED, Node, StepRecord
from viz import tree_figure, unfold_figure, unfold_text
from viz.sampling import node_sentence, residual_sentence, step_sentences

# Root "x": " a" rejected (0.20, draw 0.50), then " the" accepted after it (0.60, draw 0.30); " b" never tried.
# Under " the": " cat" rejected (0.31, draw 0.57); the bonus " dog" comes from what remains.
NODES = (
    Node(0, -1, 10, "x", 0, 0, 1.0, 0.0, ROOT, True, ACCEPTED),
    Node(1, 0, 11, " a", 1, 0, 0.5, -0.7, KEPT, False, REJECTED, target_prob=0.2, draw=0.5),
    Node(2, 0, 12, " the", 1, 1, 0.3, -1.2, KEPT, True, ACCEPTED, target_prob=0.6, draw=0.3),
    Node(3, 0, 13, " b", 1, 2, 0.1, -2.3, KEPT, False, UNREACHED),
    Node(4, 2, 14, " cat", 2, 0, 0.4, -2.1, KEPT, False, REJECTED, target_prob=0.31, draw=0.57),
)
SAMPLED = StepRecord(step=3, method="eagle2", prefix_len=9, nodes=NODES, accepted=(2,), bonus_token=15,
                     new_tokens=(12, 15), new_texts=(" the", " dog"), new_sources=("draft", "target"),
                     draft_ms=1.0, verify_ms=2.0, commit_ms=0.5,
                     residual_top=((15, " dog", 0.42), (16, " cow", 0.21), (17, " hen", 0.1)), bonus_prob=0.42)
GREEDY = replace(SAMPLED, residual_top=(), bonus_prob=None,
                 nodes=tuple(replace(n, target_prob=None, draw=None) for n in NODES))


def plain(text: str) -> str:
    return text


def hovers(fig) -> dict[object, list]:
    """Node id (or 'bonus') -> that mark's customdata."""
    return {c[0]: list(c) for t in fig.data if t.customdata is not None for c in t.customdata}


def test_each_sibling_says_its_numbers_in_the_order_they_were_tried():
    lines = step_sentences(SAMPLED, plain)
    assert lines[:3] == [
        "At the root x: target's probability of  a: 0.200; draw 0.500 ≥ 0.200 → rejected; its probability is set "
        "to 0 and the rest renormalised",
        "At the root x: target's probability of  the after rejecting  a: 0.600; draw 0.300 < 0.600 → accepted",
        "At  the: target's probability of  cat: 0.310; draw 0.570 ≥ 0.310 → rejected; its probability is set to 0 "
        "and the rest renormalised",
    ]
    assert len(lines) == 4 and "b" not in node_sentence(SAMPLED, NODES[3], plain)  # never tried: no sentence
    assert lines[3] == ("Every child of  the was rejected, so the bonus is drawn from the residual: the target's "
                        "distribution with  cat set to 0, renormalised. Its top tokens:  dog 0.420,  cow 0.210,  hen "
                        "0.100. Drawn:  dog (probability 0.420).")


def test_the_sign_comes_from_the_numbers_not_the_verdict():
    liar = replace(NODES[4], draw=0.1)  # below its probability, yet recorded as rejected
    assert "draw 0.100 < 0.310 → rejected" in node_sentence(SAMPLED, liar, plain)


def test_a_leaf_stop_draws_from_the_targets_own_distribution():
    leaf = replace(SAMPLED, nodes=NODES[:4])  # " the" has no child to try
    assert residual_sentence(leaf, plain).startswith(" the has no verified child to try, so the bonus is drawn from "
                                                     "the target's own distribution there.")


def test_tree_hover_shows_a_rejected_nodes_probability_draw_and_the_residual():
    h = hovers(tree_figure(SAMPLED))
    assert h[4][-1] == ("<br>target's probability of ␣cat: 0.310<br>draw 0.570 ≥ 0.310 → rejected<br>its "
                        "probability is set to 0 and the rest renormalised")
    assert "after rejecting ␣a: 0.600" in h[2][-1]
    assert "Its top tokens:<br>␣dog 0.420,<br>␣cow 0.210,<br>␣hen 0.100.<br>Drawn" in h[2][-1]  # one a line: narrow
    assert h[3][-1] == "" and h[0][-1] == ""  # never tried; the root decided nothing here
    assert "Drawn: ␣dog (probability 0.420)." in h["bonus"][-1]
    assert all(c[-1] == "" for c in hovers(tree_figure(GREEDY)).values())


def test_caption_and_unfold_verdict_tell_it_sibling_by_sibling_and_greedy_reads_as_before():
    caption = step_caption(SAMPLED)
    assert "**Sampling, sibling by sibling:**" in caption
    assert "- At “␣the”: target's probability of “␣cat”: 0.310; draw 0.570 ≥ 0.310 → rejected" in caption
    assert "Its top tokens: “␣dog” 0.420, “␣cow” 0.210, “␣hen” 0.100" in caption
    text = unfold_text(SAMPLED, "verdict")
    assert text.startswith("**Verdict (sampling).**") and "- At the root “x”: target's probability of “␣a”: 0.200" in text
    fig = hovers(unfold_figure(SAMPLED, "verdict"))
    assert "draw 0.570 ≥ 0.310 → rejected" in fig[4][-1] and fig[3][-1] == ""
    assert "Sampling" not in step_caption(GREEDY) and step_caption(GREEDY).startswith("Step 3: 4 drafted, 4 verified")
    assert unfold_text(GREEDY, "verdict").startswith("**Verdict.**")
