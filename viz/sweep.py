"""The tree-size sweep as a figure: tokens/s and mean accept length against verified nodes, per tree kind."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eagle2.policies import CHAIN, policy


def sweep_figure(rows: list[dict]) -> go.Figure:
    """Two panels (speedup over plain decoding, tau) against total verified tokens; one line per depth."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("speedup over plain decoding (tokens/s ratio)",
                                                       "mean accept length τ"))
    groups: dict[str, list[dict]] = {}
    for r in rows:
        p = policy(r["method"])
        if p.plain:
            continue
        key = f"EAGLE-2 depth {r['depth']}" if p.dynamic else \
            ("EAGLE-1 chain" if r["label"].startswith(CHAIN) else "EAGLE-1 mc_sim cut by depth")
        groups.setdefault(key, []).append(r)
    palette = ["#1f77b4", "#2ca02c", "#9467bd", "#e377c2", "#bcbd22", "#ff7f0e", "#17becf", "#8c564b"]
    for i, (name, rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: r["total_tokens"])
        dash = "solid" if name.startswith("EAGLE-2") else "dot"
        colour = palette[i % len(palette)]  # the same colour in both panels, so one legend serves both
        for col, field in ((1, "speedup"), (2, "tau")):
            fig.add_trace(go.Scatter(
                x=[r["total_tokens"] for r in rs], y=[r[field] for r in rs], mode="lines+markers", name=name,
                legendgroup=name, showlegend=col == 1, line={"dash": dash, "color": colour},
                marker={"color": colour},
                text=[r["label"] for r in rs],
                hovertemplate="%{text}<br>verified nodes %{x}<br>" + field + " %{y:.2f}<extra>" + name + "</extra>"),
                row=1, col=col)
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey", row=1, col=1)
    fig.update_xaxes(title_text="verified nodes per step (root included)")
    fig.update_layout(template="none", height=480, margin={"l": 60, "r": 20, "t": 60, "b": 60})
    return fig


def write_plots(rows: list[dict], out_prefix: str) -> list[str]:
    """Write the sweep figure as HTML, and as PNG when a headless chromium is available."""
    import sys

    fig = sweep_figure(rows)
    html = f"{out_prefix}.html"
    fig.write_html(html, include_plotlyjs="cdn")
    written = [html]
    png = f"{out_prefix}.png"
    try:
        from viz.snapshot import html_to_png

        html_to_png(fig.to_html(include_plotlyjs=True, full_html=True), png, width=1100, height=520)
        written.append(png)
    except (ImportError, RuntimeError, OSError) as e:
        print(f"PNG not written ({e}); the HTML plot is at {html}", file=sys.stderr)
    return written
