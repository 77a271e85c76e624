"""The Generate button: a live pass that draws both trees as they grow, then a timed pass with nothing drawn.

Live pass: EAGLE-2 and EAGLE-1 decode one step each in turn, so that EAGLE-2's step k stands beside EAGLE-1's
step k, and the page redraws both panels in one update at most every LIVE_EVERY_S, each with its newest step
(never a backlog of old ones), decoding at most one step per LIVE_STEP_S so that the trees can be watched on a
fast machine. Nothing of it is timed: building, serialising and sending figures share the cores with the
decoder.

Timed pass: the same decodes again (plain decoding too), with nothing drawn meanwhile. The methods take turns
step by step, the first of each round rotating, so that no method is favoured by coming first or by whatever
else the machine does during the run; each method's tokens/s is the wall time of its own steps, prefill
included, as `python -m eagle2 bench` counts it, with the garbage collector paused inside each step. Between
steps only a short status line goes out. With greedy decoding both passes must give the same tokens; the
page checks it and says so if they ever differ. The records the page keeps are the timed pass's.

A run may have a wall-clock budget, covering both passes: the live pass may use its share (two decodes of the
run's four or five), the timed pass what is left. Either pass ends as Stop ends it when its time runs out, and
keeps its output. Loading and tuning report progress on the status line (one progress line, not an overlay).
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import plotly.graph_objects as go

from app_parts import engine_thread
from app_parts.meta import Costs, RunMeta, TimeLimit, Timing
from app_parts.presets import ModelPreset, describe_preset, in_use, load_presets, repo_relative
from app_parts.session import TREE_METHODS, RunControl, Session, bound_faded
from app_parts.settings import MAX_PROMPT_CHARS, RunRequest, check_prompt, configs, settings_meta
from app_parts.views import (analysis_views, label, metrics_markdown, passes_note, session_caption, text_view,
                             tree_view)
from eagle2.api import decoder_for, encode_prompt, stream
from eagle2.inputs import check_text
from eagle2.loading import Bundle
from eagle2.policies import DYNAMIC, PLAIN
from eagle2.tools.bench import turns
from eagle2.tools.profile import check_profile

log = logging.getLogger(__name__)
STATUS_EVERY_S = 1.0   # how often the status line reports progress in the timed pass and while loading
LIVE_EVERY_S = 0.25    # the live pass redraws both trees at most 4 times a second, each time their newest steps
LIVE_STEP_S = 0.1      # and decodes at most 10 steps a second, so that a fast machine's trees can still be watched
SETTLE_S = 0.3         # a pause between the passes: the browser finishes drawing the last live frame first

Progress = Callable[[float, str], None]


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
    sizes: dict | None = None  # EAGLE-2's total tokens, depth and top-k as run (the page's sliders follow)


def full_update(session: Session, status: str, show_pruned: bool = True, done: bool = False) -> Update:
    """Every view rebuilt from the session (end of a run, Stop, a loaded trace); scrubbed trees stay put."""
    u = live_update(session, status, show_pruned)
    u.done, u.metrics, u.analysis = done, metrics_markdown(session), analysis_views(session)
    return u


def live_update(session: Session, status: str, show_pruned: bool = True) -> Update:
    """The trees, texts and captions of each followed method's newest step, in one update."""
    follow = [m for m in TREE_METHODS if session.follow.get(m, True)]
    return Update(session=session, status=status,
                  trees={m: tree_view(session, m, None, show_pruned) for m in follow},
                  texts={m: text_view(session, m) for m in follow},
                  captions={m: session_caption(session, m) for m in follow})


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection while a decoder step runs (it is switched back on, as it was, between steps)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Budget:
    """A run's wall-clock budget shared between its passes: each pass may use its share of what is left when it
    starts. `clock` is a parameter so that tests can drive it."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter):
        self.seconds, self.clock = seconds, clock
        self.t0 = self.deadline = None

    def start(self, share: float = 1.0) -> float:
        """A pass starts: its deadline on `clock` is now plus `share` of the time left; returns its seconds."""
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        seconds = max(self.seconds - (now - self.t0), 0.0) * share
        self.deadline = now + seconds
        return seconds

    def over(self) -> bool:
        """Whether the running pass has used its share."""
        return self.deadline is not None and self.clock() >= self.deadline


def _tokens(recs: list) -> list[int]:
    return [t for r in recs for t in r.new_tokens]


def _complete(recs: list) -> bool:
    """Whether a method's records end its run by the engine's own rule (the last record says why it stopped: an
    end-of-sequence token or the token limit; not a Stop)."""
    return bool(recs) and recs[-1].stop in ("eos", "max_new_tokens")


def _live_pass(session: Session, gens: dict[str, Iterator], control: RunControl, budget: Budget | None,
               show_pruned: bool, clock: Callable[[], float]) -> Iterator[Update]:
    """Decode the tree methods a step each in turn into `session.runs`, drawing both newest steps at most every
    LIVE_EVERY_S and once more at the end. Returns (via StopIteration) whether its time share ran out."""
    active = dict(gens)
    for m in active:
        session.runs[m] = []
    drawn, shown = -LIVE_EVERY_S, None
    cut = False
    while active and not control.stop_requested:
        if budget and budget.over():
            cut = True
            break
        began = time.perf_counter()
        for m in list(active):
            rec = next(active[m], None)
            if rec is None:
                del active[m]
            else:
                session.runs[m].append(rec)
        if active and clock() - drawn >= LIVE_EVERY_S:
            shown = [session.last_step(m) for m in gens]
            yield live_update(session, _live_status(session), show_pruned)
            drawn = clock()  # after the page took the update: at least LIVE_EVERY_S of decoding between redraws
        rest = LIVE_STEP_S - (time.perf_counter() - began)
        if active and rest > 0:  # untimed pass: pacing it changes no number on the page
            time.sleep(rest)
    if shown != [session.last_step(m) for m in gens]:  # the newest steps, if the last redraw did not show them
        yield live_update(session, _live_status(session), show_pruned)
    return cut


def _live_status(session: Session) -> str:
    steps = " · ".join(f"{label(session, m)} step {session.last_step(m)}" for m in TREE_METHODS if m in session.runs)
    return f"Live pass (drawn as it decodes, not timed): {steps}…"


def _timed_pass(session: Session, gens: dict[str, Iterator], control: RunControl, budget: Budget | None,
                complete: Callable[[str, list], bool], clock: Callable[[], float]) -> Iterator[Update]:
    """Decode every method a step each in turn, the first of each round rotating, timing only each method's own
    steps into `session.decode_s`; a status line at most every STATUS_EVERY_S. Returns (via StopIteration) the
    records per method; the page keeps showing the live pass's meanwhile. Methods still running when the
    budget's share ran out (and not `complete`) are listed in session.meta.limit.cut."""
    active = list(gens)
    timed: dict[str, list] = {m: [] for m in active}
    session.decode_s = {m: 0.0 for m in active}
    share = budget.start() if budget else None
    last, rnd = time.perf_counter(), 0
    while active and not control.stop_requested:
        if budget and budget.over():
            for m in active:
                if not complete(m, timed[m]):
                    session.meta.limit.cut[m] = round(share, 1)
            break
        turn = turns(active, rnd)
        rnd += 1
        for m in turn:
            with _collector_paused():
                t0 = clock()
                rec = next(gens[m], None)
                session.decode_s[m] += clock() - t0
            if rec is None:
                active.remove(m)
            else:
                timed[m].append(rec)
        if time.perf_counter() - last >= STATUS_EVERY_S:
            last = time.perf_counter()
            yield Update(session=None, status=_timed_status(session, timed))
    return timed


def _timed_status(session: Session, timed: dict[str, list]) -> str:
    tokens = " · ".join(f"{label(session, m)} {len(_tokens(recs))} tokens" for m, recs in timed.items())
    return f"Timed pass (nothing drawn, so that tokens/s is the decoder's alone): {tokens}…"


def _in_background(work: Callable[[Progress], object], what: str) -> Iterator[Update]:
    """Run `work(progress)` in a thread, yielding its newest progress message as the status line at most every
    STATUS_EVERY_S; returns its result (via StopIteration) or raises what it raised. On the engine thread (the
    page's runs, app_parts/engine_thread.py) the work runs right there, where the decodes it prepares run, and
    the caller waiting on that thread shows its progress."""
    if engine_thread.here():
        return engine_thread.noting(work, what)
    said, out = [what], {}

    def progress(_fraction: float, message: str) -> None:
        said[0] = message

    def target() -> None:
        try:
            out["value"] = work(progress)
        except BaseException as e:  # handed back to the generator's thread below
            out["error"] = e

    thread = threading.Thread(target=target, name="eagle2-load", daemon=True)
    thread.start()
    shown = None
    while thread.is_alive():
        thread.join(STATUS_EVERY_S / 4)
        if said[0] != shown and thread.is_alive():
            shown = said[0]
            yield Update(session=None, status=shown)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def generate(req: RunRequest, get_bundle: Callable[[ModelPreset, Progress], Bundle], show_pruned: bool = True,
             control: RunControl | None = None,
             get_profile: Callable[[ModelPreset, Bundle, Progress], dict | None] | None = None,
             budget_s: float | None = None, clock: Callable[[], float] = time.perf_counter,
             profile_stale: Callable[[ModelPreset, Bundle], None] | None = None) -> Iterator[Update]:
    """The whole Generate action as a stream of page updates; bad input yields one Update with `error`.

    Stop is cooperative: `control.stop_requested` ends the run after the current step, and the last
    update draws everything produced so far (Gradio's `cancels` can leave the page in an error state
    when it lands during a step). A run Stop took out of the queue ends at once, before anything loads.
    `budget_s` bounds both passes' wall time on `clock` (None: no bound). `profile_stale(preset, bundle)` is
    called when this run's timed verify cost contradicts the machine profile (`check_profile`): it is measured
    again on the next run.
    """
    control = control or RunControl()
    if not control.take_turn():
        yield Update(session=None, status="Stopped before it started: this run left the queue without decoding. "
                                           "Generate again at any time.", done=True)
        return
    try:
        yield from _generate(req, get_bundle, show_pruned, control, get_profile, budget_s, clock, profile_stale)
    except (ValueError, RuntimeError) as e:  # a failure inside the decoder: say what, keep the page working
        log.exception("decoding failed")
        yield Update(session=None, status=f"⚠ decoding failed: {e}", error=f"decoding failed: {e}")
    except Exception as e:  # never an internal error as such: say what kind, keep the visitor's run
        log.exception("Generate failed unexpectedly")
        msg = f"this request could not be run ({type(e).__name__}); your last run is kept: check the settings"
        yield Update(session=None, status=f"⚠ {msg}", error=msg)
    finally:
        control.running = False


def _prepare(req: RunRequest, get_bundle, get_profile) -> Iterator[Update]:
    """Check the request, load the model and the machine's profile (status lines meanwhile); returns
    (preset, bundle, profile, configs, prompt ids), or None after an Update with `error`."""
    try:
        check_prompt(req.prompt)
        configs(req)  # every setting checked before anything loads
        presets = load_presets()
        check_text("model preset", req.preset, MAX_PROMPT_CHARS, presets)
        preset = presets[req.preset]
    except ValueError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e))
        return None
    yield Update(session=None, status=f"Preparing {preset.name}…")
    try:
        bundle = yield from _in_background(lambda say: get_bundle(preset, say), f"Loading {preset.name}…")
        profile = None
        if get_profile and req.sizing == "tuned":
            profile = yield from _in_background(lambda say: get_profile(preset, bundle, say),
                                                "Tuning the tree size for this machine…")
    except RuntimeError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e), model_info=describe_preset(preset))
        return None
    cfgs = configs(req, profile)
    ids = encode_prompt(bundle.tokenizer, req.prompt)
    try:  # the engine's own rule: room in the context for the answer and the draft tree
        for m in TREE_METHODS:
            decoder_for(bundle).check_prompt(ids, cfgs[m])
    except ValueError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e))
        return None
    return preset, bundle, profile, cfgs, ids


def _generate(req: RunRequest, get_bundle, show_pruned: bool, control: RunControl, get_profile,
              budget_s: float | None, clock: Callable[[], float], profile_stale=None) -> Iterator[Update]:
    ready = yield from _prepare(req, get_bundle, get_profile)
    if ready is None:
        return
    preset, bundle, profile, cfgs, ids = ready
    session = Session(source="live")
    session.meta = RunMeta(model=bundle.model_name, head=repo_relative(bundle.head_name), head_kind=bundle.head_kind,
                           device=repo_relative(bundle.describe()), preset=preset.name, prompt=req.prompt,
                           prompt_tokens=len(ids), settings=settings_meta(cfgs, req),
                           created=time.strftime("%Y-%m-%d %H:%M:%S"))
    if profile:
        session.meta.costs = Costs(measured=profile.get("measured", ""), how=profile.get("how", ""),
                                   verify_ms={int(n): ms for n, ms in profile["verify_ms"].items()},
                                   rest_ms={int(d): ms for d, ms in profile["rest_ms"].items()})
    own = req.left_policy == DYNAMIC  # the left panel runs the page's EAGLE-2, sized by the controls (or tuned)
    sizes = {k: getattr(cfgs[DYNAMIC], k) for k in ("total_tokens", "depth", "top_k")} if own else None
    yield Update(session=session, status="Live pass…", model_info=in_use(bundle), sizes=sizes)
    methods = [*TREE_METHODS, *(["vanilla"] if req.with_vanilla else [])]
    budget = None
    if budget_s is not None:
        budget = Budget(budget_s, clock)
        session.meta.limit = TimeLimit(seconds=round(budget_s, 1))
        budget.start(len(TREE_METHODS) / (len(TREE_METHODS) + len(methods)))

    def decodes(which) -> dict[str, Iterator]:
        return {m: stream(bundle, ids, cfgs[m], should_stop=lambda: control.stop_requested) for m in which}

    live_cut = yield from _live_pass(session, decodes(TREE_METHODS), control, budget, show_pruned, clock)
    live = {m: _tokens(session.records(m)) for m in TREE_METHODS}
    if control.stop_requested:
        bound_faded(session)
        yield full_update(session, _stopped_status(session), show_pruned, done=True)
        return
    yield Update(session=None, status="Timed pass: decoding again with nothing drawn…")
    gc.collect()  # the live pass's figures, collected now rather than inside a timed step
    time.sleep(SETTLE_S)
    timed = yield from _timed_pass(session, decodes(methods), control, budget,
                                   lambda m, recs: _complete(recs), clock)
    if control.stop_requested:  # a timed pass cut by Stop times nothing whole: keep the live trees, untimed
        session.runs.update({m: recs for m, recs in timed.items() if m not in session.runs})
        session.decode_s = {}
        bound_faded(session)
        yield full_update(session, _stopped_status(session), show_pruned, done=True)
        return
    session.runs.update(timed)
    session.meta.timing = Timing(decode_s={m: round(t, 4) for m, t in session.decode_s.items()}, live_cut=live_cut,
                                 same_tokens=_same_tokens(session, live))
    if profile and own:  # the profile against the steps this run has just timed
        check = check_profile(profile, session.records(DYNAMIC), cfgs[DYNAMIC].total_tokens,
                              plain=session.records(PLAIN) if PLAIN in session.runs else None)
        if check is not None:
            session.meta.costs.check = check
            if not check["ok"] and profile_stale is not None:
                profile_stale(preset, bundle)
    bound_faded(session)  # after the timed decodes: memory per visitor stays bounded
    if session.meta.limit and session.meta.limit.cut:
        status = _stopped_status(session, by_budget=True)
    else:
        status = _done_status(session)
    yield full_update(session, status + passes_note(session, problems_only=True), show_pruned, done=True)


def _same_tokens(session: Session, live: dict[str, list[int]]) -> dict[str, bool | int]:
    """Per tree method, whether the live pass's tokens equal the timed pass's (as far as both went): True, or the
    first token where they differ."""
    out: dict[str, bool | int] = {}
    for m, a in live.items():
        b = _tokens(session.records(m))
        diff = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
        out[m] = True if diff is None else diff
    return out


def _stopped_status(session: Session, by_budget: bool = False) -> str:
    tokens = ", ".join(f"{label(session, m)} {len(_tokens(session.records(m)))} tokens" for m in session.runs)
    if by_budget:
        b = session.meta.limit
        cut = ", ".join(f"{label(session, m)}" for m in b.cut)
        share = next(iter(b.cut.values()))
        return (f"Stopped at the time limit: a Generate may decode for {b.seconds:g} s, both passes together, "
                f"and the timed pass's {share:g} s ended {cut} early. Kept what was produced: {tokens}. Ask for "
                "fewer tokens to see every method to the end.")
    return f"Stopped. Kept what was produced: {tokens}. Generate again at any time."


def _done_status(session: Session) -> str:
    steps = " · ".join(f"{label(session, m)}: {session.last_step(m)} steps" for m in TREE_METHODS)
    return f"Done. {steps}. Press Play to watch both trees again, or drag a step slider."
