"""Page actions besides Generate: scrub to a step, follow the latest step, Stop, trace export and import."""
from __future__ import annotations

import logging
import math
from pathlib import Path

import plotly.graph_objects as go

from app_parts.runner import Update, full_update
from app_parts.session import MAX_TRACE_BYTES, TREE_METHODS, RunControl, Session, export_trace, import_trace
from app_parts.views import session_caption, text_view, tree_view
from eagle2.inputs import shown

log = logging.getLogger(__name__)


def scrub(session: Session | None, method: str, step: float | None,
          show_pruned: bool = True) -> tuple[go.Figure, str, str]:
    """Show one step of one method from the stored records; the live stream stops overwriting that tree."""
    session = session or Session()
    if session.records(method):
        session.playing, session.play = False, None
    return show_step(session, method, whole_step(step), show_pruned)


def show_step(session: Session, method: str, step: int, show_pruned: bool = True) -> tuple[go.Figure, str, str]:
    """One method's tree, text (that step outlined) and caption at `step`, clamped to its steps; the method's
    panel stays there (it stops following the latest step) when it has records."""
    if session.records(method):
        step = min(max(step, 0), session.last_step(method))
        session.follow[method] = False
        session.shown[method] = step
    rec = session.record(method, step)
    return (tree_view(session, method, step, show_pruned),
            text_view(session, method, rec.step if rec else None), session_caption(session, method, step))


def whole_step(value: object) -> int:
    """A step slider's value as a step number; anything but a finite number of ordinary size is step 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) >= 2**31:
        return 0
    return int(value) if math.isfinite(value) else 0


def follow_latest(session: Session | None, show_pruned: bool = True) -> Update:
    """Go back to showing each method's latest step (and keep following a running decode)."""
    session = session or Session()
    for m in TREE_METHODS:
        session.follow[m] = True
    session.playing, session.play = False, None
    return full_update(session, "Showing the latest step of each method.", show_pruned)


def redraw(session: Session | None, steps: dict[str, float | None], show_pruned: bool) -> dict[str, go.Figure]:
    """Both trees again at the steps the sliders show (after the 'show pruned' switch changes)."""
    session = session or Session()
    return {m: tree_view(session, m, None if session.follow.get(m, True) else steps.get(m), show_pruned)
            for m in TREE_METHODS}


def enqueue(control: RunControl | None) -> str:
    """Generate was clicked: count a run as waiting for the model (the queued decode follows this at once)."""
    if control is not None:
        control.waiting += 1
    return ("Waiting for the model: one decode runs at a time, so Generate queues (your place and an estimate "
            "show on the outputs). Stop takes you out of the queue.")


def request_stop(control: RunControl | None) -> str:
    """Stop: ask the running decode to end after its current step (it then draws what it produced); runs still
    waiting in the queue are taken out (each ends at once when its turn comes, without decoding)."""
    if control is None:
        return "Nothing is running."
    waiting = control.waiting - control.skip
    if waiting > 0:
        control.skip = control.waiting
    if control.running:
        control.stop_requested = True
        return "Stopping after the current step…"
    if waiting > 0:
        return "Taken out of the queue: nothing was decoded. Generate again at any time."
    return "Nothing is running."


def export(session: Session | None) -> tuple[str | None, str | None]:
    """(path of the trace file, None) or (None, message) when there is nothing to export."""
    try:
        return str(export_trace(session or Session())), None
    except ValueError as e:
        return None, str(e)


def load_trace(path: str | None, show_pruned: bool = True) -> Update:
    """Replay a trace file without a model; a bad file gives an Update with `error` (the page keeps its run)."""
    if not path or not isinstance(path, str):
        return Update(session=None, status="No file.", error="no trace file was given: upload an exported trace")
    p = Path(path)
    try:
        if p.stat().st_size > MAX_TRACE_BYTES:  # refused before it is read into memory
            raise ValueError(f"trace file is larger than {MAX_TRACE_BYTES // 2**20} MB: export a shorter run")
        session = import_trace(p.read_bytes(), name=p.name)
    except (OSError, ValueError) as e:
        msg = f"could not load {shown(p.name)}: {e}"
        return Update(session=None, status=f"⚠ {msg}", error=msg)
    meta = session.meta
    device = (meta.device or "unknown model")[:200]
    info = (f"Replaying trace **{p.name}** (no model needed): recorded with {device}"
            f"{', prompt: ' + repr(meta.prompt[:80]) if meta.prompt else ''}.")
    try:
        u = full_update(session, f"Loaded trace {p.name}. Drag a step slider to see any step.", show_pruned,
                        done=True)
    except Exception as e:  # it passed the checks but cannot be drawn: say so; the page keeps its run
        log.warning("trace %s could not be drawn: %s", shown(p.name), type(e).__name__)
        msg = f"could not show {shown(p.name)}: a field of it has a shape the page cannot draw ({type(e).__name__})"
        return Update(session=None, status=f"⚠ {msg}", error=msg)
    u.model_info = info
    return u
