"""Plotly views of EAGLE-2 decoding, built from step records only (no torch, no gradio)."""
from viz.charts import (
    accept_length_figure,
    calibration_figure,
    calibration_table,
    metrics_rows,
    position_heatmap,
    position_table,
)
from viz.costs import break_even, cost_figure
from viz.labels import label_html, visible_text
from viz.layout import tidy_layout
from viz.tokens import legend_html, tokens_html
from viz.tree_size import tree_size_figure, tree_size_table
from viz.tree_figure import bonus_entry, node_class, tree_figure
from viz.unfold import Stage, stage_names, stages, unfold_figure, unfold_text

__all__ = [
    "accept_length_figure",
    "bonus_entry",
    "break_even",
    "cost_figure",
    "calibration_figure",
    "calibration_table",
    "label_html",
    "legend_html",
    "metrics_rows",
    "node_class",
    "position_heatmap",
    "position_table",
    "Stage",
    "stage_names",
    "stages",
    "tidy_layout",
    "tokens_html",
    "tree_figure",
    "tree_size_figure",
    "tree_size_table",
    "unfold_figure",
    "unfold_text",
    "visible_text",
]
