"""τ has one definition (`records.tau`): the metrics table, every chart that shows a run's τ, the bench, the
diagnose report and the exported trace give the same number for the same run."""
from __future__ import annotations

import json
import re

import pytest

from app_parts.session import Session, export_trace
from app_parts.views import analysis_views, metrics_markdown
from eagle2.decode.records import TAU_DEFINITION, step_phases, tau, tau_counts
from tests.test_viz import analysis_records, plain_record
from viz import cost_figure


def _runs() -> dict:
    """EAGLE-2: a prefill token, then steps of 3 and 2 tokens; plain decoding: a prefill and three steps."""
    return {"eagle2": analysis_records(), "vanilla": [plain_record(i, "x") for i in range(4)]}


def test_tau_leaves_the_prefill_out_and_counts_the_bonus():
    recs = analysis_records()
    assert [len(r.new_tokens) for r in recs] == [1, 3, 2]
    assert tau_counts(recs) == (5, 2)  # the prefill's forward and its one token are not counted
    assert tau(recs) == 2.5  # not 6 / 3: the whole run's tokens over its forwards is another quantity
    assert tau(_runs()["vanilla"]) == 1.0
    assert tau(recs[:1]) == 0.0 and tau([]) == 0.0  # no drafted step: no τ
    assert "prefill" in TAU_DEFINITION and "bonus" in TAU_DEFINITION


def test_step_phases_split_a_runs_wall_time_by_the_records_own_timers():
    recs = [plain_record(0, "a", ms=(0.0, 40.0, 0.0)), plain_record(1, "b", ms=(1.0, 5.0, 0.5)),
            plain_record(2, "c", ms=(2.0, 7.0, 1.5))]
    t = step_phases(recs, wall_s=0.0620)  # 40 of prefill, 17 in the steps' phases, 5 elsewhere
    assert t == pytest.approx({"prefill_ms": 40.0, "draft_ms_per_step": 1.5, "verify_ms_per_step": 6.0,
                               "commit_ms_per_step": 1.0, "rest_ms_per_step": 2.5})
    assert step_phases(recs[:1], wall_s=0.04)["draft_ms_per_step"] == 0.0  # no drafted step: nothing a step


def _table_tau(markdown: str) -> dict[str, float]:
    """The metrics table's τ column by method label."""
    head, *rows = [line for line in markdown.splitlines() if line.startswith("|")]
    col = [c.strip() for c in head.split("|")].index("τ")
    return {cells[1]: float(cells[col]) for cells in ([c.strip() for c in r.split("|")] for r in rows[1:])}


def test_the_table_and_every_chart_agree_on_one_runs_tau(tmp_path):
    session = Session(runs=_runs(), source="live")
    table = _table_tau(metrics_markdown(session))
    assert table["EAGLE-2 (dynamic tree)"] == 2.50 and table["plain decoding"] == 1.00
    assert TAU_DEFINITION in metrics_markdown(session)  # the page states the definition beside the numbers
    _, _, _, per_step, size, _ = analysis_views(session)
    legend = next(t.name for t in per_step.data if t.name.startswith("eagle2"))
    assert re.search(r"τ = (\d\.\d\d)", legend).group(1) == "2.50"
    as_run = next(t for t in size.data if "as run" in (t.name or ""))
    assert list(as_run.y) == [pytest.approx(2.5)]
    costs = {"verify_ms": {"1": 30.0, "8": 40.0}, "rest_ms": {"1": 5.0}, "measured": "today"}
    marker = next(t for t in cost_figure(costs, {"eagle2": session.records("eagle2")}, 1).data if t.mode == "markers")
    assert list(marker.y) == [pytest.approx(2.5)] and "τ 2.50" in marker.name
    trace = json.loads(export_trace(session, tmp_path).read_text())
    assert trace["tau"]["eagle2"] == 2.5 and trace["tau"]["vanilla"] == 1.0
    assert trace["tau"]["definition"] == TAU_DEFINITION
