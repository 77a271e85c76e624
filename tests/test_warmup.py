"""The server's preparation at start (app_parts/warmup.py): a Generate pressed meanwhile waits for it, says which
step it waits for, and uses what it made; a failure is not swallowed."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from app_parts import warmup
from app_parts.presets import BundleCache, ModelPreset, model_info
from app_parts.runner import generate
from app_parts.settings import RunRequest

PRESET = ModelPreset(name="p", model="m")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loads(monkeypatch):
    """The cache's model load and warm-up replaced by fakes that count their calls (the first waits on `gate`)."""
    import app_parts.presets as presets

    calls: list[str] = []
    gate = threading.Event()

    def fake_load(model, head, device, dtype="float32"):
        calls.append(model)
        if model == "broken":
            raise OSError("disk full")
        return SimpleNamespace(model=model, tokenizer=None)

    monkeypatch.setattr(presets, "load", fake_load)
    monkeypatch.setattr(presets, "warm_up", lambda bundle: None)
    return calls, gate


def _prepare(cache: BundleCache, gate: threading.Event, preset: ModelPreset = PRESET,
             clock=None) -> warmup.Preparation:
    """The server's steps, the first a slow conversion that ends when `gate` opens."""
    steps = [("the model conversion", "the GGUF dequantised", lambda: gate.wait(10)),
             ("the model load", "weights recoded", lambda: cache.get(preset))]
    prep = warmup.Preparation(steps, **({"clock": clock} if clock else {}))
    cache.preparation = prep
    return prep.start()


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def test_a_generate_meanwhile_waits_for_the_step_left_and_does_not_load_again(loads, monkeypatch):
    monkeypatch.setattr(warmup, "POLL_S", 0.01)
    calls, gate = loads
    cache, said = BundleCache(), []
    prep = _prepare(cache, gate)
    waiter, out = _in_thread(lambda: cache.get(PRESET, lambda f, m: said.append(m)))
    while not said:
        waiter.join(0.01)
    assert waiter.is_alive() and "value" not in out and calls == []  # waiting, nothing loaded twice meanwhile
    assert said[0].startswith("Waiting for the model conversion (started at server start")
    assert "then the model load" in said[0]
    line, again = warmup.page_status(prep, "Ready.")
    assert line.startswith(warmup.PREPARING + "the model conversion, the GGUF dequantised (step 1 of 2") and again
    gate.set()
    waiter.join(5)
    assert not waiter.is_alive() and prep.done.is_set() and prep.error is None
    assert out["value"] is cache.loaded("p") and calls == ["m"]  # the preparation's bundle, loaded once
    assert warmup.page_status(prep, line) == ("Ready.", False)


def test_the_page_status_names_the_running_step_and_leaves_a_runs_line_alone(loads):
    calls, gate = loads
    clock = Clock()
    cache = BundleCache()
    prep = _prepare(cache, gate, clock=clock)
    while prep.step is None:
        prep.done.wait(0.01)
    clock.now += 12
    line, again = warmup.page_status(prep, "Ready.")
    assert line == (warmup.PREPARING + "the model conversion, the GGUF dequantised (step 1 of 2, 12 s so far). A "
                                       "Generate pressed now waits only for what is left.") and again
    assert prep.waiting_line() == ("Waiting for the model conversion (started at server start, 12 s ago; then the "
                                   "model load); this Generate runs as soon as it is done…")
    assert warmup.page_status(prep, line, busy=True) == (None, True)  # this visitor's Generate owns the line
    assert warmup.page_status(prep, "Live pass…") == (None, True)
    assert model_info(PRESET, cache).endswith("Being prepared at server start.")
    gate.set()
    prep.done.wait(5)
    assert warmup.page_status(prep, "Done. 3 steps.") == (None, False) and calls == ["m"]


def test_a_failed_preparation_is_logged_and_the_generate_retries_and_says_why(loads, caplog):
    calls, gate = loads
    gate.set()
    cache, broken = BundleCache(), ModelPreset(name="b", model="broken")
    prep = _prepare(cache, gate, broken)
    prep.done.wait(5)
    assert prep.error == "the model load failed (RuntimeError: could not load “b”: disk full)"
    assert "preparing at server start failed" in caplog.text  # in the server's log, with its traceback
    line, again = warmup.page_status(prep, warmup.PREPARING + "the model load, weights recoded (step 2 of 2).")
    assert line.startswith("⚠ Preparing at server start: the model load failed") and not again
    assert warmup.page_status(prep, "Ready.", loaded=True) == ("Ready.", False)  # a later Generate loaded it
    with pytest.raises(RuntimeError, match="could not load “b”: disk full"):
        cache.get(broken)  # the Generate's own try
    assert calls == ["broken", "broken"]


def test_generate_shows_the_wait_on_its_status_line(loads, monkeypatch):
    import app_parts.runner as runner

    monkeypatch.setattr(warmup, "POLL_S", 0.01)
    monkeypatch.setattr(runner, "STATUS_EVERY_S", 0.04)
    monkeypatch.setattr(runner, "load_presets", lambda: {"p": PRESET})
    monkeypatch.setattr(runner, "encode_prompt", lambda tok, text: [1, 2, 3])

    class Refused:
        def check_prompt(self, ids, cfg):
            raise ValueError("the end of the test")

    monkeypatch.setattr(runner, "decoder_for", lambda bundle: Refused())
    calls, gate = loads
    cache = BundleCache()
    _prepare(cache, gate)
    statuses = []
    for u in generate(RunRequest(prompt="Hi", preset="p", sizing="custom"), cache.get):
        statuses.append(u.status)
        if u.status.startswith("Waiting for"):
            gate.set()
    assert any(s.startswith("Waiting for the model conversion (started at server start") for s in statuses)
    assert statuses[-1] == "⚠ the end of the test" and calls == ["m"]


def test_the_server_prepares_what_a_first_generate_would_in_that_order(monkeypatch):
    import eagle2.loading as loading

    done: list[str] = []

    class Kernel:
        def join(self) -> None:
            done.append("kernel")

    class Cache:
        preparation = None

        def get(self, preset):
            done.append("load")
            return "bundle"

        def profile(self, preset, bundle):
            done.append(f"profile of {bundle}")

    monkeypatch.setattr(loading, "prepare_kernels", lambda: done.append("kernel started") or Kernel())
    monkeypatch.setattr(loading, "resolve_model", lambda model: done.append(f"convert {model}"))
    for load, want in ((True, ["kernel started", "convert m", "kernel", "load", "load", "profile of bundle"]),
                       (False, ["kernel started", "convert m", "kernel"])):
        done.clear()
        cache = Cache()
        prep = warmup.start(cache, PRESET, load=load)
        assert cache.preparation is prep and prep.done.wait(5) and prep.error is None
        assert done == want and len(prep.steps) == (4 if load else 2)
