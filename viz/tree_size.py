"""Accept length against tree size for one run, replayed from its own EAGLE-2 step records.

Every step records all the nodes EAGLE-2 drafted with their scores, and the target's choice after each
node it verified. Had the step kept only its n best nodes, the target would have accepted the part of its
recorded path among them (`eagle2.replay`): so one run at n nodes tells what every smaller tree at the
same depth would have accepted on the same steps, without decoding again. Greedy runs only: a sampled
verdict depends on the random draw. Runs with the prompt-lookup branch are left out too, since that
branch is always verified whatever its score.
"""
from __future__ import annotations

import plotly.graph_objects as go

from eagle2.records import StepRecord
from eagle2.replay import size_curve

TITLE = "Accept length by tree size, replayed from this run's EAGLE-2 steps"


def tree_size_table(eagle2: list[StepRecord], meta: dict) -> tuple[list[dict], str | None]:
    """Rows {nodes, tau} for 1..the run's verified nodes, or no rows and the reason the replay does not apply."""
    steps = [r for r in eagle2 if r.nodes]
    if not steps:
        return [], "no EAGLE-2 steps yet"
    if float(meta.get("temperature") or 0.0) > 0.0:
        return [], "the replay needs greedy decoding (temperature 0): a sampled verdict depends on its draw"
    if meta.get("lookup") or any(n.source != "draft" for r in steps for n in r.nodes[1:]):
        return [], "the replay leaves out runs with the prompt-lookup branch (it is verified whatever its score)"
    n_max = max(len(r.verified) for r in steps)
    return [{"nodes": n, "tau": t} for n, t in enumerate(size_curve(steps, n_max), start=1)], None


def _measured(records: list[StepRecord]) -> tuple[int, float] | None:
    """(verified nodes, mean accept length) of a run's drafted steps as it really ran."""
    steps = [r for r in records if r.nodes]
    if not steps:
        return None
    return max(len(r.verified) for r in steps), sum(len(r.accepted) + 1 for r in steps) / len(steps)


def tree_size_figure(eagle2: list[StepRecord], meta: dict, eagle1: list[StepRecord] | None = None) -> go.Figure:
    """EAGLE-2's replayed accept length for every smaller tree, with the run itself and EAGLE-1 marked."""
    rows, why = tree_size_table(eagle2, meta)
    fig = go.Figure()
    if why:
        fig.update_layout(template="none", title=dict(text=TITLE, x=0.01), margin=dict(l=10, r=10, t=40, b=10),
                          xaxis=dict(visible=False), yaxis=dict(visible=False))
        fig.add_annotation(text=why, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                           font=dict(size=14, color="#555555"))
        return fig
    fig.add_trace(go.Scatter(
        x=[r["nodes"] for r in rows], y=[r["tau"] for r in rows], mode="lines+markers", name="EAGLE-2, replayed",
        line=dict(color="#1f77b4", width=2), marker=dict(size=5),
        hovertemplate="the %{x} best nodes (root included): τ %{y:.2f}<extra>EAGLE-2, replayed</extra>"))
    own = _measured(eagle2)
    fig.add_trace(go.Scatter(
        x=[own[0]], y=[own[1]], mode="markers", name=f"EAGLE-2 as run ({own[0]} nodes)",
        marker=dict(size=13, color="#1f77b4", symbol="circle-open", line=dict(width=2.5)),
        hovertemplate="as run: %{x} nodes, τ %{y:.2f}<extra></extra>"))
    static = _measured(eagle1 or [])
    if static:
        fig.add_trace(go.Scatter(
            x=[static[0]], y=[static[1]], mode="markers", name=f"EAGLE-1 static tree ({static[0]} nodes)",
            marker=dict(size=12, color="#d62728", symbol="diamond"),
            hovertemplate="EAGLE-1: %{x} nodes, τ %{y:.2f}<extra></extra>"))
    enough = min(r["nodes"] for r in rows if r["tau"] >= rows[-1]["tau"] - 1e-9)
    if enough < rows[-1]["nodes"]:
        fig.add_annotation(x=enough, y=rows[enough - 1]["tau"], text=f"{enough} nodes already accept as much as {own[0]}",
                           showarrow=True, arrowhead=2, ax=0, ay=40, font=dict(size=12, color="#333333"))
    fig.update_layout(
        template="none", title=dict(text=TITLE, x=0.01), margin=dict(l=60, r=10, t=40, b=60),
        xaxis=dict(title=dict(text="verified nodes per step (root included; 1 = plain decoding)"), rangemode="tozero"),
        yaxis=dict(title=dict(text="τ: tokens per drafted step (prefill not counted)"), rangemode="tozero"),
        legend=dict(x=0.99, y=0.01, xanchor="right", yanchor="bottom"),
    )
    return fig
