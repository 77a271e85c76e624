"""Playback and unfolding (app_parts/playback.py): "Unfold the step shown" unfolds the step each panel shows,
whatever moved it there (Play, Pause, the step buttons, a slider), and the frame buttons step through frames."""
from __future__ import annotations

import re

from app_parts import actions, playback
from app_parts.session import Session
from eagle2.decode.records import StepRecord
from tests.test_unfold import DYN, STATIC, make

STEPS = {"eagle2": 6, "eagle1": 4}  # EAGLE-1 finished earlier: it stays on its last step


def _prefill(method: str) -> StepRecord:
    return StepRecord(step=0, method=method, prefix_len=3, nodes=(), accepted=(), bonus_token=1, new_tokens=(1,),
                      new_texts=("a",), new_sources=("target",), draft_ms=0.0, verify_ms=1.0, commit_ms=0.0)


def _session() -> Session:
    runs = {"eagle2": [_prefill("eagle2")] + [make(DYN, (1,), [("A", "draft"), ("X", "target")], step=k)
                                              for k in range(1, STEPS["eagle2"] + 1)],
            "eagle1": [_prefill("eagle1")] + [make(STATIC, (1,), [("s0", "draft"), ("W", "target")], "eagle1", k)
                                              for k in range(1, STEPS["eagle1"] + 1)]}
    return Session(runs=runs, source="live")


def _unfolded_steps(u: playback.Unfolded) -> dict[str, int]:
    """The step each unfold figure says it replays (from its title), so the figures, not only the bookkeeping,
    are checked."""
    return {m: int(re.search(r"step (\d+)", fig.layout.title.text).group(1)) for m, fig in u.figures.items()}


def test_a_fresh_run_unfolds_the_latest_steps_the_panels_follow():
    s = _session()
    u = playback.unfold(s)
    assert u.steps == playback.shown_steps(s) == STEPS and u.stage == 0
    assert _unfolded_steps(u) == STEPS


def test_after_play_and_pause_it_unfolds_the_step_both_panels_show():
    s = _session()
    assert playback.toggle(s)  # Play
    for _ in range(3):
        s, views, more = playback.tick(s)
        assert more
    assert {m: v.step for m, v in views.items()} == {"eagle2": 2, "eagle1": 2}
    assert not playback.toggle(s)  # Pause
    u = playback.unfold(s)
    assert u.steps == {"eagle2": 2, "eagle1": 2} and _unfolded_steps(u) == u.steps


def test_play_paused_before_its_first_tick_unfolds_what_the_panels_still_show():
    """Play from the end restarts at -1 (its first tick shows step 0); paused before that tick, the panels still
    show the steps they showed, and that is what unfolds, not the prefill."""
    s = _session()
    s, _ = playback.move(s, 0)  # both panels on the last steps, as the step buttons leave them
    shown = playback.shown_steps(s)
    assert shown == STEPS
    assert playback.toggle(s) and s.play == -1
    assert not playback.toggle(s)
    assert playback.unfold(s).steps == shown


def test_the_step_buttons_and_a_slider_move_what_unfolds():
    s = _session()
    s, views = playback.move(s, -1)
    assert playback.unfold(s).steps == {m: v.step for m, v in views.items()} == {"eagle2": 5, "eagle1": 4}
    actions.scrub(s, "eagle1", 1)  # one panel's slider: each panel unfolds its own step
    u = playback.unfold(s)
    assert u.steps == {"eagle2": 5, "eagle1": 1} and _unfolded_steps(u) == u.steps


def test_frame_buttons_and_typed_frames_stay_on_the_steps_unfolded_and_clamp():
    s = _session()
    first = playback.unfold(s)
    last = len(first.names) - 1
    assert last >= 3  # root, two levels, rerank, verdict: enough frames to step through
    assert playback.unfold_frame(s, 0, 1).stage == 1
    assert playback.unfold_frame(s, 1, -1).stage == 0
    assert playback.unfold_frame(s, 0, -1).stage == 0  # clamped at the first frame
    assert playback.unfold_frame(s, last, 1).stage == last  # and at the last
    assert playback.unfold(s, "2").stage == 0 and playback.unfold(s, 2.0).stage == 2  # a raw value as sent
    playback.move(s, -3)  # the panels move on, the unfolded steps stay until "Unfold the step shown"
    assert playback.unfold_frame(s, 1, 1).steps == first.steps
    assert playback.unfold(s).steps == {"eagle2": 3, "eagle1": 3}
