"""The page's decodes run on one thread whichever thread asks for their next item (app_parts/engine_thread.py)."""
from __future__ import annotations

import contextvars
import threading

import pytest

from app_parts.engine_thread import on_one_thread

WHO = contextvars.ContextVar("who", default=None)


def _asked_from_new_threads(items, count):
    """next(items) `count` times, each from a thread of its own (as a server's worker pool may resume a
    handler), -> the items and the idents of the asking threads."""
    got, askers = [], []

    def ask():
        askers.append(threading.get_ident())
        got.append(next(items))

    for _ in range(count):
        t = threading.Thread(target=ask)
        t.start()
        t.join()
    return got, askers


def test_every_item_is_made_on_one_thread_that_none_of_the_askers_is():
    def producer():
        for _ in range(6):
            yield threading.get_ident()

    made, askers = _asked_from_new_threads(on_one_thread(producer()), 6)
    assert len(set(made)) == 1
    assert made[0] not in askers and made[0] != threading.get_ident()


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
    closed = {}

    def producer():
        try:
            while True:
                yield threading.get_ident()
        finally:
            closed["on"] = threading.get_ident()

    items = on_one_thread(producer())
    engine = next(items)
    items.close()
    assert closed["on"] == engine


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
        yield threading.get_ident()

    def outer():
        yield threading.get_ident()
        yield from on_one_thread(inner())  # already on the engine thread: runs in place

    done = {}
    t = threading.Thread(target=lambda: done.setdefault("items", list(on_one_thread(outer()))))
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "nested use deadlocked"
    assert len(set(done["items"])) == 1


def test_work_the_engine_thread_does_in_place_shows_its_progress_to_the_waiting_caller():
    """Loading and the machine profile run on the engine thread (`noting`), where the decodes they prepare run;
    their progress lines reach the caller waiting for the next item."""
    import time

    from app_parts import engine_thread

    def slow(progress):
        for line in ("converting", "loading"):
            progress(0.5, line)
            time.sleep(0.2)
        return threading.current_thread().name

    def producer():
        yield "started"
        yield engine_thread.noting(slow, "waiting for the model")

    got = list(on_one_thread(producer(), waiting=lambda line: f"status: {line}", every_s=0.02))
    assert got[0] == "started" and got[-1].startswith(engine_thread.NAME)
    shown = [g for g in got if g.startswith("status: ")]
    assert [s for s in shown if s != "status: waiting for the model"] == ["status: converting", "status: loading"]
    assert engine_thread._said["line"] is None  # nothing left over for the next run to show
