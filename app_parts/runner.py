"""The Generate button: run EAGLE-2 and EAGLE-1 interleaved step by step, then plain decoding, and stream views.

Both decoders advance in turn (one step each), so their trees grow together on the page. Views are
built between generator resumes, never inside the engine's timed phases, and a Throttle keeps the
time spent on them (building plus the page's round trip) under a small share of the decode time.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import plotly.graph_objects as go

from app_parts.presets import ModelPreset, describe_preset, in_use, load_presets, repo_relative
from app_parts.session import TREE_METHODS, RunControl, Session
from app_parts.settings import RunRequest, check_prompt, configs, settings_meta
from app_parts.views import LABELS, analysis_views, metrics_markdown, step_caption, text_view, tree_view
from eagle2.api import decoder_for, encode_prompt, stream
from eagle2.loading import Bundle

log = logging.getLogger(__name__)


@dataclass
class Update:
    """One yield of the run: the session (None = keep the page's), a status line, and rebuilt views (None = keep)."""

    session: Session | None
    status: str
    trees: dict[str, go.Figure] | None = None
    texts: dict[str, str] | None = None
    captions: dict[str, str] | None = None
    metrics: str | None = None
    analysis: tuple[go.Figure, ...] | None = None
    model_info: str | None = None
    error: str | None = None
    done: bool = False


class Throttle:
    """Says when a view update is due: at most every `interval` s, overhead kept under `budget` of the run, and
    never more than `max_wait` s without one (one expensive update, booked as the next one's cost too, would
    otherwise hold the next back for 2/budget times its cost: 20 s for a 0.5 s update at 5%)."""

    def __init__(self, interval: float = 0.3, budget: float = 0.05, max_wait: float = 2.0,
                 clock: Callable[[], float] = time.perf_counter):
        self.interval, self.budget, self.max_wait, self.clock = interval, budget, max_wait, clock
        self.start = clock()
        self.last = -float("inf")
        self.spent = 0.0   # seconds spent on updates so far
        self.cost = 0.0    # seconds the last update took

    def due(self) -> bool:
        """True when enough time has passed and one more update keeps the overhead within budget, or when the
        page has waited `max_wait` s since the last update ended."""
        now = self.clock()
        if now - self.last < self.interval:
            return False
        return self.spent + self.cost <= self.budget * (now - self.start) or now - self.last >= self.max_wait

    def add(self, seconds: float) -> None:
        """Book the time one update took."""
        self.spent += seconds
        self.cost = seconds
        self.last = self.clock()


def full_update(session: Session, status: str, show_pruned: bool = True, done: bool = False) -> Update:
    """Every view rebuilt from the session (end of a run, Stop, a loaded trace); scrubbed trees stay put."""
    follow = [m for m in TREE_METHODS if session.follow.get(m, True)]
    return Update(
        session=session, status=status, done=done,
        trees={m: tree_view(session, m, None, show_pruned) for m in follow},
        texts={m: text_view(session, m) for m in follow},
        captions={m: step_caption(session.record(m)) for m in follow},
        metrics=metrics_markdown(session), analysis=analysis_views(session))


def _live_update(session: Session, show_pruned: bool) -> Update:
    """Latest tree (for methods the visitor is not scrubbing), text and metrics."""
    follow = [m for m in TREE_METHODS if session.follow.get(m, True)]
    return Update(session=session, status=_progress(session),
                  trees={m: tree_view(session, m, None, show_pruned) for m in follow},
                  texts={m: text_view(session, m) for m in follow},
                  captions={m: step_caption(session.record(m)) for m in follow},
                  metrics=metrics_markdown(session))


def _vanilla_update(session: Session) -> Update:
    """Progress of the plain-decoding run: a status line and the metrics table."""
    n = sum(len(r.new_tokens) for r in session.records("vanilla"))
    return Update(session=session, status=f"Plain decoding of the same prompt, for the speedup: {n} tokens…",
                  metrics=metrics_markdown(session))


def _progress(session: Session) -> str:
    parts = [f"{LABELS[m]}: {sum(len(r.new_tokens) for r in session.records(m))} tokens, "
             f"step {session.last_step(m)}" for m in TREE_METHODS]
    return "Decoding… " + " · ".join(parts)


def _decode_interleaved(session: Session, gens: dict[str, Iterator], view: Callable[[Session], Update],
                        throttle: Throttle, control: RunControl) -> Iterator[Update]:
    """Advance each decoder by one step in turn until done or Stop; yield a live view when the throttle allows."""
    while gens and not control.stop_requested:
        for m in list(gens):
            t0 = time.perf_counter()
            rec = next(gens[m], None)
            session.decode_s[m] = session.decode_s.get(m, 0.0) + time.perf_counter() - t0
            if rec is None:
                del gens[m]
            else:
                session.runs.setdefault(m, []).append(rec)
        if gens and throttle.due():
            t0 = time.perf_counter()
            yield view(session)
            dt = time.perf_counter() - t0  # building the views plus the page's round trip
            throttle.add(dt)
            session.overhead_s += dt


def generate(req: RunRequest, get_bundle: Callable[[ModelPreset], Bundle], show_pruned: bool = True,
             throttle: Throttle | None = None, control: RunControl | None = None) -> Iterator[Update]:
    """The whole Generate action as a stream of page updates; bad input yields one Update with `error`.

    Stop is cooperative: `control.stop_requested` ends the run after the current step, and the last
    update draws everything produced so far (Gradio's `cancels` can leave the page in an error state
    when it lands during a step).
    """
    control = control or RunControl()
    control.running, control.stop_requested = True, False
    try:
        yield from _generate(req, get_bundle, show_pruned, throttle or Throttle(), control)
    except (ValueError, RuntimeError) as e:  # a failure inside the decoder: say what, keep the page working
        log.exception("decoding failed")
        yield Update(session=None, status=f"⚠ decoding failed: {e}", error=f"decoding failed: {e}")
    finally:
        control.running = False


def _generate(req: RunRequest, get_bundle: Callable[[ModelPreset], Bundle], show_pruned: bool, throttle: Throttle,
              control: RunControl) -> Iterator[Update]:
    try:
        check_prompt(req.prompt)
        cfgs = configs(req)
        presets = load_presets()
        if req.preset not in presets:
            raise ValueError(f"unknown model preset {req.preset!r}; choose one from the list")
        preset = presets[req.preset]
    except ValueError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e))
        return
    yield Update(session=None, status=f"Preparing {preset.name}…")
    try:
        bundle = get_bundle(preset)
    except RuntimeError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e), model_info=describe_preset(preset))
        return
    ids = encode_prompt(bundle.tokenizer, req.prompt)
    try:  # the engine's own rule: room in the context for the answer and the draft tree
        for m in TREE_METHODS:
            decoder_for(bundle).check_prompt(ids, cfgs[m])
    except ValueError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e))
        return
    session = Session(source="live")
    session.meta = {"model": bundle.model_name, "head": repo_relative(bundle.head_name),
                    "device": repo_relative(bundle.describe()),
                    "preset": preset.name, "prompt": req.prompt, "prompt_tokens": len(ids),
                    "settings": settings_meta(cfgs, req), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    session.runs = {m: [] for m in TREE_METHODS}
    yield Update(session=session, status="Decoding…", model_info=in_use(bundle))

    gens = {m: stream(bundle, ids, cfgs[m]) for m in TREE_METHODS}
    yield from _decode_interleaved(session, gens, lambda s: _live_update(s, show_pruned), throttle, control)
    if req.with_vanilla and not control.stop_requested:
        yield full_update(session, "Plain decoding of the same prompt, for the speedup…", show_pruned)
        session.runs["vanilla"] = []
        yield from _decode_interleaved(session, {"vanilla": stream(bundle, ids, cfgs["vanilla"])},
                                       _vanilla_update, throttle, control)
    if control.stop_requested:
        yield full_update(session, _stopped_status(session), show_pruned, done=True)
        return
    # Wall time inside each decoder vs time spent on views between resumes: the streaming overhead.
    session.meta["page_timing"] = {"decode_s": {m: round(t, 3) for m, t in session.decode_s.items()},
                                   "views_s": round(session.overhead_s, 3)}
    yield full_update(session, _done_status(session), show_pruned, done=True)


def _stopped_status(session: Session) -> str:
    tokens = ", ".join(f"{LABELS[m]} {sum(len(r.new_tokens) for r in session.records(m))} tokens"
                       for m in session.runs)
    return f"Stopped. Kept what was produced: {tokens}. Generate again at any time."


def _done_status(session: Session) -> str:
    steps = " · ".join(f"{LABELS[m]}: {session.last_step(m)} steps" for m in TREE_METHODS)
    return f"Done. {steps}. Drag a step slider to see any step again."
