"""What a tree size costs on this machine: the accept length each size needs to beat plain decoding, from the
costs the tuner measured (eagle2/tools/profile.py), with the run's own trees marked on it.

A step of a tree of n nodes at depth d costs verify(n) + rest(d) (rest: drafting d levels, commit, the
record); a step of plain decoding costs about one verify of a single row. So the tree beats plain decoding
when its accept length is above (verify(n) + rest(d)) / verify(1): the break-even accept length. Nothing here
is estimated beyond that ratio: both sides are medians of timed runs of the engine on this machine.

Profiles measured on other devices (`eagle2.tools.device_profiles`, a lent GPU's) are drawn beside it, dashed,
each named as a projection from that device's costs: the run's own points are this machine's, never the GPU's.
"""
from __future__ import annotations

import plotly.graph_objects as go

from eagle2.decode.records import StepRecord, tau
from eagle2.tools.device_profiles import projected_label
from eagle2.tools.serving import interpolate
from viz.colours import colour
from viz.empty import note_figure

TITLE = "What a tree size costs here: the accept length it needs to beat plain decoding"
WHY = ("On a CPU every verified row adds to a forward's cost, so small trees pay; on a GPU a forward over dozens of "
       "rows costs about what one row does, so the paper's large trees win there.")


def break_even(costs: dict, depth: int, max_nodes: int) -> list[dict]:
    """Rows {nodes, verify_ms, draft_ms, tau} for 2..max_nodes: the accept length a tree of that many nodes
    (root included) and `depth` levels needs to match plain decoding's tokens/s on the measured machine."""
    verify = {int(k): float(v) for k, v in costs["verify_ms"].items()}
    rest = {int(k): float(v) for k, v in costs["rest_ms"].items()}
    draft = interpolate(rest, depth)
    plain = verify[1]
    return [{"nodes": n, "verify_ms": interpolate(verify, n), "draft_ms": draft,
             "tau": (interpolate(verify, n) + draft) / plain} for n in range(2, max_nodes + 1)]


def _run_point(records: list[StepRecord]) -> tuple[float, float] | None:
    """(mean verified nodes a step, accept length) of a run's drafted steps."""
    steps = [r for r in records if r.nodes]
    if not steps:
        return None
    return sum(len(r.verified) for r in steps) / len(steps), tau(steps)


STORED_COLOURS = ("#1f77b4", "#9467bd", "#8c564b", "#17becf")  # one per stored profile, none a method's colour
NONE_HERE = ("no costs measured for this run: the page measures them on a CPU when it tunes the tree size for the "
             "machine")


def _max_rows(costs: dict) -> int:
    return max(int(k) for k in costs["verify_ms"])


def cost_figure(costs: dict | None, runs: dict[str, list[StepRecord]], depth: int,
                labels: dict[str, str] | None = None, stored: list[dict] = ()) -> go.Figure:
    """The break-even accept length by tree size at the run's EAGLE-2 depth, with each tree as it ran, and the
    same line priced with each `stored` profile (another device's measured costs), dashed."""
    if not costs and not stored:
        return note_figure(NONE_HERE, TITLE, size=13)
    fig = go.Figure()
    points = {m: p for m, p in ((m, _run_point(r)) for m, r in runs.items()) if p}
    top = max([26, *[int(p[0]) + 2 for p in points.values()]])
    top = min(top, max(_max_rows(c) for c in [costs, *stored] if c))
    if costs:
        rows = break_even(costs, depth, min(top, _max_rows(costs)))
        fig.add_trace(go.Scatter(
            x=[r["nodes"] for r in rows], y=[r["tau"] for r in rows], mode="lines",
            name=f"break-even τ (depth {depth})", line=dict(color="#444444", width=2), fill="tozeroy",
            fillcolor="rgba(120,120,120,0.10)", customdata=[[r["verify_ms"], r["draft_ms"]] for r in rows],
            hovertemplate=("%{x} nodes: verify %{customdata[0]:.1f} ms + drafting %{customdata[1]:.1f} ms a step"
                           "<br>needs τ ≥ %{y:.2f} to beat plain decoding<extra></extra>")))
    for i, profile in enumerate(stored):
        rows = break_even(profile, depth, min(top, _max_rows(profile)))
        name = f"break-even τ (depth {depth}), {projected_label(profile)}"
        fig.add_trace(go.Scatter(
            x=[r["nodes"] for r in rows], y=[r["tau"] for r in rows], mode="lines", name=name,
            line=dict(color=STORED_COLOURS[i % len(STORED_COLOURS)], width=2, dash="dash"),
            customdata=[[r["verify_ms"], r["draft_ms"]] for r in rows],
            hovertemplate=(f"on {profile['device']}: %{{x}} nodes would cost verify %{{customdata[0]:.1f}} ms + "
                           "drafting %{customdata[1]:.1f} ms a step<br>and need τ ≥ %{y:.2f} to beat plain "
                           f"decoding there<extra>{profile['date']}</extra>")))
    for m, (nodes, run_tau) in points.items():
        name = (labels or {}).get(m, m)
        fig.add_trace(go.Scatter(
            x=[nodes], y=[run_tau], mode="markers", name=f"{name}: τ {run_tau:.2f} at {nodes:.1f} nodes",
            marker=dict(size=13, color=colour(m), symbol="diamond", line=dict(width=1, color="#222222")),
            hovertemplate=f"{name}<br>%{{x:.1f}} nodes a step, τ %{{y:.2f}}<extra></extra>"))
    here = (f"measured on this machine {costs.get('measured', '')}. Above the line: faster than plain decoding."
            if costs else f"{NONE_HERE}.")
    if stored:  # the run's points are this machine's; greedy decoding gives the same tokens there, its time differs
        here += (" Dashed: the same line priced with costs measured on another device, a projection, not a run "
                 "(greedy decoding accepts about the same τ there).")
    fig.add_annotation(text=f"{here}<br>{WHY}", x=0.0, y=-0.28, xref="paper", yref="paper",
                       showarrow=False, align="left", xanchor="left", font=dict(size=11, color="#444444"))
    fig.update_layout(
        template="none", title=dict(text=TITLE, x=0.01), margin=dict(l=60, r=10, t=40, b=110),
        xaxis=dict(title=dict(text="verified nodes per step (root included)"), rangemode="tozero"),
        yaxis=dict(title=dict(text="accept length τ (tokens a step)"), rangemode="tozero"),
        legend=dict(x=0.01, y=0.99))
    return fig
