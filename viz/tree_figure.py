"""One decoding step's draft tree as a Plotly figure, built from its StepRecord alone.

The root is the last committed token. Nodes are coloured by the draft's local probability on one
shared colour axis; the marks say what happened to each: accepted (green ring), rejected by the
target (red crossed circle), verified but never reached, or pruned / never expanded (faded). The
target's bonus token hangs below the accepted path as an orange star. Nodes on a prompt-lookup branch
get a purple diamond around them. Edges come as one line trace per class, because dash and colour are
per trace in Plotly.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from eagle2.decode.records import PRUNED, REJECTED, ROOT, UNEXPANDED, Node, StepRecord
from viz.empty import note_figure
from viz.labels import label_html, visible_text
from viz.layout import labels_with_room, tidy_layout
from viz.sampling import node_sentence, residual_lines, sampled, stop_node

_FADED = (PRUNED, UNEXPANDED)
# Above this many pruned nodes their labels overlap into a grey smear (top-k 10 over 6 levels drafts 510
# nodes), so they keep their marks and hover text but lose the label; kept nodes are always labelled. Below
# it a pruned node is labelled where its label clears its row's other labels (the most likely first).
PRUNED_LABELS_MAX = 60
# Width of each unlabelled pruned subtree (a labelled leaf takes 1): in a crowd of pruned nodes the kept
# ones would otherwise be squeezed until their own labels overlap.
PRUNED_SLOT = 0.12
_BONUS_COLOUR = "#ff7f0e"
_LOOKUP_COLOUR = "#7b3294"
_SOURCE = {"draft": "the draft's top-k", "lookup": "prompt lookup only", "both": "the draft and prompt lookup"}

# Node classes in legend order: (legend name, symbol, ring colour, ring width, opacity, text colour).
_NODE_STYLE: dict[str, tuple[str, str, str, float, float, str]] = {
    "root": ("root (last committed)", "square", "#111111", 2.0, 1.0, "#111111"),
    "accepted": ("accepted", "circle", "#1a9641", 4.0, 1.0, "#111111"),
    "rejected": ("rejected by target", "circle-x", "#d7191c", 2.5, 1.0, "#111111"),
    "verified": ("verified, not reached", "circle", "#444444", 1.0, 1.0, "#111111"),
    "pruned": ("pruned / never expanded", "circle", "#9e9e9e", 1.0, 0.35, "#9e9e9e"),
}
# Edge classes: (colour, width, dash); the class is that of the child node.
_EDGE_STYLE: dict[str, tuple[str, float, str]] = {
    "accepted": ("#1a9641", 4.0, "solid"),
    "verified": ("#666666", 1.5, "solid"),
    "pruned": ("#c8c8c8", 1.0, "dot"),
    "bonus": (_BONUS_COLOUR, 2.0, "dash"),
}
_HOVER = (
    "<b>%{customdata[1]}</b>  token %{customdata[2]}<br>"
    "p (local) %{customdata[3]:.3f}<br>"
    "score (cum. log-p) %{customdata[4]:.3f}<br>"
    "depth %{customdata[5]}, sibling rank %{customdata[6]}<br>"
    "status %{customdata[7]}, verdict %{customdata[8]}<br>"
    "target's next token: %{customdata[9]}<br>"
    "proposed by %{customdata[10]}%{customdata[11]}"
    "<extra>node %{customdata[0]}</extra>"
)


def node_class(node: Node, accepted: frozenset[int]) -> str:
    """Which mark a node gets: root, accepted, rejected, verified or pruned."""
    if node.status == ROOT:
        return "root"
    if node.status in _FADED:
        return "pruned"
    if node.id in accepted:
        return "accepted"
    if node.verdict == REJECTED:
        return "rejected"
    return "verified"


def bonus_entry(record: StepRecord) -> tuple[int, str] | None:
    """The bonus token and its text, or None when the step's output was cut before it (EOS/limit)."""
    for i in range(len(record.new_sources) - 1, -1, -1):
        if record.new_sources[i] == "target":
            return record.bonus_token, record.new_texts[i]
    return None


def _quote(text: str) -> str:
    """A token inside a hover sentence."""
    return label_html(text, 20)


def sampling_hover(record: StepRecord) -> dict[int, str]:
    """Per node id, hover lines with the numbers that decided it under sampling, and at the node where the path
    stopped the residual the bonus came from (empty for greedy records)."""
    if not sampled(record):
        return {}
    out = {n.id: "<br>" + node_sentence(record, n, _quote, sep="<br>") for n in record.nodes if n.draw is not None}
    bonus = bonus_entry(record)
    lines = residual_lines(record, _quote, bonus[1] if bonus else None)
    if lines:
        stop = stop_node(record).id
        out[stop] = out.get(stop, "") + "<br><b>the bonus came from here</b><br>" + "<br>".join(lines)
    return out


def _customdata(node: Node, unscored: frozenset[int] = frozenset(), why: str = "") -> list:
    target = "—"
    if node.target_token is not None:
        shown = label_html(node.target_text, 40) if node.target_text is not None else "?"
        target = f"{shown} ({node.target_token})"
    return [node.id, label_html(node.text, 40), node.token, node.prob, node.score,
            node.depth, node.rank, node.status, node.verdict or "—", target,
            _SOURCE.get(node.source, node.source) + (" (past the drafted levels: p not scored)" if node.id in unscored
                                                     else ""), why]


def _edge_trace(cls: str, segments: list[tuple[tuple[float, float], tuple[float, float]]]) -> go.Scatter:
    colour, width, dash = _EDGE_STYLE[cls]
    xs: list[float | None] = []
    ys: list[float | None] = []
    for (x0, y0), (x1, y1) in segments:
        xs += [x0, x1, None]  # None breaks the line, so one trace draws many edges
        ys += [y0, y1, None]
    return go.Scatter(
        x=xs, y=ys, mode="lines", line=dict(color=colour, width=width, dash=dash),
        hoverinfo="skip", showlegend=False, legendgroup=cls, meta={"edges": cls},
    )


def labels_that_fit(pos: dict[int, tuple[float, float]], nodes: list[Node], always: list[int],
                    optional: list[Node], extra: dict[int, str] | None = None) -> set[int]:
    """Ids of the marks to label: `always`, then those of `optional` whose labels clear their row's others, the
    likeliest first (`labels_with_room`). `nodes`: every drawn node; `extra`: other labelled marks (the bonus
    star) by id, with their text."""
    extra = extra or {}
    texts = {n.id: visible_text(n.text, 8) for n in nodes}
    texts.update({i: visible_text(t, 8) for i, t in extra.items()})
    ranked = sorted(optional, key=lambda n: (-n.prob, n.depth, n.rank))
    return labels_with_room(pos, texts, [*always, *extra], [n.id for n in ranked])


def pruned_labels(nodes: list[Node], pos: dict[int, tuple[float, float]], pruned: list[Node],
                  extra: dict[int, str] | None = None) -> set[int]:
    """The pruned nodes whose labels fit beside the kept ones' (`labels_that_fit`); none in a crowd."""
    if len(pruned) > PRUNED_LABELS_MAX:
        return set()
    return labels_that_fit(pos, nodes, [n.id for n in nodes if n.status not in _FADED], pruned, extra)


def _node_trace(cls: str, nodes: list[Node], pos: dict[int, tuple[float, float]],
                unscored: frozenset[int] = frozenset(), labelled_ids: set[int] | None = None,
                why: dict[int, str] | None = None) -> go.Scatter:
    """One class's marks; `labelled_ids`: which of them get a label (None: all); `why`: extra hover lines by id."""
    name, symbol, ring, ring_w, opacity, text_colour = _NODE_STYLE[cls]
    labels = [label_html(n.text, 8) if labelled_ids is None or n.id in labelled_ids else "" for n in nodes]
    labelled = any(labels)
    return go.Scatter(
        x=[pos[n.id][0] for n in nodes], y=[pos[n.id][1] for n in nodes],
        mode="markers+text" if labelled else "markers", name=name, legendgroup=cls, meta={"nodes": cls},
        text=labels if labelled else None, textposition="bottom center",
        textfont=dict(size=11, color=text_colour),
        marker=dict(
            size=18 if cls == "root" else 15, symbol=symbol, opacity=opacity,
            color=[n.prob for n in nodes], coloraxis="coloraxis",
            line=dict(color=ring, width=ring_w),
        ),
        customdata=[_customdata(n, unscored, (why or {}).get(n.id, "")) for n in nodes], hovertemplate=_HOVER,
    )


def _lookup_trace(nodes: list[Node], pos: dict[int, tuple[float, float]]) -> go.Scatter:
    """A diamond around each node that prompt lookup proposed (alone or with the draft)."""
    return go.Scatter(
        x=[pos[n.id][0] for n in nodes], y=[pos[n.id][1] for n in nodes], mode="markers",
        name="prompt-lookup branch", legendgroup="lookup", meta={"overlay": "lookup", "ids": [n.id for n in nodes]},
        marker=dict(size=27, symbol="diamond-open", color=_LOOKUP_COLOUR, line=dict(width=2)),
        hoverinfo="skip",
    )


def _bonus_trace(token: int, text: str, xy: tuple[float, float], drawn: str = "") -> go.Scatter:
    return go.Scatter(
        x=[xy[0]], y=[xy[1]], mode="markers+text", name="bonus (target's token)",
        legendgroup="bonus", meta={"nodes": "bonus"},
        text=[label_html(text, 8)], textposition="bottom center",
        textfont=dict(size=11, color="#a04000"),
        marker=dict(size=22, symbol="star", color=_BONUS_COLOUR, line=dict(color="#a04000", width=1.5)),
        customdata=[["bonus", label_html(text, 40), token, drawn]],
        hovertemplate="<b>%{customdata[1]}</b>  token %{customdata[2]}<br>"
                      "bonus: the target's own token after the accepted path%{customdata[3]}<extra>bonus</extra>",
    )


def _base_layout(fig: go.Figure, title: str) -> None:
    fig.update_layout(
        template="none", title=dict(text=title, x=0.01, font=dict(size=14)),
        margin=dict(l=10, r=10, t=40 if title else 10, b=10),
        xaxis=dict(visible=False), yaxis=dict(visible=False),
        hovermode="closest", plot_bgcolor="white",
    )


def _empty_figure(record: StepRecord, title: str) -> go.Figure:
    what = "prefill: no draft tree" if record.step == 0 else "plain decoding: one token per forward"
    produced = "".join(record.new_texts)
    note = f"{what}<br>the target produced “{label_html(produced, 30)}”" if record.new_texts else what
    return note_figure(note, title, size=15)


def _auto_title(record: StepRecord, bonus: bool, dropped: int = 0) -> str:
    drafted = len(record.nodes) - 1 + dropped
    verified = len(record.verified) - 1
    plus = " + bonus" if bonus else ""
    gone = f" ({dropped} pruned not kept)" if dropped else ""
    return (f"{record.method} · step {record.step}: {len(record.accepted)} accepted{plus} "
            f"· {verified} verified of {drafted} drafted{gone}")


def tree_figure(record: StepRecord, title: str = "", show_pruned: bool = True, dropped: int = 0) -> go.Figure:
    """Draw one step's draft tree; an empty title gets a one-line summary of the step. `dropped`: pruned or
    never-expanded nodes this record no longer holds (a session bounds its size), counted in the title."""
    bonus = bonus_entry(record)
    if not record.nodes:
        return _empty_figure(record, title or f"{record.method} · step {record.step}")
    accepted = frozenset(record.accepted)
    shown = [n for n in record.nodes if show_pruned or n.status not in _FADED]
    shown_ids = {n.id for n in shown}
    root = record.nodes[0]

    pairs = [(n.id, n.parent) for n in shown]
    rank: dict[int, float] = {n.id: float(n.rank) for n in shown}
    bonus_id = max(shown_ids) + 1
    bonus_parent = record.accepted[-1] if record.accepted else root.id
    if bonus_parent not in shown_ids:
        bonus_parent = root.id  # a malformed record must not crash the viewer
    if bonus is not None:
        pairs.append((bonus_id, bonus_parent))
        rank[bonus_id] = math.inf  # rightmost under its parent, clear of the rejected siblings
    faded = [n.id for n in shown if n.status in _FADED]
    pos = tidy_layout(pairs, rank, {i: PRUNED_SLOT for i in faded} if len(faded) > PRUNED_LABELS_MAX else None)

    by_class: dict[str, list[Node]] = {cls: [] for cls in _NODE_STYLE}
    edges: dict[str, list] = {cls: [] for cls in _EDGE_STYLE}
    for n in shown:
        cls = node_class(n, accepted)
        by_class[cls].append(n)
        if cls != "root" and n.parent in shown_ids:
            edges[cls if cls != "rejected" else "verified"].append((pos[n.parent], pos[n.id]))
    if bonus is not None:
        edges["bonus"].append((pos[bonus_parent], pos[bonus_id]))

    fig = go.Figure()
    # Edges first so nodes paint over them.
    for cls, segs in edges.items():
        if segs:
            fig.add_trace(_edge_trace(cls, segs))
    unscored = frozenset(n.id for n in record.nodes[1:] if not record.scored(n))
    why = sampling_hover(record)
    room = pruned_labels(shown, pos, by_class["pruned"], {bonus_id: bonus[1]} if bonus is not None else None)
    for cls, nodes in by_class.items():
        if nodes:
            fig.add_trace(_node_trace(cls, nodes, pos, unscored, room if cls == "pruned" else None, why))
    looked = [n for n in shown if n.source != "draft"]
    if looked:
        fig.add_trace(_lookup_trace(looked, pos))
    if bonus is not None:
        drawn = residual_lines(record, _quote, bonus[1])
        fig.add_trace(_bonus_trace(bonus[0], bonus[1], pos[bonus_id], "<br>" + "<br>".join(drawn) if drawn else ""))

    _base_layout(fig, title or _auto_title(record, bonus is not None, dropped))
    xs = [p[0] for p in pos.values()]
    low = min(p[1] for p in pos.values())
    fig.update_layout(
        coloraxis=dict(colorscale="Viridis", cmin=0.0, cmax=1.0,
                       colorbar=dict(title=dict(text="draft p"), thickness=12, len=0.6)),
        # Room for the labels under the bottom row and beside the outermost leaves.
        xaxis=dict(visible=False, range=[min(xs) - 0.8, max(xs) + 0.8]),
        yaxis=dict(visible=False, range=[low - 0.7, 0.4]),
        legend=dict(orientation="h", x=0.0, y=-0.02, yanchor="top", itemsizing="constant",
                    font=dict(size=11)),
        margin=dict(b=40),
    )
    return fig
