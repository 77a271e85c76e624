"""The page's per-machine profile: tuned once, cached under a key naming the machine, drawn as break-even τ."""
from __future__ import annotations

import os
from pathlib import Path

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


def test_the_suite_writes_into_its_own_cache_not_the_users():
    from eagle2.config import cache_dir
    from tests.conftest import SUITE_CACHE

    home = Path(os.path.expanduser("~")).resolve()
    for path in (cache_dir(), Path(os.environ["TORCH_EXTENSIONS_DIR"]), Path(os.environ["XDG_CACHE_HOME"])):
        assert path.resolve().is_relative_to(SUITE_CACHE), path
        assert not path.resolve().is_relative_to(home / ".cache"), path


def test_costs_never_fall_as_rows_or_depth_grow():
    from eagle2.tools.autotune import monotone

    noisy = {1: 64.0, 2: 33.9, 4: 36.0, 8: 41.4, 16: 40.0, 26: 76.5}  # a busy moment timed the 1-row verify
    fit = monotone(noisy)
    assert list(fit) == sorted(noisy) and all(fit[a] <= fit[b] for a, b in zip(sorted(fit), sorted(fit)[1:]))
    assert fit[26] == 76.5 and fit[1] == fit[2] < 64.0  # the violators pooled, the rest untouched
    assert monotone({1: 1.0, 2: 2.0}) == {1: 1.0, 2: 2.0}
    assert sum(fit.values()) == sum(noisy.values())  # pooling keeps the total (least squares)


def test_a_run_that_contradicts_the_profile_has_it_measured_again():
    from eagle2.decode.records import StepRecord

    def step(ms: float, nodes: bool = True) -> StepRecord:
        return StepRecord(step=1, method="eagle2", prefix_len=3, nodes=(object(),) if nodes else (), accepted=(),
                          bonus_token=0, new_tokens=(1,), new_texts=("a",), new_sources=("target",), draft_ms=1.0,
                          verify_ms=ms, commit_ms=0.1)

    prof = {"verify_ms": {"4": 36.0, "8": 40.0}}
    ok = profile.check_profile(prof, [step(90.0, nodes=False), step(37.0), step(38.0), step(39.0)], 6)
    assert ok == {"measured_ms": 38.0, "predicted_ms": 38.0, "rows": 6, "ratio": 1.0, "ok": True}
    slow = profile.check_profile(prof, [step(50.0)] * 3, 8)
    assert slow["ratio"] == 1.25 and slow["ok"] is False
    assert profile.check_profile(prof, [step(1.0, nodes=False)], 8) is None


def test_a_machine_slower_throughout_keeps_its_profile_and_a_changed_shape_does_not():
    # With the same run's plain decoding, the tree's verify is judged against a one-row step: a machine 1.5x
    # slower throughout keeps the sizes (they follow from relative costs), a tree that got dearer against a step
    # has the profile measured again.
    from eagle2.decode.records import StepRecord

    def step(ms: float, method: str = "eagle2", n: int = 1) -> StepRecord:
        return StepRecord(step=n, method=method, prefix_len=3, nodes=(object(),) if method == "eagle2" else (),
                          accepted=(), bonus_token=0, new_tokens=(1,), new_texts=("a",), new_sources=("target",),
                          draft_ms=1.0, verify_ms=ms, commit_ms=0.1)

    prof = {"verify_ms": {"1": 8.0, "4": 12.0, "8": 18.0}}
    prefill = step(500.0, "vanilla", n=0)  # the prefill is no step of plain decoding's
    slower = profile.check_profile(prof, [step(18.0)] * 3, 4, plain=[prefill] + [step(12.0, "vanilla")] * 5)
    assert slower["ratio"] == 1.5 and slower["shape"] == 1.0 and slower["ok"] is True
    dearer = profile.check_profile(prof, [step(18.0)] * 3, 4, plain=[step(8.0, "vanilla")] * 5)
    assert dearer["shape"] == 1.5 and dearer["ok"] is False
    assert profile.check_profile(prof, [step(18.0)] * 3, 4, plain=[prefill])["ok"] is False  # no step: absolute
    assert "shape" not in profile.check_profile({"verify_ms": {"4": 12.0}}, [step(12.0)], 4, plain=[step(8.0, "vanilla")])
