"""Figures and a standalone HTML page for a workload diagnosis (`eagle2.tools.diagnose`), from its JSON report only."""
from __future__ import annotations

import html
import json

import plotly.graph_objects as go

from viz.colours import colour


def curves_figure(tau: dict, title: str = "τ by verified nodes, replayed") -> go.Figure:
    """τ against verified nodes (root included): EAGLE-2 at each depth, EAGLE-1's cut tree, top-1 chains."""
    fig = go.Figure()
    by_depth: dict[int, list[tuple[int, float]]] = {}
    for key, t in tau["eagle2"].items():
        n, d = map(int, key.split(","))
        by_depth.setdefault(d, []).append((n, t))
    for d, pts in sorted(by_depth.items()):
        pts.sort()
        deepest = d == max(by_depth)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines",
                                 name=f"EAGLE-2, depth {d}", opacity=1.0 if deepest else 0.35 + 0.08 * d,
                                 line=dict(width=2.5 if deepest else 1, color=colour("eagle2"))))
    e1 = sorted((int(n), t) for n, t in tau["eagle1"].items())
    fig.add_trace(go.Scatter(x=[p[0] for p in e1], y=[p[1] for p in e1], mode="lines+markers", name="EAGLE-1 cut",
                             line=dict(color=colour("eagle1"), dash="dash")))
    ch = sorted((int(n) + 1, t) for n, t in tau["chain"].items())
    fig.add_trace(go.Scatter(x=[p[0] for p in ch], y=[p[1] for p in ch], mode="lines+markers", name="chain (top-1)",
                             line=dict(dash="dot", color="#2ca02c")))
    fig.update_layout(template="none", title=dict(text=title, x=0.01), margin=dict(l=60, r=10, t=40, b=50),
                      xaxis=dict(title=dict(text="verified nodes, root included")),
                      yaxis=dict(title=dict(text="τ (tokens per target forward)")))
    return fig


def position_figure(position: dict, which: str = "conditional") -> go.Figure:
    """Acceptance by depth (down) and sibling rank (across): `which` is "conditional" or "mean"."""
    z = position[which]
    counts = position["reached" if which == "conditional" else "drafted"]
    text = [[f"{a}/{c}" if c else "" for a, c in zip(ra, rc)] for ra, rc in zip(position["accepted"], counts)]
    fig = go.Figure(go.Heatmap(z=z, x=position["ranks"], y=position["depths"], text=text, texttemplate="%{text}",
                               colorscale="Viridis", zmin=0.0, zmax=1.0, xgap=1, ygap=1,
                               hovertemplate="depth %{y}, rank %{x}<br>%{text}<br>%{z:.2f}<extra></extra>"))
    fig.update_layout(template="none", margin=dict(l=60, r=10, t=40, b=50),
                      title=dict(text=f"Acceptance by position, {which}: {position['definitions'][which]}", x=0.01,
                                 font=dict(size=12)),
                      xaxis=dict(title=dict(text="sibling rank (0 = draft's top choice)"), dtick=1),
                      yaxis=dict(title=dict(text="depth"), autorange="reversed", dtick=1))
    return fig


def _worst(collapses: list[dict]) -> str:
    return "; ".join(f"{c['context']!r}: draft {c['draft']!r} ({c['draft_prob']:.2f}), target {c['target']!r}"
                     for c in collapses)


def report_html(out: dict) -> str:
    """One page: the curves, both position heatmaps, the recommendations, conformance and collapses."""
    figs = [curves_figure(out["overall"]["tau"], "τ by verified nodes, all prompts"),
            position_figure(out["position"], "conditional"), position_figure(out["position"], "mean")]
    parts = [f.to_html(full_html=False, include_plotlyjs=i == 0) for i, f in enumerate(figs)]
    rec = out.get("recommended", {})
    esc = html.escape
    rows = "".join(f"<tr><td>{p['id']}</td><td>{esc(p['category'])}</td><td>{p['tokens']}</td>"
                   f"<td>{p['recorded'].get('tau', '')}</td><td>{p['collapses']['count']}</td>"
                   f"<td>{esc(_worst(p['collapses']['worst'][:3]))}</td></tr>" for p in out["per_prompt"])
    defs = "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in out["definitions"].items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>EAGLE workload diagnosis</title></head><body>"
        "<h1>Workload diagnosis</h1>"
        f"<h2>Recommended</h2><pre>{esc(json.dumps(rec, indent=1))}</pre>"
        f"<h2>Conformance</h2><pre>{esc(json.dumps(out['conformance'], indent=1))}</pre>"
        + "".join(parts)
        + "<h2>Prompts</h2><table border=1><tr><th>id</th><th>category</th><th>tokens</th><th>τ (60 nodes)</th>"
        f"<th>collapses</th><th>worst</th></tr>{rows}</table><h2>Definitions</h2><ul>{defs}</ul></body></html>")
