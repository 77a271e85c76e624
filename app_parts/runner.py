"""The Generate button: decode with EAGLE-2, EAGLE-1 and plain decoding in turn, timed as the bench times them,
then draw every view from the records.

Nothing is drawn while a method decodes: a figure built, serialised, sent and rendered on the same cores
would land inside the timed phases (and a visitor would read the page's drawing as the decoder's speed).
Each method runs to the end with the garbage collector paused (the server holds many objects, and a
collection inside a phase costs more than the phase), and its tokens/s is its whole decode's wall time, prefill
included, as `python -m eagle2 bench` measures it. Between steps only a short status line is sent.
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
from app_parts.session import TREE_METHODS, RunControl, Session
from app_parts.settings import RunRequest, check_prompt, configs, settings_meta
from app_parts.views import analysis_views, label, metrics_markdown, step_caption, text_view, tree_view
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
        captions={m: step_caption(session.record(m)) for m in follow},
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


def _decode_timed(session: Session, gens: dict[str, Iterator], control: RunControl) -> Iterator[Update]:
    """Run each method to the end (or Stop) in turn, timing only the decoder: the wall time of its steps, the
    prefill included. Between steps a status line goes out at most every STATUS_EVERY_S; nothing else."""
    last = time.perf_counter()
    for i, (m, gen) in enumerate(gens.items(), start=1):
        if control.stop_requested:
            break
        recs = session.runs.setdefault(m, [])
        session.decode_s[m] = 0.0
        while not control.stop_requested:
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
             get_profile: Callable[[ModelPreset, Bundle], dict | None] | None = None) -> Iterator[Update]:
    """The whole Generate action as a stream of page updates; bad input yields one Update with `error`.

    Stop is cooperative: `control.stop_requested` ends the run after the current step, and the last
    update draws everything produced so far (Gradio's `cancels` can leave the page in an error state
    when it lands during a step).
    """
    control = control or RunControl()
    control.running, control.stop_requested = True, False
    try:
        yield from _generate(req, get_bundle, show_pruned, control, get_profile)
    except (ValueError, RuntimeError) as e:  # a failure inside the decoder: say what, keep the page working
        log.exception("decoding failed")
        yield Update(session=None, status=f"⚠ decoding failed: {e}", error=f"decoding failed: {e}")
    finally:
        control.running = False


def _generate(req: RunRequest, get_bundle: Callable[[ModelPreset], Bundle], show_pruned: bool,
              control: RunControl, get_profile) -> Iterator[Update]:
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
    session.meta = {"model": bundle.model_name, "head": repo_relative(bundle.head_name),
                    "device": repo_relative(bundle.describe()),
                    "preset": preset.name, "prompt": req.prompt, "prompt_tokens": len(ids),
                    "settings": settings_meta(cfgs, req), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    if profile:
        session.meta["costs"] = {k: profile[k] for k in ("measured", "verify_ms", "rest_ms")}
    sizes = {k: getattr(cfgs["eagle2"], k) for k in ("total_tokens", "depth", "top_k")}
    yield Update(session=None, status="Decoding…", model_info=in_use(bundle), sizes=sizes)
    methods = [*TREE_METHODS, *(["vanilla"] if req.with_vanilla else [])]
    gens = {m: stream(bundle, ids, cfgs[m], should_stop=lambda: control.stop_requested) for m in methods}
    yield from _decode_timed(session, gens, control)
    session.meta["page_timing"] = {"decode_s": {m: round(t, 4) for m, t in session.decode_s.items()}}
    if control.stop_requested:
        yield full_update(session, _stopped_status(session), show_pruned, done=True)
        return
    yield full_update(session, _done_status(session), show_pruned, done=True)


def _stopped_status(session: Session) -> str:
    tokens = ", ".join(f"{label(session, m)} {sum(len(r.new_tokens) for r in session.records(m))} tokens"
                       for m in session.runs)
    return f"Stopped. Kept what was produced: {tokens}. Generate again at any time."


def _done_status(session: Session) -> str:
    steps = " · ".join(f"{label(session, m)}: {session.last_step(m)} steps" for m in TREE_METHODS)
    return f"Done. {steps}. Drag a step slider to see any step again."
