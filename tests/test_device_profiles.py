"""Cost profiles stored from another device (a lent GPU's): read from a folder, drawn beside this machine's costs
as projections, and absent without changing a chart."""
from __future__ import annotations

import json

import pytest

from eagle2.decode.records import KEPT, ROOT, Node, StepRecord
from eagle2.tools.device_profiles import make_profile, parse_profile, projected_label, slug, stored_profiles
from viz.costs import break_even, cost_figure
from viz.tree_size import projected_speedup, tree_size_figure, tree_size_table

HERE = {"measured": "2026-01-01 00:00", "verify_ms": {"1": 30.0, "2": 31.0, "4": 33.0, "8": 41.0, "26": 70.0},
        "rest_ms": {"1": 3.0, "3": 6.0}}
# a GPU's shape: verification nearly flat in rows, drafting a small share of a step
GPU = {"device": "Tiny GPU", "date": "2026-12-07", "verify_ms": {"1": 10.0, "8": 10.5, "26": 11.0, "60": 13.0},
       "rest_ms": {"1": 1.0, "6": 5.0}, "rest_ms_by_width": {"1": {"1": 0.8}, "10": {"1": 1.0, "6": 5.0}}}


def _step() -> StepRecord:
    """One greedy EAGLE-2 step of 3 nodes: the first drafted token accepted, then the bonus."""
    nodes = (Node(0, -1, 1, "a", 0, 0, 1.0, 0.0, ROOT, True, "accepted", 2, "b"),
             Node(1, 0, 2, "b", 1, 0, 0.5, -0.69, KEPT, False, "accepted", 3, "c"),
             Node(2, 0, 4, "d", 1, 1, 0.2, -1.6, KEPT, False, "rejected", None, None))
    return StepRecord(step=1, method="eagle2", prefix_len=3, nodes=nodes, accepted=(1,), bonus_token=3,
                      new_tokens=(2, 3), new_texts=("b", "c"), new_sources=("draft", "target"), draft_ms=1.0,
                      verify_ms=1.0, commit_ms=0.1)


def _store(folder, *profiles) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for p in profiles:
        (folder / f"{slug(p['device'], p['date'])}.json").write_text(json.dumps(p))


def test_stored_profiles_are_read_and_a_file_that_is_not_one_is_left_out(tmp_path, capsys):
    assert stored_profiles(tmp_path / "none") == []  # no folder: no profiles, no error
    _store(tmp_path, GPU, {**GPU, "device": "Another GPU", "date": "2026-12-01"})
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "no-one-row.json").write_text(json.dumps({**GPU, "verify_ms": {"8": 10.0}}))
    got = stored_profiles(tmp_path)
    assert [p["device"] for p in got] == ["Another GPU", "Tiny GPU"]
    assert got[1]["verify_ms"] == {1: 10.0, 8: 10.5, 26: 11.0, 60: 13.0} and got[1]["rest_ms_by_width"][1] == {1: 0.8}
    err = capsys.readouterr().err
    assert "broken.json" in err and "no-one-row.json" in err
    assert slug("NVIDIA H100 80GB HBM3", "2026-12-07") == "nvidia-h100-80gb-hbm3-2026-12-07"


def test_a_made_profile_reads_back_as_measured():
    made = make_profile("Tiny GPU", "2026-12-07", {1: 10.004, 8: 10.5}, {1: {1: 0.8}, 10: {1: 1.0, 2: 1.9}}, 10,
                        model="tiny")
    back = parse_profile(json.loads(json.dumps(made)))
    assert back["verify_ms"] == {1: 10.0, 8: 10.5} and back["rest_ms"] == {1: 1.0, 2: 1.9}
    assert back["rest_ms_by_width"] == {1: {1: 0.8}, 10: {1: 1.0, 2: 1.9}} and back["model"] == "tiny"


def test_the_cost_chart_draws_each_stored_profile_beside_this_machines_line():
    runs = {"eagle2": [_step()]}
    plain = cost_figure(HERE, runs, depth=3)
    assert cost_figure(HERE, runs, depth=3, stored=[]).to_dict() == plain.to_dict()  # nothing stored: as before
    gpu = parse_profile(GPU)
    fig = cost_figure(HERE, runs, depth=3, stored=[gpu])
    here, stored, point = fig.data
    assert here.to_plotly_json() == plain.data[0].to_plotly_json() and point.x == (3.0,)
    assert stored.line.dash == "dash" and projected_label(gpu) in stored.name
    assert "projected from costs measured on Tiny GPU, 2026-12-07" in stored.name
    assert list(stored.y) == pytest.approx([r["tau"] for r in break_even(gpu, 3, 26)])
    assert stored.y[-1] < here.y[-1]  # nearly flat verification: a 26-node tree needs far less τ there
    assert "a projection, not a run" in fig.layout.annotations[0].text
    # a page on a machine with no costs of its own (a GPU) still shows the stored profiles
    alone = cost_figure(None, runs, depth=3, stored=[gpu])
    assert [t.name for t in alone.data][0] == stored.name and "no costs measured" in alone.layout.annotations[0].text
    assert max(alone.data[0].x) == 26  # the window: 26 nodes or the run's own size, within the profile's rows


def test_the_tree_size_replay_projects_speedup_only_beside_a_stored_profile():
    recs, meta = [_step()], {"settings": {"depth": 3}, "costs": HERE}
    plain = tree_size_figure(recs, meta)
    assert tree_size_figure(recs, meta, stored=[]).to_dict() == plain.to_dict()
    assert not any(t.yaxis == "y2" for t in plain.data)
    gpu = parse_profile(GPU)
    fig = tree_size_figure(recs, meta, stored=[gpu])
    projected = [t for t in fig.data if t.yaxis == "y2"]
    assert [t.name for t in projected] == [
        "EAGLE-2 speedup projected from costs measured on this machine, 2026-01-01 00:00",
        "EAGLE-2 speedup projected from costs measured on Tiny GPU, 2026-12-07"]
    rows = tree_size_table(recs, meta)[0]  # τ 1 at 1 node, 2 at 2 and 3
    # 2 nodes: τ 2 over (verify of 2 rows, between the timed 1 and 8, + drafting 3 levels, between 1 and 6)
    step_ms = 10.0 + (10.5 - 10.0) / 7 + 1.0 + (5.0 - 1.0) * 2 / 5
    assert projected[1].y[0] == 1.0 and projected[1].y[1] == pytest.approx(2 * 10.0 / step_ms)
    assert projected_speedup(rows, HERE, 3)[1] == (2, pytest.approx(2 * 30.0 / (31.0 + 6.0)))


def test_the_page_draws_the_profiles_stored_in_its_folder(tmp_path, monkeypatch):
    from app_parts.session import Session
    from app_parts.views import analysis_views

    session = Session(runs={"eagle2": [_step()]})
    monkeypatch.setenv("EAGLE2_PROFILES", str(tmp_path / "profiles"))
    before = analysis_views(session)[-1]
    assert "no costs measured" in before.layout.annotations[0].text and not before.data  # nothing stored, no costs
    _store(tmp_path / "profiles", GPU)
    after = analysis_views(session)[-1]
    assert [t.name for t in after.data if t.line.dash == "dash"] == [
        "break-even τ (depth 1), projected from costs measured on Tiny GPU, 2026-12-07"]
