"""Analysis charts measured from step records: calibration, tree positions, accept lengths, metrics.

Only "decided" nodes count for acceptance statistics: kept nodes whose parent was accepted, so the
target actually judged them (verdict ACCEPTED or REJECTED). Unreached nodes say nothing about the
draft's quality and are left out. Each chart has a pure table function beside it for tests.
"""
from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

from eagle2.decode.records import ACCEPTED, KEPT, REJECTED, Node, StepRecord, decoding_steps, summarise, tau
from viz.colours import colour
from viz.empty import note_figure


def _decided(records: Iterable[StepRecord], scored_only: bool = False) -> Iterable[Node]:
    for r in records:
        for n in r.nodes:
            if n.status == KEPT and n.verdict in (ACCEPTED, REJECTED) and (not scored_only or r.scored(n)):
                yield n


def calibration_table(records: list[StepRecord], bins: int = 10) -> list[dict]:
    """Per probability bin: bin_lo, bin_hi, n decided nodes, accepted, rate (None when n == 0). Nodes the draft
    never scored (a lookup branch past the drafted levels) are left out: their probability is only a floor."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    n = [0] * bins
    acc = [0] * bins
    for node in _decided(records, scored_only=True):
        p = min(max(node.prob, 0.0), 1.0)
        b = min(int(p * bins), bins - 1)  # p == 1.0 belongs to the last bin, not a new one
        n[b] += 1
        acc[b] += node.verdict == ACCEPTED
    return [
        {"bin_lo": b / bins, "bin_hi": (b + 1) / bins, "n": n[b], "accepted": acc[b],
         "rate": acc[b] / n[b] if n[b] else None}
        for b in range(bins)
    ]


def calibration_figure(runs: dict[str, list[StepRecord]], bins: int = 10) -> go.Figure:
    """Acceptance rate against draft probability per method; a calibrated draft lies on y = x."""
    title = "Draft calibration: acceptance rate by draft probability"
    tables = {m: [row for row in calibration_table(recs, bins) if row["n"]] for m, recs in runs.items()}
    if not any(tables.values()):
        return note_figure("no verified draft nodes yet", title)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated (y = x)",
                             line=dict(color="#999999", dash="dash"), hoverinfo="skip"))
    for method, rows in tables.items():
        if not rows:
            continue
        fig.add_trace(go.Scatter(
            x=[(r["bin_lo"] + r["bin_hi"]) / 2 for r in rows], y=[r["rate"] for r in rows],
            mode="lines+markers", name=method, line=dict(color=colour(method)),
            # Marker area grows with the bin's count so thin bins read as less certain.
            marker=dict(size=[6 + 14 * (r["n"] / max(x["n"] for x in rows)) ** 0.5 for r in rows],
                        color=colour(method)),
            customdata=[[r["bin_lo"], r["bin_hi"], r["n"], r["accepted"]] for r in rows],
            hovertemplate=("p in [%{customdata[0]:.2f}, %{customdata[1]:.2f})<br>"
                           "accepted %{customdata[3]} of %{customdata[2]} (%{y:.2f})"
                           f"<extra>{method}</extra>"),
        ))
    fig.update_layout(
        template="none", title=dict(text=title, x=0.01), margin=dict(l=60, r=10, t=40, b=50),
        xaxis=dict(title=dict(text="draft probability of the token"), range=[0, 1]),
        yaxis=dict(title=dict(text="fraction accepted by the target"), range=[0, 1.02]),
        legend=dict(x=0.01, y=0.99),
    )
    return fig


def position_table(records: list[StepRecord]) -> dict[tuple[int, int], tuple[int, int]]:
    """(depth, sibling rank) -> (n decided nodes, accepted); nodes only prompt lookup proposed have no draft rank."""
    table: dict[tuple[int, int], tuple[int, int]] = {}
    for node in _decided(records):
        if node.source == "lookup":
            continue
        n, acc = table.get((node.depth, node.rank), (0, 0))
        table[(node.depth, node.rank)] = (n + 1, acc + (node.verdict == ACCEPTED))
    return table


def position_heatmap(records: list[StepRecord], max_depth: int | None = None,
                     max_rank: int | None = None) -> go.Figure:
    """Acceptance rate by tree position (depth down, sibling rank across), counts in each cell."""
    title = "Acceptance rate by tree position"
    table = {k: v for k, v in position_table(records).items()
             if (max_depth is None or k[0] <= max_depth) and (max_rank is None or k[1] <= max_rank)}
    if not table:
        return note_figure("no verified draft nodes yet", title)
    depths = list(range(min(d for d, _ in table), max(d for d, _ in table) + 1))
    ranks = list(range(0, max(r for _, r in table) + 1))
    z, text, custom = [], [], []
    for d in depths:
        z_row, t_row, c_row = [], [], []
        for r in ranks:
            n, acc = table.get((d, r), (0, 0))
            z_row.append(acc / n if n else None)  # None leaves the cell blank, not a fake 0
            t_row.append(f"{acc}/{n}" if n else "")
            c_row.append([n, acc])
        z.append(z_row)
        text.append(t_row)
        custom.append(c_row)
    fig = go.Figure(go.Heatmap(
        z=z, x=ranks, y=depths, text=text, texttemplate="%{text}", customdata=custom,
        colorscale="Viridis", zmin=0.0, zmax=1.0, colorbar=dict(title=dict(text="rate"), thickness=12),
        hovertemplate=("depth %{y}, rank %{x}<br>accepted %{customdata[1]} of %{customdata[0]}"
                       "<br>rate %{z:.2f}<extra></extra>"),
        xgap=1, ygap=1,
    ))
    fig.update_layout(
        template="none", title=dict(text=title, x=0.01), margin=dict(l=60, r=10, t=40, b=50),
        xaxis=dict(title=dict(text="sibling rank (0 = draft's top choice)"), dtick=1),
        yaxis=dict(title=dict(text="depth"), dtick=1, autorange="reversed"),
    )
    return fig


def accept_length_figure(runs: dict[str, list[StepRecord]]) -> go.Figure:
    """Tokens committed per step (accepted drafts + bonus) for each method, prefill left out."""
    title = "Accept length per step"
    fig = go.Figure()
    for method, recs in runs.items():
        steps = decoding_steps(recs)
        if not steps:
            continue
        fig.add_trace(go.Scatter(
            x=[r.step for r in steps], y=[len(r.new_tokens) for r in steps], mode="lines+markers",
            name=f"{method} (τ = {tau(steps):.2f})",
            line=dict(shape="hv", width=1.5, color=colour(method)), marker=dict(size=5, color=colour(method)),
            customdata=[[len(r.accepted)] for r in steps],
            hovertemplate=(f"{method}<br>step %{{x}}: %{{y}} tokens"
                           "<br>(%{customdata[0]} accepted drafts + bonus)<extra></extra>"),
        ))
    if not fig.data:
        return note_figure("no decoding steps yet", title)
    fig.update_layout(
        template="none", title=dict(text=title, x=0.01), margin=dict(l=60, r=10, t=40, b=50),
        xaxis=dict(title=dict(text="step")),
        yaxis=dict(title=dict(text="tokens committed (accept length)"), rangemode="tozero", dtick=1),
        legend=dict(x=0.01, y=0.99),
    )
    return fig


def lookup_accepted(records: list[StepRecord]) -> int:
    """Accepted tokens that only the prompt-lookup branch proposed (the draft's top-k did not have them)."""
    return sum(r.nodes[i].source == "lookup" for r in records for i in r.accepted)  # node id == its index


def metrics_rows(runs: dict[str, list[StepRecord]], vanilla_tokens_per_s: float | None = None,
                 wall_s: dict[str, float] | None = None) -> list[dict]:
    """Per method: tokens and target forwards (the whole run, prefill included), τ (`records.tau`), time,
    tokens/s, speedup, and accepted tokens only the prompt-lookup branch proposed. Time is the decode's measured wall time where given (`wall_s`, as the bench
    measures it), else the sum of the records' phase timings, prefill included."""
    rows = []
    for method, recs in runs.items():
        wall = (wall_s or {}).get(method)
        if wall is None:
            wall = sum(r.draft_ms + r.verify_ms + r.commit_ms for r in recs) / 1000.0
        s = summarise(method, recs, wall)
        speedup = None
        if vanilla_tokens_per_s and vanilla_tokens_per_s > 0 and s.tokens_per_s > 0:
            speedup = s.tokens_per_s / vanilla_tokens_per_s
        rows.append({
            "method": method, "tokens": s.new_tokens, "target_forwards": s.target_forwards,
            "mean_accept_length": s.mean_accept_length, "time_s": wall,
            "tokens_per_s": s.tokens_per_s, "speedup": speedup, "lookup_accepted": lookup_accepted(recs),
        })
    return rows
