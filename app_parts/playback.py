"""Watching a run again: Play/Pause both trees in step, one step back or forward, and unfolding one step.

Both trees move together: the page shows EAGLE-2's step k beside EAGLE-1's step k (a method that finished
earlier stays on its last step). Everything is drawn from the session's records, so a loaded trace plays
exactly as a live run does. No gradio here: the page turns these results into component updates.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from app_parts.actions import show_step, whole_step
from app_parts.session import TREE_METHODS, Session
from app_parts.views import label
from viz import stage_names, unfold_figure, unfold_text


@dataclass(frozen=True)
class StepView:
    """One method's views at one step: its tree, its text with the step outlined, its caption."""

    step: int
    tree: go.Figure
    text: str
    caption: str


def _views(session: Session, k: int, show_pruned: bool) -> dict[str, StepView]:
    """Both methods at step k (each clamped to its own last step); the page stops following the latest step."""
    return {m: StepView(min(max(k, 0), session.last_step(m)), *show_step(session, m, k, show_pruned))
            for m in TREE_METHODS if session.records(m)}


def last_step(session: Session) -> int:
    """The last step of the longer run (0 when nothing ran)."""
    return max((session.last_step(m) for m in TREE_METHODS if session.records(m)), default=0)


def shown_steps(session: Session) -> dict[str, int]:
    """The step each panel shows now: its latest while it follows the decode, else the one Play, the step
    buttons or its slider last drew (`show_step` writes it). This, not Play's position, is what the visitor
    sees: Play's position is -1 between pressing Play and its first tick, while the panels still show a step."""
    return {m: session.last_step(m) if session.follow.get(m, True) else min(session.shown.get(m, 0),
                                                                               session.last_step(m))
            for m in TREE_METHODS if session.records(m)}


def current(session: Session) -> int:
    """The step the playback controls stand on: Play's position, else the EAGLE-2 tree's (or EAGLE-1's)."""
    if session.play is not None:
        return session.play
    for m in TREE_METHODS:
        if session.records(m):
            return session.last_step(m) if session.follow.get(m, True) else session.shown.get(m, 0)
    return 0


def move(session: Session | None, delta: int, show_pruned: bool = True) -> tuple[Session, dict[str, StepView]]:
    """One step back (`delta` -1) or forward (+1), both trees together; pauses Play."""
    session = session or Session()
    k = min(max(current(session) + delta, 0), last_step(session))
    session.playing, session.play = False, k
    return session, _views(session, k, show_pruned)


def toggle(session: Session | None) -> bool:
    """Play or Pause; returns whether it plays now. Play starts from the first step, or resumes where Pause
    left it (from the first step again once it reached the end)."""
    if session is None or not any(session.records(m) for m in TREE_METHODS):
        return False
    if session.playing:
        session.playing = False
        return False
    if session.play is None or session.play >= last_step(session):
        session.play = -1  # the first tick shows step 0
    session.playing = True
    return True


def tick(session: Session | None, show_pruned: bool = True) -> tuple[Session, dict[str, StepView], bool]:
    """Play's next step: (session, the views of both trees, whether there is a step after it)."""
    session = session or Session()
    if not session.playing:
        return session, {}, False
    k = (session.play if session.play is not None else -1) + 1
    end = last_step(session)
    if k > end:
        session.playing = False
        return session, {}, False
    session.play = k
    more = k < end
    if not more:
        session.playing = False
    return session, _views(session, k, show_pruned), more


@dataclass(frozen=True)
class Unfolded:
    """A step unfolded: each method's step, the frame names, the frame shown, and each method's figure and
    explanation."""

    steps: dict[str, int]
    names: list[str]
    stage: int
    figures: dict[str, go.Figure]
    texts: dict[str, str]


def unfold(session: Session | None, stage: float | None = None) -> Unfolded:
    """The frames of how the steps shown were built; `stage` None starts a new unfolding at the step each panel
    shows now (frame 0), a number shows that frame (clamped) of the steps already unfolded."""
    session = session or Session()
    if stage is None or session.unfold_step is None:
        session.unfold_step = shown_steps(session)
    steps = session.unfold_step
    recs = {m: session.record(m, steps[m]) if m in steps else None for m in TREE_METHODS}
    names = stage_names(recs["eagle2"], recs["eagle1"])
    i = min(max(whole_step(stage), 0), len(names) - 1)
    return Unfolded(dict(steps), names, i,
                    {m: unfold_figure(recs[m], names[i], label(session, m)) for m in TREE_METHODS},
                    {m: unfold_text(recs[m], names[i], label(session, m)) for m in TREE_METHODS})


def unfold_frame(session: Session | None, stage: float | None, delta: int) -> Unfolded:
    """The previous (`delta` -1) or next (+1) frame of the steps unfolded (a new unfolding when none is)."""
    return unfold(session, whole_step(stage) + delta)
