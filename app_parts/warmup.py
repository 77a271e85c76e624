"""What the server prepares at start, so that the first visitor does not wait for it.

On a fresh machine the first Generate used to convert the model (the GGUF dequantised into a cache), build the
row kernel, load the model (its four-bit weights recoded for that kernel, each method warmed up) and measure the
machine profile: about a minute, all of it in front of the first visitor. `start` runs the same steps one after
another in a background thread at server start, through the page's own model cache, so that a Generate uses what
they made instead of making it again. A Generate pressed meanwhile waits for the steps still left, and its status
line names them (the cache calls `Preparation.wait`); the page's status line shows the step in progress until all
are done (`page_status`). A step that fails is logged and recorded, and the steps after it are skipped: the
Generate then loads as it would have without any of this, and shows the error as it always did.

Nothing here holds a lock a page event could wait on: the page reads plain attributes, and the files the steps
write are whole or absent (eagle2/files.py, the converted model's one rename, the row kernel's owner lock).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type hints only: this module is handed the cache, it does not import the model's modules
    from app_parts.presets import BundleCache, ModelPreset

log = logging.getLogger(__name__)
POLL_S = 1.0  # a waiting Generate's status line counts the seconds: it changes, so the page shows it is alive
Progress = Callable[[float, str], None]
Step = tuple[str, str, Callable[[], object]]  # (the step as a noun phrase, what it does, the work)
PREPARING = "Preparing at server start: "  # how the page's status line begins while it shows `page_status`


class Preparation:
    """Named steps run one after another in a daemon thread; which one is running, and what failed, as plain data."""

    def __init__(self, steps: list[Step], clock: Callable[[], float] = time.monotonic) -> None:
        self.steps = steps
        self.clock = clock
        self.index = -1               # the step running now (-1: not started; len(steps): all ended)
        self.error: str | None = None  # the failure that ended the steps early, in words
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.started = clock()

    def start(self) -> Preparation:
        """Run the steps in the background; returns self."""
        self.started = self.clock()
        self.thread = threading.Thread(target=self._run, name="eagle2-prepare", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for i, (_, _, work) in enumerate(self.steps):
                self.index = i
                work()
            print(f"eagle2: prepared at server start in {self.clock() - self.started:.0f} s", file=sys.stderr,
                  flush=True)  # the operator's log says when the first visitor stops waiting
        except Exception as e:  # recorded and logged, not raised: a Generate retries and shows its own error
            log.exception("preparing at server start failed at %s", self.step)
            self.error = f"{self.step} failed ({type(e).__name__}: {e})"
        finally:
            self.index = len(self.steps)
            self.done.set()

    @property
    def step(self) -> str | None:
        """The step running now, or None before and after."""
        i = self.index
        return self.steps[i][0] if 0 <= i < len(self.steps) else None

    def left(self) -> list[str]:
        """The steps not finished yet, the running one first."""
        return [name for name, _, _ in self.steps[max(self.index, 0):]]

    def wait(self, progress: Progress | None = None) -> None:
        """Return once every step has ended (at once when called from a step itself), saying on `progress` what is
        left every POLL_S meanwhile."""
        if self.thread is threading.current_thread():
            return
        while not self.done.is_set():
            if progress is not None:
                progress(0.1, self.waiting_line())
            self.done.wait(POLL_S)

    def waiting_line(self) -> str:
        """A waiting Generate's status line: the step running and those after it."""
        left = self.left()
        if not left:
            return "Waiting for the server's preparation to finish…"
        then = f"then {_and(left[1:])}" if left[1:] else "the last step"
        return (f"Waiting for {left[0]} (started at server start, {self.clock() - self.started:.0f} s ago; {then}); "
                "this Generate runs as soon as it is done…")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def page_status(prep: Preparation | None, shown: str, busy: bool = False,
                loaded: bool = False) -> tuple[str | None, bool]:
    """What the page's status line should say now, and whether to look again in a second.

    (None, _) leaves the line alone: nothing is being prepared, or the line is someone else's (a Generate's
    progress, a link's note), or this visitor's Generate is waiting or running (`busy`). Only a line this function
    wrote, or the page's opening "Ready.", is replaced. A failed preparation is reported until a model is
    `loaded` after all (a Generate's own try succeeded)."""
    if prep is None:
        return None, False
    ours = shown.startswith(PREPARING) or shown == "Ready."
    if busy or not ours:
        return None, not prep.done.is_set()
    if not prep.done.is_set():
        i, n = prep.index, len(prep.steps)
        if not 0 <= i < n:
            return f"{PREPARING}starting… A Generate pressed now waits only for what is left.", True
        name, what, _ = prep.steps[i]
        return (f"{PREPARING}{name}, {what} (step {i + 1} of {n}, "
                f"{prep.clock() - prep.started:.0f} s so far). A Generate pressed now waits only for what is "
                "left.", True)
    if prep.error and not loaded:
        return (f"⚠ Preparing at server start: {prep.error}. A Generate tries again and says what went wrong.",
                False)
    return "Ready.", False


def steps_for(cache: BundleCache, preset: ModelPreset, load: bool = True) -> list[Step]:
    """A first Generate's preparation for `preset`, step by step: the conversion (the row kernel builds meanwhile,
    on the other core), the kernel, and with `load` the load (recode and warm-up) and the profile, each through the
    code and the cache a Generate uses."""
    from eagle2.loading import prepare_kernels, resolve_model

    kernel: dict[str, threading.Thread] = {}

    def convert() -> None:
        kernel["thread"] = prepare_kernels()  # a compiler on one core while the conversion dequantises
        resolve_model(preset.model)  # the embedded GGUF converted into the cache once; other models: nothing

    def build() -> None:
        kernel["thread"].join()

    def profile() -> None:
        cache.profile(preset, cache.get(preset))

    steps = [("the model conversion", "the GGUF dequantised into the cache; the row kernel builds meanwhile", convert),
             ("the row kernel build", "compiled once per machine", build)]
    if load:
        steps += [("the model load", "its four-bit weights recoded for the row kernel, each method warmed up once",
                   lambda: cache.get(preset)),
                  ("the machine profile", "the fastest tree size here, measured once per machine", profile)]
    return steps


def start(cache: BundleCache, preset: ModelPreset, load: bool = True) -> Preparation | None:
    """Prepare `preset` in the background through `cache`, which then makes its callers wait for it; None (and
    nothing started) when this machine cannot run the preset. `load=False`: the files only (the conversion and
    the kernel), for a host where the model must load inside a GPU slot."""
    from app_parts.presets import unavailable_reason

    if unavailable_reason(preset):
        return None
    prep = Preparation(steps_for(cache, preset, load))
    cache.preparation = prep
    return prep.start()
