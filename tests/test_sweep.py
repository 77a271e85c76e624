"""`bench --sweep` on a tiny model: one row per configuration, lossless runs, and a figure from the rows."""
from __future__ import annotations

import torch

from eagle2.config import DecodeConfig
from eagle2.loading import Bundle
from eagle2.tools.sweep import run_sweep, static_variants
from viz.sweep import sweep_figure


def test_sweep_rows_and_figure(tiny):
    target, head, tok = tiny
    bundle = Bundle(target=target, tokenizer=tok, head=head, device=torch.device("cpu"), dtype=torch.float32,
                    model_name="tiny", head_name="random")
    rows = run_sweep(bundle, ["abcab", "cabbage"], DecodeConfig(max_new_tokens=10, top_k=4), totals=(4, 8),
                     depths=(2, 3), progress=lambda s: None)
    eagle2 = [r for r in rows if r["method"] == "eagle2"]
    assert len(eagle2) == 4 and {(r["total_tokens"], r["depth"]) for r in eagle2} == {(4, 2), (8, 2), (4, 3), (8, 3)}
    assert len([r for r in rows if r["method"] == "eagle1"]) == len(static_variants(3))
    assert rows[0]["method"] == "vanilla" and rows[0]["tau"] == 1.0
    assert all(r["tau"] >= 1.0 and r["tokens_per_s"] > 0 for r in rows)
    fig = sweep_figure(rows)
    names = {t.name for t in fig.data}
    assert {"EAGLE-2 depth 2", "EAGLE-2 depth 3", "EAGLE-1 chain", "EAGLE-1 mc_sim cut by depth"} == names
    assert sum(len(t.x) for t in fig.data) == 2 * (len(rows) - 1)  # every non-vanilla row, in both panels
    colours = {}
    for t in fig.data:  # one legend serves both panels: a series has one colour, and series differ
        colours.setdefault(t.name, set()).add(t.line.color)
    assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == len(colours)
