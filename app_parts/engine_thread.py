"""One thread for every decode the page runs.

The row kernel and PyTorch's CPU operations run on OpenMP, whose team of worker threads belongs to the thread
that calls them: each new calling thread gets a team of its own, and the team of a thread that has just
stopped keeps its workers spinning for a while. Gradio resumes a streaming handler on whichever of its worker
threads is free, so a Generate that yields (every live step, every status line) went on on another thread
each time, and the spinning workers of the team before took the cores from the new one. The timed pass then
measured that contention as much as the decoders, and not equally: plain decoding, whose steps are the
shortest, lost the most, so the page showed the trees faster against it than `bench` measures them.

`on_one_thread` resumes such a generator on one long-lived thread, always the same, in the context of the
caller (Gradio's progress and request); Gradio's thread only waits for each item and draws it. Runs reach it
one at a time anyway (the page's queue), so nothing waits on another visitor's run for longer than before.
Loading a model and measuring the machine profile run there too (`noting`), so the profile is measured where
the runs it sizes decode; their progress lines reach the page through the waiting caller.
"""
from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Pending
from typing import TypeVar

T = TypeVar("T")

NAME = "eagle2-engine"
_END = object()
_lock = threading.Lock()
_pool: dict[int, ThreadPoolExecutor] = {}  # by process: a forked worker (ZeroGPU) starts its own thread
_said: dict[str, str | None] = {"line": None}  # the newest progress line of work `noting` runs


def _engine() -> ThreadPoolExecutor:
    with _lock:
        pid = os.getpid()
        if pid not in _pool:
            _pool.clear()
            _pool[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=NAME)
        return _pool[pid]


def _there(fn, *args):
    """fn(*args) on the engine thread, in the calling thread's context; its result, or what it raised."""
    return _engine().submit(contextvars.copy_context().run, fn, *args).result()


def here() -> bool:
    """Whether this is the engine thread."""
    return threading.current_thread().name.startswith(NAME)


def noting(work: Callable[[Callable[[float, str], None]], T], first: str) -> T:
    """work(progress) on this thread (the engine thread), its newest progress message, `first` until it says one,
    kept for the caller waiting in `on_one_thread` to show."""
    _said["line"] = first
    try:
        return work(lambda _fraction, message: _said.__setitem__("line", message))
    finally:
        _said["line"] = None


def on_one_thread(items: Iterator[T], waiting: Callable[[str], T] | None = None,
                  every_s: float = 0.25) -> Iterator[T]:
    """`items`, each produced on the engine thread; closing this early closes `items` there too. While one is
    on its way and work there says its progress (`noting`), `waiting(line)` is yielded for each new line (looked
    at every `every_s`). Called on the engine thread itself (a decode inside a decode), it is `items` unchanged."""
    if here():
        yield from items
        return
    try:
        while True:
            pending, shown = _engine().submit(contextvars.copy_context().run, next, items, _END), None
            while True:
                try:
                    item = pending.result(timeout=every_s if waiting is not None else None)
                    break
                except Pending:
                    line = _said["line"]
                    if line is not None and line != shown:
                        shown = line
                        yield waiting(line)
            if item is _END:
                return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            _there(close)
