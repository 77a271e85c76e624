"""Accept length against tree size for one run, replayed from its own step records, for both tree kinds.

Every step records the nodes it drafted with their scores, and the target's choice after each node it
verified. Had an EAGLE-2 step kept only its n best nodes, the target would have accepted the part of its
recorded path among them (`eagle2.tools.replay`); an EAGLE-1 tree cut to its first n nodes (breadth first, as
its paths are listed) likewise. So one run tells what every smaller tree of either kind would have
accepted on the same steps, without decoding again: the gap between the two curves is what choosing the
tree per context buys at each node budget. Greedy runs only: a sampled verdict depends on the random
draw. Runs with the prompt-lookup branch are left out too, since that branch is verified whatever its score,
and runs whose tree was sized per step by confidence (`min_prob`, `expand_prob`), since their smaller trees are
not cuts of one fixed tree.
"""
from __future__ import annotations

import plotly.graph_objects as go

from eagle2.decode.records import StepRecord, tau
from eagle2.tools.replay import size_curve
from viz.colours import colour
from viz.empty import note_figure

TITLE = "Accept length by tree size, replayed from this run's steps"


def _drafted(records: list[StepRecord]) -> list[StepRecord]:
    return [r for r in records if r.nodes]


def tree_size_table(eagle2: list[StepRecord], meta: dict,
                    eagle1: list[StepRecord] | None = None) -> tuple[list[dict], str | None]:
    """Rows {nodes, eagle2, eagle1} (τ, or None past that run's own tree) for 1..the larger run's verified
    nodes, or no rows and the reason the replay does not apply."""
    steps = {"eagle2": _drafted(eagle2), "eagle1": _drafted(eagle1 or [])}
    if not steps["eagle2"]:
        return [], "no EAGLE-2 steps yet"
    settings = meta.get("settings", {})
    if float(settings.get("temperature") or 0.0) > 0.0:
        return [], "the replay needs greedy decoding (temperature 0): a sampled verdict depends on its draw"
    if float(settings.get("min_prob") or 0.0) > 0.0 or float(settings.get("expand_prob") or 0.0) > 0.0:
        return [], "the replay needs a fixed-size tree: this run sized EAGLE-2's tree per step by confidence"
    if settings.get("lookup") or any(n.source != "draft" for r in steps["eagle2"] for n in r.nodes[1:]):
        return [], "the replay leaves out runs with the prompt-lookup branch (it is verified whatever its score)"
    curves = {m: size_curve(s, max(len(r.verified) for r in s), static=m == "eagle1")
              for m, s in steps.items() if s}
    n_max = max(len(c) for c in curves.values())
    return [{"nodes": n, **{m: (curves[m][n - 1] if m in curves and n <= len(curves[m]) else None)
                            for m in ("eagle2", "eagle1")}} for n in range(1, n_max + 1)], None


def _measured(records: list[StepRecord]) -> tuple[int, float] | None:
    """(verified nodes, mean accept length) of a run's drafted steps as it really ran."""
    steps = _drafted(records)
    if not steps:
        return None
    return max(len(r.verified) for r in steps), tau(steps)


def tree_size_figure(eagle2: list[StepRecord], meta: dict, eagle1: list[StepRecord] | None = None) -> go.Figure:
    """Both tree kinds' replayed accept length for every smaller tree, with each run itself marked."""
    rows, why = tree_size_table(eagle2, meta, eagle1)
    if why:
        return note_figure(why, TITLE)
    fig = go.Figure()
    static = meta.get("static_tree") or "static tree"
    how = {"eagle2": ("EAGLE-2, replayed", "the %{x} best nodes (root included)"),
           "eagle1": (f"EAGLE-1, replayed ({static} cut breadth first)", "its first %{x} nodes (root included)")}
    for m, records in (("eagle2", eagle2), ("eagle1", eagle1 or [])):
        pts = [(r["nodes"], r[m]) for r in rows if r[m] is not None]
        own = _measured(records)
        if not pts or own is None:
            continue
        name, hover = how[m]
        fig.add_trace(go.Scatter(
            x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines+markers", name=name,
            line=dict(color=colour(m), width=2, dash="solid" if m == "eagle2" else "dash"), marker=dict(size=5),
            hovertemplate=f"{hover}: τ %{{y:.2f}}<extra>{name}</extra>"))
        fig.add_trace(go.Scatter(
            x=[own[0]], y=[own[1]], mode="markers", name=f"{name.split(',')[0]} as run ({own[0]} nodes)",
            marker=dict(size=13, color=colour(m), symbol="circle-open", line=dict(width=2.5)),
            hovertemplate="as run: %{x} nodes, τ %{y:.2f}<extra></extra>"))
    top = [r for r in rows if r["eagle2"] is not None]
    enough = min(r["nodes"] for r in top if r["eagle2"] >= top[-1]["eagle2"] - 1e-9)
    if enough < top[-1]["nodes"]:
        fig.add_annotation(x=enough, y=top[enough - 1]["eagle2"], showarrow=True, arrowhead=2, ax=0, ay=40,
                           text=f"EAGLE-2: {enough} nodes already accept as much as {top[-1]['nodes']}",
                           font=dict(size=12, color="#333333"))
    fig.update_layout(
        template="none", title=dict(text=TITLE, x=0.01), margin=dict(l=60, r=10, t=40, b=60),
        xaxis=dict(title=dict(text="verified nodes per step (root included; 1 = plain decoding)"), rangemode="tozero"),
        yaxis=dict(title=dict(text="τ: tokens per drafted step (prefill not counted)"), rangemode="tozero"),
        legend=dict(x=0.99, y=0.01, xanchor="right", yanchor="bottom"),
    )
    return fig
