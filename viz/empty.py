"""A chart with nothing to plot yet: its title and a short note in the middle saying why."""
from __future__ import annotations

import plotly.graph_objects as go


def note_figure(text: str, title: str = "", size: int = 14) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(template="none", title=dict(text=title, x=0.01), margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=size, color="#555555"))
    return fig
