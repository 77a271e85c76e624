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
A load or a machine profile that a run itself needs (a first Generate, a profile measured again) runs there too
(`noting`), so it is measured where the runs it sizes decode, and its progress lines reach that run's caller
(only that run's: each run has its own line). What the server prepares at start runs before any run, on its
own thread (app_parts/warmup.py). A run closed early (Stop taken out of the queue, a visitor gone) is closed
on the engine thread after the step in flight, without keeping the closing thread waiting for it.
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
_pool: list[ThreadPoolExecutor] = []  # the engine thread's executor once started (a forked child starts its own)
_LINE: contextvars.ContextVar[list[str | None] | None] = contextvars.ContextVar("eagle2_engine_line",
                                                                              default=None)


def _after_fork() -> None:  # a child (a ZeroGPU worker) starts with no engine thread and a lock nobody holds
    global _lock
    _lock = threading.Lock()
    _pool.clear()


os.register_at_fork(after_in_child=_after_fork)


def _engine() -> ThreadPoolExecutor:
    with _lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix=NAME))
        return _pool[0]


def here() -> bool:
    """Whether this is the engine thread."""
    return threading.current_thread().name.startswith(NAME)


def noting(work: Callable[[Callable[[float, str], None]], T], first: str) -> T:
    """work(progress) on this thread (the engine thread), its newest progress message, `first` until it says one,
    kept for the caller waiting in `on_one_thread` for this run to show."""
    line = _LINE.get()
    if line is None:  # not inside `on_one_thread`: nobody to show it to
        return work(lambda _fraction, _message: None)
    line[0] = first
    try:
        return work(lambda _fraction, message: line.__setitem__(0, message))
    finally:
        line[0] = None


def _next_with(line: list[str | None], items: Iterator[T]):
    _LINE.set(line)  # in this resumption's own context copy
    return next(items, _END)


def on_one_thread(items: Iterator[T], waiting: Callable[[str], T] | None = None,
                  every_s: float = 0.25) -> Iterator[T]:
    """`items`, each produced on the engine thread; closing this early closes `items` there (after the step in
    flight, without waiting for it). While one is on its way and work there says its progress (`noting`),
    `waiting(line)` is yielded for each new line (looked at every `every_s`). Called on the engine thread itself
    (a decode inside a decode), it is `items` unchanged."""
    if here():
        yield from items
        return
    line: list[str | None] = [None]  # this run's progress line, apart from any other run's
    try:
        while True:
            pending = _engine().submit(contextvars.copy_context().run, _next_with, line, items)
            shown = None
            while True:
                try:
                    item = pending.result(timeout=every_s if waiting is not None else None)
                    break
                except Pending:
                    if line[0] is not None and line[0] != shown:
                        shown = line[0]
                        yield waiting(shown)
            if item is _END:
                return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            if here():  # finalised on the engine thread itself: close in place, never wait on our own queue
                close()
            else:
                _engine().submit(close)
