"""The page's per-machine profile: tuned once, cached under a key naming the machine, drawn as break-even τ."""
from __future__ import annotations

import pytest
import torch

import eagle2.tools.profile as profile
from eagle2.loading import Bundle
from eagle2.decode.records import KEPT, ROOT, Node, StepRecord
from viz.costs import break_even, cost_figure

COSTS = {"measured": "2026-01-01 00:00", "verify_ms": {"1": 30.0, "2": 31.0, "4": 33.0, "8": 41.0, "26": 70.0},
         "rest_ms": {"1": 3.0, "3": 6.0}}


@pytest.fixture
def bundle(tiny, tmp_path, monkeypatch):
    target, head, tok = tiny
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path))
    monkeypatch.setattr(profile, "warmup_texts", lambda n=None: ["abcabcabca", "ponmlkjpon", "abab", "fedcba"][:n])
    monkeypatch.setattr(profile, "PAGE_SIZES", (2, 4, 8))
    monkeypatch.setattr(profile, "PAGE_DEPTHS", (1, 2, 3))
    return Bundle(target=target, tokenizer=tok, head=head, device=torch.device("cpu"), dtype=torch.float32,
                  model_name="tiny", head_name="random")


def test_the_profile_is_tuned_once_per_machine_and_then_read_back(bundle, monkeypatch):
    assert profile.load_profile(bundle) is None
    first = profile.machine_profile(bundle)
    e = first["eagle2"]
    assert e["total_tokens"] in (2, 4, 8) and e["depth"] in (1, 2, 3) and e["tau"] >= 1
    assert {"1", "2", "4", "8"} <= set(first["verify_ms"]) and set(first["rest_ms"]) == {"1", "2", "3"}

    def no_tuning(*args, **kwargs):
        raise AssertionError("a cached profile must not be tuned again")

    monkeypatch.setattr(profile, "tune", no_tuning)
    assert profile.machine_profile(bundle) == first  # read back from the cache folder
    monkeypatch.setattr(profile, "cpu_name", lambda: "another processor")
    assert profile.load_profile(bundle) is None  # another machine: measured anew
    with pytest.raises(AssertionError, match="tuned again"):
        profile.machine_profile(bundle)


def test_break_even_is_the_step_cost_over_plain_decodings():
    rows = break_even(COSTS, depth=3, max_nodes=8)
    assert [r["nodes"] for r in rows] == list(range(2, 9))
    assert rows[2]["tau"] == pytest.approx((33.0 + 6.0) / 30.0)  # 4 nodes at depth 3
    assert rows[4]["verify_ms"] == pytest.approx(37.0)  # 6 nodes: between the timed 4 and 8
    assert [r["tau"] for r in rows] == sorted(r["tau"] for r in rows)
    assert break_even(COSTS, depth=2, max_nodes=2)[0]["draft_ms"] == pytest.approx(4.5)


def test_the_cost_chart_marks_each_run_and_says_when_nothing_was_measured():
    nodes = (Node(0, -1, 1, "a", 0, 0, 1.0, 0.0, ROOT, True, "accepted", 2, "b"),
             Node(1, 0, 2, "b", 1, 0, 0.5, -0.69, KEPT, False, "accepted", 3, "c"),
             Node(2, 0, 4, "d", 1, 1, 0.2, -1.6, KEPT, False, "rejected", None, None))
    step = StepRecord(step=1, method="eagle2", prefix_len=3, nodes=nodes, accepted=(1,), bonus_token=3,
                      new_tokens=(2, 3), new_texts=("b", "c"), new_sources=("draft", "target"), draft_ms=1.0,
                      verify_ms=1.0, commit_ms=0.1)
    fig = cost_figure(COSTS, {"eagle2": [step]}, depth=3, labels={"eagle2": "EAGLE-2"})
    line, point = fig.data
    assert list(line.x)[:3] == [2, 3, 4] and point.x == (3.0,) and point.y == (2.0,)  # 3 rows, 2 tokens
    assert "2026-01-01" in fig.layout.annotations[0].text
    empty = cost_figure(None, {"eagle2": [step]}, depth=3)
    assert not empty.data and "no costs measured" in empty.layout.annotations[0].text
