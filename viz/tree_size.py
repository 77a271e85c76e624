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

Priced with measured costs (this machine's profile, and every profile stored from another device, such as a
lent GPU's), the same replayed accept lengths project EAGLE-2's speedup over plain decoding at each size on a
second axis: τ(n) x verify(1) / (verify(n) + drafting(depth)). Those curves are dashed and named as
projections: the run ran here, once, at its own size.
"""
from __future__ import annotations

import plotly.graph_objects as go

from eagle2.decode.records import StepRecord, tau
from eagle2.tools.device_profiles import projected_label
from eagle2.tools.replay import size_curve
from eagle2.policies import policy
from eagle2.tools.serving import interpolate
from viz.colours import colour
from viz.costs import STORED_COLOURS
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
        return [], "no drafted steps yet"
    settings = meta.get("settings", {})
    if float(settings.get("temperature") or 0.0) > 0.0:
        return [], "the replay needs greedy decoding (temperature 0): a sampled verdict depends on its draw"
    if float(settings.get("min_prob") or 0.0) > 0.0 or float(settings.get("expand_prob") or 0.0) > 0.0:
        return [], "the replay needs a fixed-size tree: this run sized EAGLE-2's tree per step by confidence"
    if settings.get("lookup") or any(n.source != "draft" for r in steps["eagle2"] for n in r.nodes[1:]):
        return [], "the replay leaves out runs with the prompt-lookup branch (it is verified whatever its score)"
    curves = {m: size_curve(s, max(len(r.verified) for r in s), static=policy(s[0].method).static)
              for m, s in steps.items() if s}
    n_max = max(len(c) for c in curves.values())
    return [{"nodes": n, **{m: (curves[m][n - 1] if m in curves and n <= len(curves[m]) else None)
                            for m in steps}} for n in range(1, n_max + 1)], None


def projected_speedup(rows: list[dict], costs: dict, depth: int) -> list[tuple[int, float]]:
    """(nodes, EAGLE-2's projected speedup over plain decoding) for each replayed size within the profile's timed
    rows: the replayed τ over the step's cost in one-row steps (1 node: plain decoding itself, 1.0)."""
    verify = {int(k): float(v) for k, v in costs["verify_ms"].items()}
    draft = interpolate({int(k): float(v) for k, v in costs["rest_ms"].items()}, depth)
    return [(r["nodes"], 1.0 if r["nodes"] == 1 else
             r["eagle2"] * verify[1] / (interpolate(verify, r["nodes"]) + draft))
            for r in rows if r["eagle2"] is not None and r["nodes"] <= max(verify)]


def _projections(fig: go.Figure, rows: list[dict], depth: int, costs: dict | None, stored) -> None:
    """EAGLE-2's projected speedup by size on the right axis, one dotted curve per profile, drawn only when a
    stored profile is there to compare with (without one the chart is the replay alone, as it always was)."""
    if not stored:
        return
    priced = ([("projected from costs measured on this machine" +
                (f", {costs['measured']}" if costs.get("measured") else ""), costs, "#444444")]
              if costs and "1" in {str(k) for k in costs.get("verify_ms", {})} else [])
    priced += [(projected_label(p), p, STORED_COLOURS[i % len(STORED_COLOURS)]) for i, p in enumerate(stored)]
    for name, c, col in priced:
        pts = projected_speedup(rows, c, depth)
        fig.add_trace(go.Scatter(
            x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines", yaxis="y2",
            name=f"EAGLE-2 speedup {name}", line=dict(color=col, width=1.5, dash="dot"),
            hovertemplate=f"%{{x}} nodes: %{{y:.2f}}× plain decoding<extra>{name}</extra>"))
    if priced:
        fig.update_layout(yaxis2=dict(title=dict(text="projected speedup over plain decoding (dotted)"),
                                      overlaying="y", side="right", rangemode="tozero", showgrid=False),
                          margin=dict(r=60))


def _measured(records: list[StepRecord]) -> tuple[int, float] | None:
    """(verified nodes, mean accept length) of a run's drafted steps as it really ran."""
    steps = _drafted(records)
    if not steps:
        return None
    return max(len(r.verified) for r in steps), tau(steps)


def _how(grows: str, meta: dict, slot: str) -> tuple[str, str]:
    """A panel's replayed curve: its name (its own terms where the visitor picked its policy) and hover text."""
    label = (meta.get("settings", {}).get("panels", {}).get(slot) or {}).get("label")
    p = policy(grows)
    if p.static:
        static = meta.get("settings", {}).get("static_tree") or meta.get("static_tree") or "static tree"
        name, hover = f"EAGLE-1, replayed ({static} cut breadth first)", "its first %{x} nodes (root included)"
    elif p.chain:
        name, hover = "chain, replayed", "its first %{x} nodes (root included)"
    else:
        name, hover = "EAGLE-2, replayed", "the %{x} best nodes (root included)"
    return (f"{label}, replayed" if label else name), hover


def tree_size_figure(eagle2: list[StepRecord], meta: dict, eagle1: list[StepRecord] | None = None,
                     stored: list[dict] = ()) -> go.Figure:
    """Both tree kinds' replayed accept length for every smaller tree, with each run itself marked, and
    EAGLE-2's speedup projected from this machine's costs (`meta["costs"]`) and each `stored` profile's."""
    rows, why = tree_size_table(eagle2, meta, eagle1)
    if why:
        return note_figure(why, TITLE)
    fig = go.Figure()
    names = {}
    for m, records in (("eagle2", eagle2), ("eagle1", eagle1 or [])):
        pts = [(r["nodes"], r[m]) for r in rows if r[m] is not None]
        own = _measured(records)
        if not pts or own is None:
            continue
        grows = records[0].method  # what the panel grew: the replay follows its own kind of tree
        name, hover = _how(grows, meta, m)
        names[m] = name.split(",")[0]
        fig.add_trace(go.Scatter(
            x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines+markers", name=name,
            line=dict(color=colour(grows), width=2, dash="dash" if policy(grows).static else "solid"),
            marker=dict(size=5),
            hovertemplate=f"{hover}: τ %{{y:.2f}}<extra>{name}</extra>"))
        fig.add_trace(go.Scatter(
            x=[own[0]], y=[own[1]], mode="markers", name=f"{name.split(',')[0]} as run ({own[0]} nodes)",
            marker=dict(size=13, color=colour(m), symbol="circle-open", line=dict(width=2.5)),
            hovertemplate="as run: %{x} nodes, τ %{y:.2f}<extra></extra>"))
    top = [r for r in rows if r["eagle2"] is not None]
    enough = min(r["nodes"] for r in top if r["eagle2"] >= top[-1]["eagle2"] - 1e-9)
    if enough < top[-1]["nodes"]:
        fig.add_annotation(x=enough, y=top[enough - 1]["eagle2"], showarrow=True, arrowhead=2, ax=0, ay=40,
                           text=f"{names.get('eagle2', 'EAGLE-2')}: {enough} nodes already accept as much as "
                                f"{top[-1]['nodes']}",
                           font=dict(size=12, color="#333333"))
    fig.update_layout(
        template="none", title=dict(text=TITLE, x=0.01), margin=dict(l=60, r=10, t=40, b=60),
        xaxis=dict(title=dict(text="verified nodes per step (root included; 1 = plain decoding)"), rangemode="tozero"),
        yaxis=dict(title=dict(text="τ: tokens per drafted step (prefill not counted)"), rangemode="tozero"),
        legend=dict(x=0.99, y=0.01, xanchor="right", yanchor="bottom"),
    )
    depth = int(meta.get("settings", {}).get("depth") or 1)
    _projections(fig, rows, depth, meta.get("costs") or None, stored)
    return fig
