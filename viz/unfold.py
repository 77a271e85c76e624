"""Unfold one step: replay how EAGLE-2 built its draft tree, level by level, then the rerank and the verdict,
from the step's record alone (a loaded trace too). An EAGLE-1 record unfolds in the same frames, its fixed
shape level by level, for contrast. One layout of the whole record places the nodes in every frame, so they
stay put from frame to frame; the colour is the draft's local probability on the tree figure's colour axis.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import plotly.graph_objects as go

from eagle2.decode.records import KEPT, PRUNED, REJECTED, ROOT, UNEXPANDED, Node, StepRecord
from eagle2.policies import policy
from viz.empty import note_figure
from viz.labels import counted, label_html, label_md
from viz.layout import tidy_layout
from viz.sampling import node_sentence, sampled, step_sentences
from viz.tree_figure import PRUNED_LABELS_MAX, PRUNED_SLOT, bonus_entry, labels_that_fit, node_class

_FADED = (PRUNED, UNEXPANDED)
# Node classes: (legend name, symbol, ring colour, ring width, opacity, size).
_STYLE: dict[str, tuple[str, str, str, float, float, int]] = {
    "root": ("root (last committed)", "square", "#111111", 2.0, 1.0, 18),
    "expanding": ("expanded at this level", "circle", "#ff7f0e", 4.0, 1.0, 17),
    "new": ("drafted at this level", "circle", "#111111", 2.5, 1.0, 17),
    "skipped": ("top-k, skipped: cannot be kept", "circle-x", "#d7191c", 2.0, 0.8, 15),
    "drafted": ("drafted", "circle", "#444444", 1.0, 0.85, 14),
    "faded": ("not expanded", "circle", "#9e9e9e", 1.0, 0.35, 13),
    "kept": ("kept (verified)", "circle", "#111111", 2.0, 1.0, 15),
    "pruned": ("pruned at the rerank", "circle", "#9e9e9e", 1.0, 0.35, 13),
    "accepted": ("accepted", "circle", "#1a9641", 4.0, 1.0, 16),
    "rejected": ("rejected by target", "circle-x", "#d7191c", 2.5, 1.0, 15),
    "verified": ("verified, not reached", "circle", "#444444", 1.0, 1.0, 14),
}
# Edge style by the child's class: (colour, width, dash).
_EDGE = {"new": ("#333333", 2.5, "solid"), "faded": ("#c8c8c8", 1.0, "dot"), "pruned": ("#c8c8c8", 1.0, "dot"),
         "skipped": ("#c8c8c8", 1.0, "dot"), "accepted": ("#1a9641", 4.0, "solid")}
_EDGE_DEFAULT = ("#888888", 1.5, "solid")
# Classes whose marks are always labelled (what a frame is about: the expanded and the skipped, the verdict); the
# others (a level's many drafts, the faded and pruned) only where their label clears the row's other labels, the
# most likely first.
_LABEL_ALWAYS = ("root", "expanding", "skipped", "kept", "accepted", "rejected", "verified")
_HOVER = ("<b>%{customdata[1]}</b>  token %{customdata[2]}<br>p (local) %{customdata[3]:.3f}<br>"
          "score (cum. log-p) %{customdata[4]:.3f}<br>depth %{customdata[5]}, sibling rank %{customdata[6]}<br>"
          "status %{customdata[7]}%{customdata[8]}<extra>node %{customdata[0]}</extra>")


@dataclass(frozen=True)
class Stage:
    """One frame of the unfolding: its name, a one-line title and a markdown explanation."""

    name: str
    title: str
    text: str


def _p(score: float) -> str:
    """A cumulative probability exp(score), readable at any size."""
    p = math.exp(score)
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _nth(k: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _levels(record: StepRecord | None) -> int:
    """The record's depth: its deepest node's depth (0 without a tree)."""
    return max((n.depth for n in record.nodes), default=0) if record is not None else 0


def stage_names(dynamic: StepRecord | None, static: StepRecord | None) -> list[str]:
    """The frames of both records together, in order: root, level 1..deepest of the two, rerank, verdict."""
    deep = max(_levels(dynamic), _levels(static))
    return ["root", *(f"level {d}" for d in range(1, deep + 1)), "rerank", "verdict"]


def _parse(stage: str) -> tuple[str, int]:
    """("root"|"level"|"rerank"|"verdict", level number); ValueError on any other name."""
    if stage in ("root", "rerank", "verdict"):
        return stage, 0
    m = re.fullmatch(r"level ([1-9]\d*)", stage) if isinstance(stage, str) else None
    if m is None:
        raise ValueError(f"unknown stage {stage!r}: expected 'root', 'level N' (N >= 1), 'rerank' or 'verdict'")
    return "level", int(m.group(1))


class _Tree:
    """What the frames need from one record, worked out once."""

    def __init__(self, record: StepRecord, total_tokens: int | None) -> None:
        self.r = record
        self.static = policy(record.method).static
        self.chain = policy(record.method).chain  # one node a level, the draft's top-1; no rerank
        self.depth = _levels(record)
        self.kids: dict[int, list[Node]] = {n.id: [] for n in record.nodes}
        for n in record.nodes:
            if n.parent in self.kids and n.parent != n.id:
                self.kids[n.parent].append(n)
        for ks in self.kids.values():
            ks.sort(key=lambda n: n.rank)
        grown = [n for n in record.nodes if n.expanded]
        self.k = max((sum(c.source != "lookup" for c in self.kids[n.id]) for n in grown), default=0)
        self.kept = [n for n in record.nodes if n.status == KEPT]
        self.faded = [n for n in record.nodes if n.status in _FADED]
        # A session that bounds its memory drops pruned nodes: an expanded node then lacks some of its k children.
        self.lost = (not self.static and not self.faded
                     and any(sum(c.source != "lookup" for c in self.kids[n.id]) < self.k for n in grown))
        self.total = total_tokens if total_tokens else len(self.kept) + 1

    def at(self, d: int) -> list[Node]:
        """Nodes of depth d, best score first."""
        return sorted((n for n in self.r.nodes if n.depth == d), key=lambda n: -n.score)

    def skipped(self, d: int) -> list[Node]:
        """Depth d-1 nodes among the level's top-k by score that were not expanded (EAGLE-2's early cut)."""
        if self.static or self.lost or d < 2:
            return []
        return [n for n in self.at(d - 1)[:self.k] if not n.expanded]

    def cutoff(self, d: int) -> float:
        """The (total_tokens-1)-th best score drafted before level d (rerank.cutoff); -inf while fewer."""
        pool = sorted((n.score for n in self.r.nodes if 1 <= n.depth < d), reverse=True)
        keep = self.total - 1
        return pool[keep - 1] if keep >= 1 and len(pool) >= keep else -math.inf


def _drafted(t: _Tree, n: Node) -> str:
    """One expanded node's line: its score and what it drafted."""
    kids = "; ".join(f"{label_md(c.text)} p {c.prob:.3f} score {c.score:.2f}" for c in t.kids[n.id]) or "nothing kept"
    return f"- **{label_md(n.text)}** score {n.score:.2f} (cum. p {_p(n.score)}) drafted: {kids}"


def _root_text(t: _Tree) -> str:
    root, kids = t.r.nodes[0], t.kids[t.r.nodes[0].id]
    how = (f"the {len(kids)} children the fixed shape gives the root" if t.static
           else f"its top-{t.k} next tokens")
    listed = ", ".join(f"{label_md(c.text)} (p {c.prob:.3f})" for c in kids)
    lost = " Pruned nodes were not kept for this step, so only the kept ones are listed." if t.lost else ""
    return (f"**Root.** The last committed token {label_md(root.text)} (token {root.token}) is where this step's "
            f"tree hangs. The draft head reads the target's feature for it and drafts {how}: {listed}.{lost}")


def _level_text(t: _Tree, d: int) -> str:
    if d > t.depth:
        return (f"**No more levels: this tree is {counted(t.depth, 'level')} deep.** "
                f"All {counted(len(t.r.nodes) - 1, 'drafted node')} are shown.")
    grown = [n for n in t.at(d - 1) if n.expanded]
    new = t.at(d)
    head = f"**Level {d} of {t.depth}.** "
    if t.chain:
        head += (f"A chain drafts one token a level: the draft's top-1 after {_md(grown[0].text) if grown else 'it'}"
                 f" ({counted(len(new), 'new node')}). No other candidate is drafted, so a miss ends the step.")
        stopped = [n for n in new if n.status != KEPT]
        if stopped:
            head += (f" {_md(stopped[0].text)} has draft probability {stopped[0].prob:.3f}, below the chain's p_min: "
                     "drafting stops here and it is not verified (llama.cpp's --spec-draft-p-min).")
        return head
    if t.static:
        head += (f"EAGLE-1's tree has a fixed shape, chosen offline: every node of depth {d - 1} that has children "
                 f"in the shape is expanded, and no score decides it. At this level the shape drafts "
                 f"{counted(len(new), 'node')} under {counted(len(grown), 'parent')}, whatever the draft's confidence.")
    elif d == 1:
        head += f"The root is expanded: the draft proposes its top-{t.k} tokens, {counted(len(new), 'new node')}."
    else:
        head += (f"The frontier is the {len(t.at(d - 1))} nodes of depth {d - 1}. EAGLE-2 ranks them by cumulative "
                 f"score (the log-probability of the whole path) and expands the top-{t.k}; {len(grown)} expanded, "
                 f"{len(new)} new nodes.")
    lines = [head, ""] + [_drafted(t, n) for n in grown]
    top = {n.id for n in t.at(d - 1)[:t.k]}
    for n in grown:
        if not t.static and d > 1 and n.id not in top and not t.lost:
            lines.append(f"- {label_md(n.text)} is not in the top-{t.k}: it was expanded as the prompt-lookup branch, "
                         "which grows with its level whatever its score")
    cut = t.cutoff(d)
    for n in t.skipped(d):
        why = (f"at or below the {_nth(t.total - 1)} best score drafted so far ({cut:.2f}), so nothing under it could "
               "be kept" if n.score <= cut else "below the expand floor (confidence sizing)")
        lines.append(f"- skipped {label_md(n.text)} score {n.score:.2f} (cum. p {_p(n.score)}): {why}")
    if t.lost and not t.static:
        lines.append("\nPruned nodes were not kept for this step (the session bounds its memory): only the kept "
                     "nodes are shown, so the frontier is incomplete.")
    return "\n".join(lines)


def _rerank_text(t: _Tree) -> str:
    pool = t.r.nodes[1:]
    if t.chain:
        return (f"**No rerank.** A chain verifies the {counted(len(t.kept), 'token')} it kept, in order: there is "
                "nothing to choose between.")
    if t.static:
        low = min(n.score for n in pool)
        return (f"**No rerank.** EAGLE-1 verifies every node of its fixed shape: all {len(pool)} drafted nodes go "
                f"to the target whatever their scores (the lowest is {low:.2f}, cum. p {_p(low)}).")
    low = min((n.score for n in t.kept), default=math.nan)
    text = (f"**Rerank.** After {t.depth} levels the pool holds {len(pool)} drafted nodes. EAGLE-2 ranks them all "
            f"by score and keeps the best total_tokens − 1 = {t.total - 1}: {len(t.kept)} kept, "
            f"{len(t.faded)} pruned. Lowest kept score {low:.2f} (cum. p {_p(low)})")
    if t.faded:
        high = max(n.score for n in t.faded)
        text += f"; highest pruned score {high:.2f} (cum. p {_p(high)}): the cut lies between them."
    elif t.lost:
        text += (". Pruned nodes were not kept for this step (the session bounds its memory), so the highest "
                 "pruned score is not known.")
    else:
        text += "; nothing was pruned."
    return text + (" A kept set is always connected: scores never rise along a path (each token adds a "
                   "log-probability ≤ 0), so a kept node's parent scores at least as high and is kept too.")


def _verdict_text(t: _Tree) -> str:
    r = t.r
    by_id = {n.id: n for n in r.nodes}
    path = [by_id[i] for i in r.accepted if i in by_id]
    last = path[-1] if path else r.nodes[0]
    said = (f"Accepted path: {' → '.join(label_md(n.text) for n in path)} ({counted(len(path), 'drafted token')})."
            if path else "No drafted token was accepted.")
    rejected = [c for c in t.kids[last.id] if c.verdict == REJECTED]
    bonus = bonus_entry(r)
    if sampled(r):  # sampling: the recorded numbers, sibling by sibling, say why (see viz/sampling.py)
        steps = "\n".join(f"- {s}" for s in step_sentences(r, label_md, bonus[1] if bonus else None))
        cut = "" if bonus else "The output ended (end of text or the token limit) before the bonus. "
        return (f"**Verdict (sampling).** The target checks the {len(r.verified)} kept nodes (root included) in one "
                f"forward, then tries each accepted node's children in turn against its residual distribution: a "
                f"child is accepted when a uniform draw falls below the residual's probability of its token. {said}"
                f"\n\n{steps}\n\n{cut}The output is distributed exactly as the target's own sampling would give "
                f"it. This step committed {counted(len(r.new_tokens), 'new token')}.")
    if rejected:
        wanted = label_md(last.target_text) if last.target_text is not None else "another token"
        said += f" First rejected: {label_md(rejected[0].text)} (p {rejected[0].prob:.3f}); the target wanted {wanted}."
    said += (f" Bonus token: {label_md(bonus[1])}, the target's own." if bonus
             else " The output ended (end of text or the token limit) before a bonus token.")
    return (f"**Verdict.** The target checks the {len(r.verified)} kept nodes (root included) in one forward. "
            f"{said} This step committed {counted(len(r.new_tokens), 'new token')}.")


def _why(record: StepRecord, node: Node) -> str:
    """A hover line: the numbers that decided a node under sampling ('' otherwise)."""
    said = node_sentence(record, node, lambda text: label_html(text, 20), sep="<br>")
    return f"<br>{said}" if said else ""


def _label(record: StepRecord | None, method_label: str) -> str:
    return method_label or (record.method if record is not None else "")


def _title(record: StepRecord, name: str, label: str, depth: int) -> str:
    kind, d = _parse(name)
    what = name if kind != "level" else (f"level {d} of {depth}" if d <= depth else f"level {d} (tree is {depth} deep)")
    return f"{label} · step {record.step} · {what}"


def _no_tree(record: StepRecord | None) -> str:
    if record is None:
        return "There is no tree at this step: no step is recorded here."
    what = "the prefill" if record.step == 0 else "plain decoding, one token per forward"
    return f"There is no tree at this step ({what})."


def stages(record: StepRecord, total_tokens: int | None = None) -> list[Stage]:
    """Every frame of one record, root to verdict, with its title and text."""
    return [Stage(n, _title(record, n, record.method, _levels(record)) if record is not None else n,
                  unfold_text(record, n, total_tokens=total_tokens)) for n in stage_names(record, None)]


def unfold_text(record: StepRecord | None, stage: str, method_label: str = "",
                total_tokens: int | None = None) -> str:
    """The markdown for one frame; `method_label` is unused in the text and kept for symmetry with the figure."""
    kind, d = _parse(stage)
    if record is None or not record.nodes:
        return _no_tree(record)
    t = _Tree(record, total_tokens)
    if kind == "root":
        return _root_text(t)
    if kind == "level":
        return _level_text(t, d)
    return _rerank_text(t) if kind == "rerank" else _verdict_text(t)


def _layout(record: StepRecord) -> tuple[dict[int, tuple[float, float]], int]:
    """Positions of every node plus the bonus slot (its id returned): the same for every frame of the step."""
    pairs = [(n.id, n.parent) for n in record.nodes]
    rank: dict[int, float] = {n.id: float(n.rank) for n in record.nodes}
    ids = {n.id for n in record.nodes}
    bonus_id = max(ids) + 1
    parent = record.accepted[-1] if record.accepted and record.accepted[-1] in ids else record.nodes[0].id
    pairs.append((bonus_id, parent))
    rank[bonus_id] = math.inf
    faded = [n.id for n in record.nodes if n.status in _FADED]
    width = {i: PRUNED_SLOT for i in faded} if len(faded) > PRUNED_LABELS_MAX else None
    return tidy_layout(pairs, rank, width), bonus_id


def _classes(t: _Tree, kind: str, d: int) -> dict[int, str]:
    """Which class each shown node gets in this frame (absent: not shown)."""
    r = t.r
    if kind == "root":
        return {r.nodes[0].id: "expanding"}
    if kind == "rerank":
        return {n.id: "root" if n.status == ROOT else "kept" if n.status == KEPT else "pruned" for n in r.nodes}
    if kind == "verdict":
        acc = frozenset(r.accepted)
        return {n.id: node_class(n, acc) for n in r.nodes if n.status not in _FADED}
    if d > t.depth:
        return {n.id: "root" if n.status == ROOT else "drafted" for n in r.nodes}
    skipped = {n.id for n in t.skipped(d)}
    out: dict[int, str] = {}
    for n in r.nodes:
        if n.depth > d:
            continue
        if n.depth == d:
            out[n.id] = "new"
        elif n.depth == d - 1:
            out[n.id] = "expanding" if n.expanded else "skipped" if n.id in skipped else "faded"
        else:
            out[n.id] = ("root" if n.status == ROOT else "drafted") if n.expanded else "faded"
    return out


def _labelled(groups: dict[str, list[Node]], pos: dict[int, tuple[float, float]], extra: dict[int, str],
              crowd: bool) -> set[int]:
    """Which marks of a frame get a label (`_LABEL_ALWAYS`, then the rest where there is room; in a crowd the
    faded and pruned get none). `extra`: other labelled marks (the bonus star) by id, with their text."""
    always = [n.id for c in _LABEL_ALWAYS for n in groups.get(c, [])]
    rest = [n for c, nodes in groups.items() if c not in _LABEL_ALWAYS and not (crowd and c in ("faded", "pruned"))
            for n in nodes]
    return labels_that_fit(pos, [n for nodes in groups.values() for n in nodes], always, rest, extra)


def unfold_figure(record: StepRecord | None, stage: str, method_label: str = "") -> go.Figure:
    """The tree as it stood at one frame: nodes by what happened to them there, coloured by draft p."""
    kind, d = _parse(stage)
    label = _label(record, method_label)
    if record is None or not record.nodes:
        head = f"{label} · step {record.step}" if record is not None else f"{label} · no step"
        return note_figure(_no_tree(record).replace("There is no", "no").rstrip("."), head.strip(" ·"), size=15)
    t = _Tree(record, None)
    pos, bonus_id = _layout(record)
    cls = _classes(t, kind, d)
    by_id = {n.id: n for n in record.nodes}
    groups: dict[str, list[Node]] = {}
    edges: dict[tuple[str, float, str], tuple[list, list]] = {}
    for i, c in cls.items():
        n = by_id[i]
        groups.setdefault(c, []).append(n)
        if n.parent in cls:
            xs, ys = edges.setdefault(_EDGE.get(c, _EDGE_DEFAULT), ([], []))
            xs += [pos[n.parent][0], pos[i][0], None]
            ys += [pos[n.parent][1], pos[i][1], None]
    bonus = bonus_entry(record) if kind == "verdict" else None
    if bonus is not None:
        parent = record.accepted[-1] if record.accepted and record.accepted[-1] in cls else record.nodes[0].id
        xs, ys = edges.setdefault(("#ff7f0e", 2.0, "dash"), ([], []))
        xs += [pos[parent][0], pos[bonus_id][0], None]
        ys += [pos[parent][1], pos[bonus_id][1], None]
    traces: list[go.Scatter] = [
        go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=c, width=w, dash=dash), hoverinfo="skip",
                   showlegend=False, meta={"edges": dash}) for (c, w, dash), (xs, ys) in edges.items()]
    crowd = len(cls) > 2 * PRUNED_LABELS_MAX
    room = _labelled(groups, pos, {bonus_id: bonus[1]} if bonus is not None else {}, crowd)
    for c in _STYLE:
        nodes = groups.get(c)
        if not nodes:
            continue
        name, symbol, ring, ring_w, opacity, size = _STYLE[c]
        labels = [label_html(n.text, 8) if n.id in room else "" for n in nodes]
        labelled = any(labels)
        traces.append(go.Scatter(
            x=[pos[n.id][0] for n in nodes], y=[pos[n.id][1] for n in nodes],
            mode="markers+text" if labelled else "markers", name=name, meta={"nodes": c},
            text=labels if labelled else None, textposition="bottom center",
            textfont=dict(size=11, color="#9e9e9e" if opacity < 0.5 else "#111111"),
            marker=dict(size=size, symbol=symbol, opacity=opacity, color=[n.prob for n in nodes],
                        coloraxis="coloraxis", line=dict(color=ring, width=ring_w)),
            customdata=[[n.id, label_html(n.text, 40), n.token, n.prob, n.score, n.depth, n.rank, n.status,
                         _why(record, n) if kind == "verdict" else ""] for n in nodes], hovertemplate=_HOVER))
    if bonus is not None:
        traces.append(go.Scatter(
            x=[pos[bonus_id][0]], y=[pos[bonus_id][1]], mode="markers+text", name="bonus (target's token)",
            meta={"nodes": "bonus"}, text=[label_html(bonus[1], 8)], textposition="bottom center",
            marker=dict(size=22, symbol="star", color="#ff7f0e", line=dict(color="#a04000", width=1.5)),
            hovertemplate=f"<b>{label_html(bonus[1], 40)}</b>  token {bonus[0]}<br>bonus: the target's own token"
                          "<extra>bonus</extra>"))
    xs_all = [p[0] for p in pos.values()]
    low = min(p[1] for p in pos.values())
    fig = go.Figure(data=traces)
    fig.update_layout(
        template="none", title=dict(text=_title(record, stage, label, t.depth), x=0.01, font=dict(size=14)),
        margin=dict(l=10, r=10, t=40, b=40), hovermode="closest", plot_bgcolor="white",
        xaxis=dict(visible=False, range=[min(xs_all) - 0.8, max(xs_all) + 0.8]),
        yaxis=dict(visible=False, range=[low - 0.7, 0.4]),
        coloraxis=dict(colorscale="Viridis", cmin=0.0, cmax=1.0,
                       colorbar=dict(title=dict(text="draft p"), thickness=12, len=0.6)),
        legend=dict(orientation="h", x=0.0, y=-0.02, yanchor="top", itemsizing="constant", font=dict(size=11)),
    )
    return fig
