"""The Generate button: decode with EAGLE-2, EAGLE-1 and plain decoding in turn, timed as the bench times them,
then draw every view from the records.

Nothing is drawn while a method decodes: a figure built, serialised, sent and rendered on the same cores
would land inside the timed phases (and a visitor would read the page's drawing as the decoder's speed).
Each method runs to the end with the garbage collector paused (the server holds many objects, and a
collection inside a phase costs more than the phase), and its tokens/s is its whole decode's wall time, prefill
included, as `python -m eagle2 bench` measures it. Between steps only a short status line is sent.

A run may have a wall-clock budget: each method gets an equal share of what is left of it when its turn
comes (so plain decoding still runs when EAGLE-2 is slow), checked between steps as Stop is, and a method
past its share ends as Stop ends it, its output kept.
"""
from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import plotly.graph_objects as go

from app_parts.presets import ModelPreset, describe_preset, in_use, load_presets, repo_relative
from app_parts.session import TREE_METHODS, RunControl, Session, bound_faded
from app_parts.settings import RunRequest, check_prompt, configs, settings_meta
from app_parts.views import analysis_views, label, metrics_markdown, session_caption, text_view, tree_view
from eagle2.api import decoder_for, encode_prompt, stream
from eagle2.loading import Bundle

log = logging.getLogger(__name__)
STATUS_EVERY_S = 1.0  # how often the status line reports progress while a method decodes


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
    follow = [m for m in TREE_METHODS if session.follow.get(m, True)]
    return Update(
        session=session, status=status, done=done,
        trees={m: tree_view(session, m, None, show_pruned) for m in follow},
        texts={m: text_view(session, m) for m in follow},
        captions={m: session_caption(session, m) for m in follow},
        metrics=metrics_markdown(session), analysis=analysis_views(session))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection while a decoder runs (it is switched back on, as it was, between steps)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Budget:
    """A run's wall-clock budget shared between its methods: each may use an equal part of what is left when it
    starts. `clock` is a parameter so that tests can drive it."""

    def __init__(self, seconds: float, methods: int, clock: Callable[[], float] = time.perf_counter):
        self.seconds, self.left_to_start, self.clock = seconds, methods, clock
        self.t0 = self.deadline = None

    def start_method(self) -> float:
        """The next method starts: its deadline on `clock`, now plus its share of the time left."""
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        share = max(self.seconds - (now - self.t0), 0.0) / max(self.left_to_start, 1)
        self.left_to_start -= 1
        self.deadline = now + share
        return share

    def over(self) -> bool:
        """Whether the running method has used its share."""
        return self.deadline is not None and self.clock() >= self.deadline


def _complete(recs: list, max_new_tokens: int, eos: set[int]) -> bool:
    """Whether a method's records already end its run (the token limit reached, or an end-of-sequence token)."""
    tokens = [t for r in recs for t in r.new_tokens]
    return len(tokens) >= max_new_tokens or any(t in eos for t in tokens[-1:])


def _decode_timed(session: Session, gens: dict[str, Iterator], control: RunControl,
                  budget: Budget | None = None, complete: Callable[[str, list], bool] | None = None
                  ) -> Iterator[Update]:
    """Run each method to the end (or Stop, or the end of its share of the budget) in turn, timing only the
    decoder: the wall time of its steps, the prefill included. Between steps a status line goes out at most every
    STATUS_EVERY_S; nothing else. A method its share cut short (its records not `complete`) is noted in
    session.meta["budget"]["cut"] with its share in seconds."""
    last = time.perf_counter()
    for i, (m, gen) in enumerate(gens.items(), start=1):
        if control.stop_requested:
            break
        recs = session.runs.setdefault(m, [])
        session.decode_s[m] = 0.0
        share = budget.start_method() if budget else None
        while not control.stop_requested:
            if budget and budget.over():
                if not (complete and complete(m, recs)):
                    session.meta["budget"]["cut"][m] = round(share, 1)
                break
            with _collector_paused():
                t0 = time.perf_counter()
                rec = next(gen, None)
                session.decode_s[m] += time.perf_counter() - t0
            if rec is None:
                break
            recs.append(rec)
            if time.perf_counter() - last >= STATUS_EVERY_S:
                last = time.perf_counter()
                yield Update(session=session, status=_progress(session, m, i, len(gens)))


def _progress(session: Session, method: str, i: int, n: int) -> str:
    tokens = sum(len(r.new_tokens) for r in session.records(method))
    return (f"Decoding {i} of {n}: {label(session, method)}: {tokens} tokens, step {session.last_step(method)} "
            f"(nothing is drawn until the decodes end, so that the timings are the decoder's alone)…")


def generate(req: RunRequest, get_bundle: Callable[[ModelPreset], Bundle], show_pruned: bool = True,
             control: RunControl | None = None,
             get_profile: Callable[[ModelPreset, Bundle], dict | None] | None = None,
             budget_s: float | None = None, clock: Callable[[], float] = time.perf_counter) -> Iterator[Update]:
    """The whole Generate action as a stream of page updates; bad input yields one Update with `error`.

    Stop is cooperative: `control.stop_requested` ends the run after the current step, and the last
    update draws everything produced so far (Gradio's `cancels` can leave the page in an error state
    when it lands during a step). A run Stop took out of the queue ends at once, before anything loads.
    `budget_s` bounds the decoding's wall time on `clock` (None: no bound), shared between the methods.
    """
    control = control or RunControl()
    if not control.take_turn():
        yield Update(session=None, status="Stopped before it started: this run left the queue without decoding. "
                                           "Generate again at any time.", done=True)
        return
    try:
        yield from _generate(req, get_bundle, show_pruned, control, get_profile, budget_s, clock)
    except (ValueError, RuntimeError) as e:  # a failure inside the decoder: say what, keep the page working
        log.exception("decoding failed")
        yield Update(session=None, status=f"⚠ decoding failed: {e}", error=f"decoding failed: {e}")
    finally:
        control.running = False


def _generate(req: RunRequest, get_bundle: Callable[[ModelPreset], Bundle], show_pruned: bool,
              control: RunControl, get_profile, budget_s: float | None, clock: Callable[[], float]
              ) -> Iterator[Update]:
    try:
        check_prompt(req.prompt)
        configs(req)  # every setting checked before anything loads
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
        profile = get_profile(preset, bundle) if get_profile and req.sizing == "tuned" else None
    except RuntimeError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e), model_info=describe_preset(preset))
        return
    cfgs = configs(req, profile)
    ids = encode_prompt(bundle.tokenizer, req.prompt)
    try:  # the engine's own rule: room in the context for the answer and the draft tree
        for m in TREE_METHODS:
            decoder_for(bundle).check_prompt(ids, cfgs[m])
    except ValueError as e:
        yield Update(session=None, status=f"⚠ {e}", error=str(e))
        return
    session = Session(source="live")
    session.meta = {"model": bundle.model_name, "head": repo_relative(bundle.head_name), "head_kind": bundle.head_kind,
                    "device": repo_relative(bundle.describe()),
                    "preset": preset.name, "prompt": req.prompt, "prompt_tokens": len(ids),
                    "settings": settings_meta(cfgs, req), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    if profile:
        session.meta["costs"] = {k: profile[k] for k in ("measured", "verify_ms", "rest_ms")}
    sizes = {k: getattr(cfgs["eagle2"], k) for k in ("total_tokens", "depth", "top_k")}
    yield Update(session=None, status="Decoding…", model_info=in_use(bundle), sizes=sizes)
    methods = [*TREE_METHODS, *(["vanilla"] if req.with_vanilla else [])]
    gens = {m: stream(bundle, ids, cfgs[m], should_stop=lambda: control.stop_requested) for m in methods}
    budget = None
    if budget_s is not None:
        budget = Budget(budget_s, len(methods), clock)
        session.meta["budget"] = {"seconds": round(budget_s, 1), "cut": {}}
    eos = decoder_for(bundle).eos

    def complete(m: str, recs: list) -> bool:
        return _complete(recs, cfgs[m].max_new_tokens, eos)

    yield from _decode_timed(session, gens, control, budget, complete)
    session.meta["page_timing"] = {"decode_s": {m: round(t, 4) for m, t in session.decode_s.items()}}
    bound_faded(session)  # after the timed decodes: memory per visitor stays bounded
    if control.stop_requested:
        yield full_update(session, _stopped_status(session), show_pruned, done=True)
        return
    if session.meta.get("budget", {}).get("cut"):
        yield full_update(session, _stopped_status(session, by_budget=True), show_pruned, done=True)
        return
    yield full_update(session, _done_status(session), show_pruned, done=True)


def _stopped_status(session: Session, by_budget: bool = False) -> str:
    tokens = ", ".join(f"{label(session, m)} {sum(len(r.new_tokens) for r in session.records(m))} tokens"
                       for m in session.runs)
    if by_budget:
        b = session.meta["budget"]
        cut = ", ".join(f"{label(session, m)} after its {share:g} s" for m, share in b["cut"].items())
        return (f"Stopped at the time limit: a Generate may decode for {b['seconds']:g} s, shared between the "
                f"methods, and it cut {cut}. Kept what was produced: {tokens}. Ask for fewer tokens to see "
                "every method to the end.")
    return f"Stopped. Kept what was produced: {tokens}. Generate again at any time."


def _done_status(session: Session) -> str:
    steps = " · ".join(f"{label(session, m)}: {session.last_step(m)} steps" for m in TREE_METHODS)
    return f"Done. {steps}. Drag a step slider to see any step again."
