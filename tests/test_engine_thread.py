"""The page's decodes run on one thread whichever thread asks for their next item (app_parts/engine_thread.py)."""
from __future__ import annotations

import contextvars
import threading
import time

import pytest

from app_parts import engine_thread
from app_parts.engine_thread import on_one_thread

WHO = contextvars.ContextVar("who", default=None)


def _asked_from_new_threads(items, count):
    """next(items) `count` times, each from a thread of its own (as a server's worker pool may resume a
    handler), -> the items and the asking threads (objects: an ident is reused once its thread ends)."""
    got, askers = [], []

    def ask():
        askers.append(threading.current_thread())
        got.append(next(items))

    for _ in range(count):
        t = threading.Thread(target=ask)
        t.start()
        t.join()
    return got, askers


def _in_thread(fn, timeout=10):
    """fn() in a daemon thread, waited for at most `timeout` s -> its result; fails (rather than hangs) when it
    is still running then."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "still waiting: a deadlock"
    return out["value"]


def test_every_item_is_made_on_one_thread_that_none_of_the_askers_is():
    def producer():
        for _ in range(6):
            yield threading.current_thread()

    made, askers = _asked_from_new_threads(on_one_thread(producer()), 6)
    assert all(t is made[0] for t in made)
    assert all(made[0] is not a for a in askers) and made[0] is not threading.current_thread()
    assert made[0].name.startswith(engine_thread.NAME)


def test_each_item_sees_the_asking_threads_context():
    def producer():
        while True:
            yield WHO.get()

    items = on_one_thread(producer())
    seen = []
    for name in ("first", "second", "third"):
        ctx = contextvars.copy_context()
        ctx.run(WHO.set, name)
        seen.append(ctx.run(next, items))
    assert seen == ["first", "second", "third"]
    items.close()


def test_closing_early_closes_the_producer_on_the_engine_thread():
    closed, done = {}, threading.Event()

    def producer():
        try:
            while True:
                yield threading.current_thread()
        finally:
            closed["on"] = threading.current_thread()
            done.set()

    items = on_one_thread(producer())
    engine = next(items)
    items.close()
    assert done.wait(5) and closed["on"] is engine


def test_closing_while_a_step_is_on_its_way_does_not_wait_for_the_step():
    """Gradio closes a cancelled handler on its event loop: that must not wait for a load or a step to end."""
    done = threading.Event()

    def slow(progress):
        progress(0.5, "loading")
        time.sleep(1.5)

    def producer():
        try:
            yield "started"
            engine_thread.noting(slow, "waiting")
            yield "loaded"
        finally:
            done.set()

    items = on_one_thread(producer(), waiting=lambda line: f"status: {line}", every_s=0.02)
    assert next(items) == "started"
    assert next(items).startswith("status: ")  # the load is on its way
    began = time.perf_counter()
    items.close()
    assert time.perf_counter() - began < 0.5
    assert not done.is_set()
    assert done.wait(5)  # the producer is closed once its step has ended


def test_a_run_shows_only_its_own_progress_lines():
    def slow(progress):
        for i in range(30):
            progress(0.5, f"run A, line {i}")
            time.sleep(0.02)

    def run_a():
        yield "started"
        engine_thread.noting(slow, "run A begins")
        yield "done"

    a = on_one_thread(run_a(), waiting=lambda line: line, every_s=0.01)
    assert next(a) == "started" and next(a).startswith("run A")
    a.close()  # run A's load goes on; run B waits behind it

    def run_b():
        yield "B"

    seen = list(on_one_thread(run_b(), waiting=lambda line: line, every_s=0.01))
    assert seen == ["B"]


def test_what_the_producer_raises_reaches_the_asker_and_the_end_ends_it():
    def producer():
        yield 1
        raise ValueError("the decoder's own message")

    items = on_one_thread(producer())
    assert next(items) == 1
    with pytest.raises(ValueError, match="the decoder's own message"):
        next(items)
    assert list(on_one_thread(iter([1, 2, 3]))) == [1, 2, 3]


def test_a_decode_inside_a_decode_does_not_wait_on_itself():
    def inner():
        yield threading.current_thread()

    def outer():
        yield threading.current_thread()
        yield from on_one_thread(inner())  # already on the engine thread: runs in place

    made = _in_thread(lambda: list(on_one_thread(outer())))
    assert made[0] is made[1] and made[0].name.startswith(engine_thread.NAME)


def test_a_runs_load_on_the_engine_thread_shows_its_progress_to_the_waiting_caller():
    """runner._in_background: a load or a profile a run needs runs where the run decodes (`noting`)."""
    from app_parts import runner

    def load(say):
        for line in ("converting", "loading"):
            say(0.5, line)
            time.sleep(0.2)
        return threading.current_thread()

    def producer():
        yield "started"
        value = yield from runner._in_background(load, "waiting for the model")
        yield value

    got = _in_thread(lambda: list(on_one_thread(producer(), waiting=lambda line: f"status: {line}",
                                                every_s=0.02)))
    assert got[0] == "started" and got[-1].name.startswith(engine_thread.NAME)
    shown = [g for g in got[1:-1]]
    assert [s for s in shown if s != "status: waiting for the model"] == ["status: converting", "status: loading"]
